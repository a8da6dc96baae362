"""PostgreSQL with psycopg 3: the cursor the worker's own statements run on.

A worker round hands a hundred rows of twenty columns each way. Through
Django's cursor most of the worker's time per task went to the driver, not to
the task: every parameter quoted into the statement's text on the client,
every ``timestamptz`` parsed from text by Django's pure-Python loader (it
exists to apply a connection's time zone, so psycopg's C loader is not used),
and each ``uuid`` made into a ``uuid.UUID`` only to be turned back into text.
This cursor, kept for the life of the worker's connection:

- binds parameters on the server (sent beside the statement, not quoted into
  it) and asks for results in binary, which psycopg's C loaders decode;
- reads ``timestamptz`` with psycopg's own C loaders (aware datetimes in the
  session's time zone, which Django sets to the connection's);
- reads ``uuid`` as its canonical text: what the worker passes on, logs,
  and shows as the task id;
- reads ``jsonb`` as its text, as Django's cursors do, so the rows decode the
  same whichever cursor read them.

It is wrapped as Django wraps any cursor (errors translated, execute wrappers,
queries logged under DEBUG), whose ``close`` leaves it open. Nothing is
prepared, so it behaves the same behind a transaction pooler. Preparing the
round's statement saves nothing: the server still plans it for its
parameters' values at every run (``plans`` = ``calls`` in pg_stat_statements),
because its generic plan looks far costlier (a LIMIT given as a parameter is
costed as a tenth of the index, an array of unknown length as ten elements).
Planning is a real share of the round (2.5 ms of a 100-task round, a fifth of
the server's time per task, on 2026-11-27), but a generic plan is made once
for the table's size at that moment and kept until the next ANALYZE or
VACUUM: one made on a near-empty table reads it whole (a hash join, a sort)
once a backlog arrives. So rounds stay planned each time until their plan
cannot depend on the table's size.
"""

from __future__ import annotations

import functools
from typing import Any
from weakref import WeakKeyDictionary

#: Per Django connection: the driver connection its cursor belongs to, and the cursor.
_kept: WeakKeyDictionary[Any, tuple[Any, Any]] = WeakKeyDictionary()


def worker_cursor(connection: Any) -> Any:
    """The worker's cursor on ``connection`` (a Django connection), made once per session."""
    connection.ensure_connection()
    driver_connection = connection.connection
    kept = _kept.get(connection)
    if kept is None or kept[0] is not driver_connection:
        with connection.wrap_database_errors:
            cursor = worker_cursor_class()(driver_connection)
            _register_loaders(cursor, connection)
        kept = _kept[connection] = (driver_connection, cursor)
    return connection._prepare_cursor(kept[1])


@functools.cache
def worker_cursor_class() -> type:
    """The cursor class, made on first use (psycopg may be absent where it is never used)."""
    from psycopg import Cursor

    class WorkerCursor(Cursor):
        #: Results in binary, unless the project runs without time zones.
        binary_results = True

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs.setdefault("binary", self.binary_results)
            kwargs.setdefault("prepare", False)
            return super().execute(query, params, **kwargs)

        def close(self) -> None:
            # Kept for the session: Django's wrapper closes its cursor after
            # each use. Its results are freed by the next statement, and it
            # holds nothing on the server.
            pass

    return WorkerCursor


def _register_loaders(cursor: Any, connection: Any) -> None:
    from psycopg.adapt import Loader
    from psycopg.pq import Format
    from psycopg.types.datetime import TimestamptzBinaryLoader, TimestamptzLoader
    from psycopg.types.string import TextLoader as StrLoader

    class UUIDTextLoader(Loader):
        format = Format.BINARY

        def load(self, data: Any) -> str:
            h = bytes(data).hex()
            return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    class JsonbTextLoader(Loader):
        format = Format.BINARY

        def load(self, data: Any) -> str:
            # A version byte (1), then the document as text.
            return bytes(data[1:]).decode()

    adapters = cursor.adapters
    if connection.timezone is None:
        # Without USE_TZ, Django's text loader: naive datetimes, as everywhere
        # else in such a project (it has no binary one).
        from django.db.backends.postgresql.psycopg_any import register_tzloader

        register_tzloader(connection.timezone, cursor)
        cursor.binary_results = False
        adapters.register_loader("uuid", StrLoader)
        return
    # psycopg swaps its C implementations in for these two classes.
    adapters.register_loader("timestamptz", TimestamptzLoader)
    adapters.register_loader("timestamptz", TimestamptzBinaryLoader)
    adapters.register_loader("uuid", UUIDTextLoader)
    adapters.register_loader("jsonb", JsonbTextLoader)
