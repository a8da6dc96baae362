"""PostgreSQL's enqueue: one row as one INSERT, a bulk enqueue by COPY.

One row (a request enqueues one task) is one round trip, with the NOTIFY
PostgreSQL delivers at commit in the same statement. Where the enqueue's cursor
keeps its statements prepared in the session (``preparing.py``), it is a plain
INSERT, planned once per session. Where it cannot (behind a pooler, or while
queries are logged), it is a call of ``rdbtasks_enqueue_v2`` (migration 0017),
whose INSERT PL/pgSQL plans once per session instead. The prepared INSERT costs
the server about a tenth less than the prepared call (the backend's own CPU,
96.5 against 106.9 µs a task: PL/pgSQL sets its expressions up again in every
transaction).

A bulk enqueue's rows (``NewBatch``: one task, its arguments per row) go in
with ``COPY ... FROM STDIN`` in the text format, which costs the server about
a fifth less per row than an INSERT of the same rows from a JSON array (no
array to take apart, rows written a page at a time; measured in
bench/enqueue_profile.py) and the client next to nothing: the values every
row shares are written out once, and each row is its id and its arguments'
JSON text joined to them. The server reads the data as it arrives.
``enqueued_at`` and ``run_after`` are left to the columns' database default,
``STATEMENT_TIMESTAMP()`` (the COPY's, the same for every row), and read back
with the NOTIFY in one statement after the COPY. Under psycopg 2, whose
cursor has no ``copy()``, and for ``NewTask`` rows, one INSERT takes the
whole batch as one JSON array.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from ...states import TaskStatus
from ..cursors import copy_in, driver_cursor
from ..inserts import TaskInserts
from ..rows import INSERT_COLUMNS, NewBatch, NewTask
from .channels import NOTIFY_CHANNEL, READY_CHANNEL, ready_payload
from .preparing import prepares, preparing_cursor_class

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: The function one enqueue calls (created by migration 0017; a change to it is
#: a new version in a new migration, never an edit of an old one: ``v1`` of
#: migration 0005 notified the old channel, and stays for the previous
#: release's web processes).
ENQUEUE_FUNCTION = "rdbtasks_enqueue_v2"
ENQUEUE_SIGNATURE = (
    f"{ENQUEUE_FUNCTION}(uuid, text, text, text, integer, jsonb, jsonb, integer, "
    "timestamptz, text, text, text, integer, text, jsonb, boolean)"
)

#: A batch's columns, the ones that differ per row first: the rest of a row
#: is the same text for the whole batch. ``enqueued_at`` and ``run_after``
#: take their default, the COPY's clock; a deferred batch writes ``run_after``.
_COPY_ROW = ("id", "args", "kwargs")
_COPY_SHARED = (
    "task_path",
    "queue_name",
    "backend_name",
    "priority",
    "max_attempts",
    "status",
    "version",
    "worker_id",
    "attempts",
    "history",
    "job_name",
    "waiting_on",
    "on_parent_failure",
    "trace_context",
)
_COPY_DEFERRED = ("run_after", "requested_run_after")
#: Rows a block of COPY data: sent as soon as it is made, so that the server
#: starts on the first rows while the next are made.
_COPY_BLOCK = 250
#: ``COPY``'s text format: a backslash, tab, newline or carriage return in a
#: value is written escaped.
_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(value: Any) -> str:
    """One value in ``COPY``'s text format (None is NULL)."""
    if value is None:
        return "\\N"
    if isinstance(value, dt.datetime):
        value = value.isoformat()
    return str(value).translate(_COPY_ESCAPES)


def _copy_blocks(batch: NewBatch, rest: str) -> Iterator[str]:
    """The batch's rows in COPY's text format, ``_COPY_BLOCK`` rows a block.

    The arguments are JSON text from arguments.py, which holds no tab,
    newline or carriage return (JSON escapes them inside strings, and the
    encoder indents nothing): a backslash is the one character COPY needs
    escaped in them.
    """
    one, two = "\\", "\\\\"
    rows = zip(batch.ids, batch.args_json, batch.kwargs_json, strict=True)
    while block := list(itertools.islice(rows, _COPY_BLOCK)):
        yield "".join(
            [
                f"{row_id}\t{args if one not in args else args.replace(one, two)}\t"
                f"{kwargs if one not in kwargs else kwargs.replace(one, two)}{rest}"
                for row_id, args, kwargs in block
            ]
        )


