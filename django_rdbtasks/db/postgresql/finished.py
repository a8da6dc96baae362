"""PostgreSQL: finished tasks in a table of their own, which inherits the task table.

Why. A row PostgreSQL inserts, or the new version of a row an UPDATE moves,
goes to a page the free-space map says has room. In a table that also holds
a million finished rows, that is an old page, a different one for each new
task (the space its own dead versions left, once vacuumed, renews itself), and
the first write to a page after a checkpoint logs the whole page: 14 times
the full-page images of an empty table per drained task, 200 to 400 times per
single enqueue (docs/benchmarks.md, docs/design/finished-rows.md). With the
finished rows elsewhere, the task table holds only the tasks still to run,
and its free space is used up once instead of renewing.

How. ``django_rdbtasks_finishedtask`` is made with ``INHERITS`` (migration
0015): the same columns, and every read of the task table (the ORM's, the
admin's, ``get_result``'s, retention's) reads it too, in the same snapshot.
So no reader changes, and a row is in exactly one of the two tables at any
moment a statement can see. Its ``CHECK`` holds only finished statuses: a
statement that would make a row there unfinished fails loudly instead of
leaving a READY row no claim reads. The worker's own statements name
``ONLY`` the task table (``PostgreSQLDialect.table``): the claim, renewals
and fencing never read the finished rows.

The worker moves a row as it finishes it: the round's outcome CTE deletes it
from the task table, fenced exactly as the UPDATE was, and inserts what it
returned, with the outcome written, into this table, in the same statement
(round.py). Requeue moves it back (``move_back_sql``). Rows finished
elsewhere (a cancel before the start, a dependant ended by its parent's
failure, rows older than the migration) stay where they are: readers see
them either way, retention prunes both, and the scheduler moves the
SUCCESSFUL ones (``move_finished_sql``, finished_rows.py).

MySQL, MariaDB and SQLite have one table: InnoDB keeps rows in primary-key
order, and a new UUIDv7 row goes to the right edge of the table whatever it
holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: The table of finished tasks (PostgreSQL only).
FINISHED_TABLE = "django_rdbtasks_finishedtask"


def moved_columns(cursor: Any, task_table: str) -> dict[str, str] | None:
    """The columns a moved row is copied by, with their types; None where the table
    of finished rows is missing (a worker may start before ``migrate``).

    Every column of the task table but the generated ones (the table computes
    them again), as the database has them now, not as the model does: during a
    rolling deploy a worker of the release before copies a column that a
    newer migration added, instead of dropping its value.
    """
    cursor.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = to_regclass(%s) AND to_regclass(%s) IS NOT NULL AND attnum > 0 "
        "AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
        [task_table, FINISHED_TABLE],
    )
    return dict(cursor.fetchall()) or None


class FinishedRows:
    """Whether a dialect's rounds move finished rows, and by which columns: asked of
    the database once (``moved_columns``), then known until forgotten."""

    def __init__(self, task_table: str) -> None:
        self.task_table = task_table
        #: Whether the table of finished rows is there; None: not asked yet.
        self.present: bool | None = None
        #: The columns a moved row is copied by, with their types, as asked.
        self.columns: dict[str, str] = {}

    def moves(self, cursor: Any) -> bool:
        """Whether finished rows move to their own table (asked once, then known)."""
        if self.present is None:
            self.columns = moved_columns(cursor, self.task_table) or {}
            self.present = bool(self.columns)
        return self.present

    def forget(self) -> None:
        """Ask again at the next round (a migration may have made or dropped the table)."""
        self.present = None


def _quoted(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'


def returning_written(columns: Mapping[str, str], assignments: Sequence[tuple[str, str]]) -> str:
    """The RETURNING list of a DELETE that stands for an UPDATE: every column,
    with ``assignments`` (column, SQL over ``t``) written, named as the column.
    A written value is cast to its column's type: a NULL would be text."""
    written = dict(assignments)
    return ", ".join(
        f"({written[column]})::{kind} AS {_quoted(column)}"
        if column in written
        else f"t.{_quoted(column)}"
        for column, kind in columns.items()
    )


def insert_moved(cte: str, columns: Iterable[str]) -> str:
    """An INSERT of what ``cte`` (a DELETE ... RETURNING every column) took."""
    listed = ", ".join(map(_quoted, columns))
    return f"INSERT INTO {FINISHED_TABLE} ({listed}) SELECT {listed} FROM {cte}"


def move_back_sql(task_table: str, columns: Iterable[str], ids: str) -> str:
    """Move the finished rows of ``ids`` (a subquery) back to the task table.

    Only FAILED and CANCELLED rows are ever requeued; the statement moves
    whatever of ``ids`` is here, and the caller's UPDATE then decides. A row
    another transaction is moving at the same time is waited for, then found
    gone: the one that moved it decides.
    """
    listed = ", ".join(map(_quoted, columns))
    return (
        f"WITH moved AS (DELETE FROM ONLY {FINISHED_TABLE} WHERE id IN ({ids}) "
        f"RETURNING {listed}) INSERT INTO {task_table} ({listed}) SELECT {listed} FROM moved"
    )


def move_finished_sql(task_table: str, columns: Iterable[str], statuses: Iterable[str]) -> str:
    """Move at most ``%s`` rows finished in the task table, oldest first, to this table.

    They are read off the task table's ``finished_at`` index, locked and
    skipped if anyone holds them (a requeue, a worker's flag of a parent), so
    the statement never waits; the INSERT's row count is how many moved.
    """
    listed = ", ".join(map(_quoted, columns))
    finished = ", ".join(f"'{status}'" for status in statuses)
    return (
        f"WITH batch AS (SELECT id FROM ONLY {task_table} WHERE finished_at IS NOT NULL "
        f"AND status IN ({finished}) ORDER BY finished_at LIMIT %s FOR UPDATE SKIP LOCKED), "
        f"moved AS (DELETE FROM ONLY {task_table} WHERE id IN (SELECT id FROM batch) "
        f"RETURNING {listed}) "
        f"INSERT INTO {FINISHED_TABLE} ({listed}) SELECT {listed} FROM moved"
    )


def estimated_rows(cursor: Any, task_table: str) -> float | None:
    """The planner's estimate of the task table's rows, this table's included; None
    where the task table was never analyzed (-1, PostgreSQL 14+): count then."""
    cursor.execute(
        "SELECT CASE WHEN bool_or(oid = to_regclass(%s) AND reltuples >= 0) "
        "THEN sum(greatest(reltuples, 0)) END FROM pg_class "
        "WHERE oid IN (to_regclass(%s), to_regclass(%s))",
        [task_table, task_table, FINISHED_TABLE],
    )
    row = cursor.fetchone()
    return None if row is None or row[0] is None else float(row[0])
