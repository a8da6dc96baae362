"""The enqueue's INSERT in portable SQL: new READY rows, one by one or a bulk enqueue's batch.

Written with plain statements rather than ``bulk_create``: preparing every
value of every row through the ORM costs more than the insert. The driver
sends a batch as few statements as it can: mysqlclient's ``executemany``
rewrites it into multi-row INSERTs up to ``max_allowed_packet``, SQLite's
steps one prepared statement. PostgreSQL replaces both (``postgresql/inserts.py``).

A dialect holds its database's inserts (``Dialect.inserts``), made with the
spelling they build their statements from.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .rows import INSERT_COLUMNS, NewBatch, NewTask
from .spelling import Spelling

#: Where a row's values vary within a batch (``insert_values``'s order): the
#: id first, the arguments side by side.
_ARGS = INSERT_COLUMNS.index("args")
assert INSERT_COLUMNS[0] == "id" and INSERT_COLUMNS[_ARGS + 1] == "kwargs"


class TaskInserts:
    """The portable enqueue (MySQL/MariaDB, SQLite), held by the dialect (``Dialect.inserts``)."""

    #: Whether insert_tasks is a single statement, atomic without a transaction.
    insert_is_one_statement = False

    def __init__(self, spelling: Spelling) -> None:
        #: How the database spells the statements: its tables, its clock.
        self.d = spelling

    def notify(self, cursor: Any, queue_names: Iterable[str]) -> None:
        """Wake idle workers of these queues once the transaction commits (here
        nothing: the workers of these databases poll)."""

    def notify_ready(self, cursor: Any, pairs: Iterable[tuple[str, int]]) -> None:
        """The same for rows this transaction made READY, by (queue, priority),
        each with a ``run_after`` at or after the transaction's start: where
        workers read from a frontier (PostgreSQL, db/frontier.py), they lower it
        to that start instead of reading from the head."""
        self.notify(cursor, {queue for queue, _ in pairs})

    def new_cursor(self, connection: Any, *, prepare: bool = False) -> Any:
        """A driver cursor for the enqueue's statements, kept for the connection's life.

        ``prepare``: it may keep its statements prepared in the session, where
        the database and its driver can.
        """
        return connection.create_cursor()

    def insert_values(self, task: NewTask, now: Any) -> tuple:
        """The row's values in ``INSERT_COLUMNS`` order; ``now`` is the database clock."""
        requested = (
            None
            if task.run_after is None
            else self.d.connection.ops.adapt_datetimefield_value(task.run_after)
        )
        run_after = now if requested is None else requested
        return (
            self.d.encode_id(task.id),
            task.task_path,
            task.queue_name,
            task.backend_name,
            task.priority,
            task.args_json,
            task.kwargs_json,
            task.max_attempts,
            run_after,
            now,
            task.status,
            0,
            "",
            0,
            "[]",
            task.job_name,
            task.dedup_key,
            task.waiting_on,
            task.on_parent_failure,
            requested,
            task.trace_context,
        )

    def insert_tasks(
        self, cursor: Any, tasks: Sequence[NewTask], notify: bool = False
    ) -> dt.datetime:
        """Insert new READY rows, wake workers on commit if ``notify``.

        Returns the database time the rows were enqueued at.
        """
        now = self.d.current_time(cursor)
        self._insert_rows(cursor, [self.insert_values(task, now) for task in tasks])
        if notify:
            self.notify(cursor, {task.queue_name for task in tasks})
        return self.d.decode_dt(now)  # type: ignore[return-value]

    def insert_batch(
        self,
        cursor: Any,
        batch: NewBatch,
        notify: bool = False,
        meanwhile: Callable[[], object] | None = None,
    ) -> dt.datetime:
        """Insert a bulk enqueue's rows, in the caller's transaction; as ``insert_tasks``.

        The rows' values are the first row's but for the id and the arguments.
        ``meanwhile`` runs while the database writes the rows where it can
        (PostgreSQL), here before.
        """
        if meanwhile is not None:
            meanwhile()
        now = self.d.current_time(cursor)
        encode = self.d.encode_id
        self.insert_batch_rows(
            cursor,
            self.insert_values(batch.row(0), now),
            [
                (encode(uuid.UUID(row_id)), args_json, kwargs_json)
                for row_id, args_json, kwargs_json in zip(
                    batch.ids, batch.args_json, batch.kwargs_json, strict=True
                )
            ],
        )
        if notify:
            self.notify(cursor, [batch.queue_name])
        return self.d.decode_dt(now)  # type: ignore[return-value]

    def insert_batch_rows(self, cursor: Any, first: tuple, varying: list[tuple]) -> None:
        """Rows that are ``first`` (``insert_values``) but for their id and arguments."""
        head, tail = first[1:_ARGS], first[_ARGS + 2 :]
        self._insert_rows(
            cursor, [(row_id, *head, args, kwargs, *tail) for row_id, args, kwargs in varying]
        )

    def _insert_rows(self, cursor: Any, rows: list[tuple]) -> None:
        marks = ", ".join(["%s"] * len(INSERT_COLUMNS))
        cursor.executemany(
            f"INSERT INTO {self.d.insert_table} ({', '.join(INSERT_COLUMNS)}) VALUES ({marks})",
            rows,
        )