class PostgreSQLInserts(TaskInserts):
    """The enqueue's statements and cursor, held by ``PostgreSQLDialect``."""

    insert_is_one_statement = True

    # Every parameter cast: bound on the server (new_cursor), a Python int
    # arrives as the smallest integer type that holds it.
    enqueue_call_sql = (
        f"SELECT {ENQUEUE_FUNCTION}(%s::uuid, %s::text, %s::text, %s::text, %s::integer, "
        "%s::jsonb, %s::jsonb, %s::integer, %s::timestamptz, %s::text, %s::text, "
        "%s::text, %s::integer, %s::text, %s::jsonb, %s::boolean)"
    )

    @functools.cached_property
    def insert_sql(self) -> str:
        """Many ``NewTask`` rows in one statement: one JSON array of rows in, the clock out.

        One JSON text is encoded in C; fifteen arrays cost the driver more
        than the insert costs the server.
        """
        now = self.d.now_sql
        return (
            f"WITH n AS (SELECT {now} AS now), inserted AS ("
            f"INSERT INTO {self.d.insert_table} ({', '.join(INSERT_COLUMNS)}) "
            "SELECT (v->>0)::uuid, v->>1, v->>2, v->>3, (v->>4)::int, (v->>5)::jsonb, "
            "(v->>6)::jsonb, (v->>7)::int, COALESCE((v->>8)::timestamptz, n.now), n.now, "
            "v->>9, 0, '', 0, '[]'::jsonb, v->>10, v->>11, (v->>12)::int, v->>13, "
            "(v->>8)::timestamptz, (v->>14)::jsonb "
            "FROM jsonb_array_elements(%s::jsonb) AS r(v), n), "
            # NOTIFY in the same statement: an enqueue outside a transaction
            # is one round trip. PostgreSQL delivers it at commit.
            f"notified AS (SELECT pg_notify('{READY_CHANNEL}', {ready_payload('x.q', 'x.p')}) "
            "FROM unnest(%s::text[], %s::int[]) AS x(q, p)) "
            "SELECT n.now, (SELECT count(*) FROM notified) FROM n"
        )

    @functools.cached_property
    def insert_one_sql(self) -> dict[bool, str]:
        """One row as a plain INSERT, by ``notify``; its clock back as the function returns it."""
        now = self.d.now_sql
        one_row = (
            f"INSERT INTO {self.d.insert_table} ({', '.join(INSERT_COLUMNS)}) "
            "VALUES (%s::uuid, %s, %s, "
            f"%s, %s, %s::jsonb, %s::jsonb, %s, COALESCE(%s::timestamptz, {now}), {now}, %s, "
            "0, '', 0, '[]'::jsonb, %s, %s, %s, %s, %s::timestamptz, %s::jsonb) "
            # Microseconds since the epoch, as the enqueue function returns them.
            "RETURNING (extract(epoch FROM enqueued_at) * 1000000)::bigint"
        )
        return {
            False: one_row,
            # Delivered by PostgreSQL at commit, still in the one round trip.
            True: f"{one_row}, "
            f"pg_notify('{READY_CHANNEL}', {ready_payload('queue_name', 'priority')})::text",
        }

    @functools.cached_property
    def copied_sql(self) -> dict[bool, str]:
        """After a batch's COPY: its clock, read off its first row; by ``notify``, the NOTIFY."""
        read = f"SELECT enqueued_at FROM {self.d.table} WHERE id = %s::uuid"
        return {
            False: read,
            True: read.replace(
                " FROM ",
                f", pg_notify('{READY_CHANNEL}', {ready_payload('queue_name', 'priority')})"
                "::text FROM ",
                1,
            ),
        }

    @functools.cached_property
    def _has_enqueue_function(self) -> dict[tuple, bool]:
        #: Whether the enqueue function exists, per database (settings NAME,
        #: HOST, PORT): looked up once per process, since a test run switches
        #: an alias to its test database, made with or without migrations.
        return {}

    def insert_tasks(
        self, cursor: Any, tasks: Sequence[NewTask], notify: bool = False
    ) -> dt.datetime:
        if len(tasks) == 1:
            t = tasks[0]
            params = [
                t.id,
                t.task_path,
                t.queue_name,
                t.backend_name,
                t.priority,
                t.args_json,
                t.kwargs_json,
                t.max_attempts,
                t.run_after,
                t.status,
                t.job_name,
                t.dedup_key,
                t.waiting_on,
                t.on_parent_failure,
            ]
            # A pinned clock (testing) is in the INSERT's text, not the function's.
            if self.d.clock_pinned or prepares(cursor) or not self.enqueue_function_exists(cursor):
                cursor.execute(self.insert_one_sql[notify], [*params, t.run_after, t.trace_context])
            else:
                cursor.execute(self.enqueue_call_sql, [*params, t.trace_context, notify])
            # From the driver's cursor: its rows are in memory once the
            # statement has run, so there is no error of the database's to
            # translate, and Django's wrapper makes a new function per call.
            row = driver_cursor(cursor).fetchone()
            return _EPOCH + dt.timedelta(microseconds=row[0])
        pairs = sorted({(t.queue_name, t.priority) for t in tasks}) if notify else []
        cursor.execute(
            self.insert_sql,
            [self._batch_json(tasks), [q for q, _ in pairs], [p for _, p in pairs]],
        )
        return cursor.fetchone()[0]

    def insert_batch(
        self,
        cursor: Any,
        batch: NewBatch,
        notify: bool = False,
        meanwhile: Callable[[], object] | None = None,
    ) -> dt.datetime:
        """COPY the batch's rows in, in the caller's transaction; their enqueue time back.

        ``meanwhile`` runs while the server writes the rows, once they are sent.
        """
        # psycopg 2 cannot COPY; a pinned clock (testing) must be written, not defaulted.
        if getattr(cursor, "copy", None) is None or self.d.clock_pinned:  # one JSON INSERT
            if meanwhile is not None:
                meanwhile()
            return self.insert_tasks(cursor, batch.rows(), notify)
        columns = [*_COPY_ROW, *_COPY_SHARED]
        shared = [
            batch.task_path,
            batch.queue_name,
            batch.backend_name,
            batch.priority,
            batch.max_attempts,
            TaskStatus.READY.value,
            0,
            "",
            0,
            "[]",
            "",
            0,
            TaskStatus.CANCELLED.value,
            batch.trace_context,
        ]
        if batch.run_after is not None:
            columns += _COPY_DEFERRED
            shared += [batch.run_after, batch.run_after]
        rest = "\t" + "\t".join(_copy_text(value) for value in shared) + "\n"
        copy_in(
            cursor,
            f"COPY {self.d.insert_table} ({', '.join(columns)}) FROM STDIN",
            _copy_blocks(batch, rest),
            meanwhile,
        )
        cursor.execute(self.copied_sql[notify], [batch.ids[0]])
        return cursor.fetchone()[0]

    def new_cursor(self, connection: Any, *, prepare: bool = False) -> Any:
        # Parameters bound by the server: psycopg sends them beside the
        # statement rather than quoting each into its text, a quarter less
        # client CPU per enqueue. Prepared only by this cursor, and only
        # where the session is the server's own (see preparing.py).
        try:
            from django.db.backends.postgresql.base import ServerBindingCursor
            from django.db.backends.postgresql.psycopg_any import register_tzloader
        except ImportError:  # psycopg2
            return connection.create_cursor()
        cls = preparing_cursor_class() if prepare else ServerBindingCursor
        # Of the statements run on it, only the single enqueue's INSERT is
        # prepared (the function's call is made only where nothing is).
        options = {"preparable": list(self.insert_one_sql.values())}
        cursor = cls(connection.connection, **(options if prepare else {}))
        # As on Django's own cursors: datetimes in the connection's time zone.
        register_tzloader(connection.timezone, cursor)
        return cursor

    def notify(self, cursor: Any, queue_names: Iterable[str]) -> None:
        # Sent by PostgreSQL at commit, and not at all on rollback.
        for queue_name in sorted(set(queue_names)):
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, queue_name])

    def notify_ready(self, cursor: Any, pairs: Iterable[tuple[str, int]]) -> None:
        pairs = sorted(set(pairs))
        if pairs:
            cursor.execute(
                f"SELECT pg_notify('{READY_CHANNEL}', {ready_payload('x.q', 'x.p')}) "
                "FROM unnest(%s::text[], %s::int[]) AS x(q, p)",
                [[q for q, _ in pairs], [p for _, p in pairs]],
            )

    def enqueue_function_exists(self, cursor: Any) -> bool:
        settings = self.d.connection.settings_dict
        key = (settings["NAME"], settings["HOST"], settings["PORT"])
        exists = self._has_enqueue_function.get(key)
        if exists is None:
            cursor.execute("SELECT to_regprocedure(%s) IS NOT NULL", [ENQUEUE_SIGNATURE])
            exists = self._has_enqueue_function[key] = bool(cursor.fetchone()[0])
        return exists

    @staticmethod
    def _batch_json(tasks: Sequence[NewTask]) -> str:
        """The rows for insert_sql, each a JSON array in the order it reads them."""
        return json.dumps(
            [
                [
                    str(t.id),
                    t.task_path,
                    t.queue_name,
                    t.backend_name,
                    t.priority,
                    t.args_json,
                    t.kwargs_json,
                    t.max_attempts,
                    None if t.run_after is None else t.run_after.isoformat(),
                    t.status,
                    t.job_name,
                    t.dedup_key,
                    t.waiting_on,
                    t.on_parent_failure,
                    t.trace_context,
                ]
                for t in tasks
            ]
        )
