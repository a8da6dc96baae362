"""Rows finished in the task table, moved to the finished rows' table (PostgreSQL).

A worker moves a task's row as it finishes it (db/postgresql/finished.py). Rows
finished otherwise stay in the task table: those finished before migration
0015, or by a worker started before it, tasks cancelled before they started,
dependants ended by a parent's failure. Readers find them either way, but
while they stay their pages keep the task table's free space scattered, and
new tasks land there one page each (docs/claim-protocol.md, "Finished rows in
a table of their own"). The scheduler moves them, oldest first, a bounded
number each time retention is due (``worker/scheduler.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections, router, transaction

from .db.postgresql.finished import move_finished_sql, moved_columns
from .locks import LeasedLock
from .models import Task
from .states import TaskStatus

#: Rows a statement moves: a short transaction, and one index range.
BATCH_SIZE = 1000
#: Statements a call makes, at most: 10,000 rows a minute from the scheduler.
MAX_BATCHES = 10


@dataclass
class Moved:
    rows: int = 0
    #: Whether it stopped with rows left to move.
    more: bool = False


def move_by_schedule(using: str) -> Moved | None:
    """One scheduler's turn: at most ``MAX_BATCHES`` batches, by one scheduler of the
    cluster at a time (None: another holds the turn)."""
    lock = LeasedLock("rdbtasks:move-finished", lease=60.0, using=using)
    if not lock.acquire():
        return None
    try:
        return move_finished_rows(using)
    finally:
        lock.release()


def move_finished_rows(
    using: str | None = None, *, batch_size: int = BATCH_SIZE, max_batches: int = MAX_BATCHES
) -> Moved:
    """Move SUCCESSFUL rows left in the task table to the finished rows' table
    (PostgreSQL only), oldest first."""
    using = using or router.db_for_write(Task)
    connection = connections[using]
    moved = Moved()
    if connection.vendor != "postgresql":
        return moved
    with connection.cursor() as cursor:
        columns = moved_columns(cursor, Task._meta.db_table)
    if columns is None:
        return moved
    # SUCCESSFUL rows only: the FAILED and CANCELLED ones are those a requeue
    # or a discard may be about to change, and a statement that waited for a
    # row this moved would find nothing (docs/claim-protocol.md). They are few.
    sql = move_finished_sql(
        connection.ops.quote_name(Task._meta.db_table), columns, [TaskStatus.SUCCESSFUL.value]
    )
    for _ in range(max_batches):
        with transaction.atomic(using=using), connection.cursor() as cursor:
            cursor.execute(sql, [batch_size])
            count = cursor.rowcount
        moved.rows += count
        moved.more = count == batch_size
        if not moved.more:
            break
    return moved
