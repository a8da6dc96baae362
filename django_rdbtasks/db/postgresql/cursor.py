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
queries logged under DEBUG), whose ``close`` leaves it open.

**The lean round is prepared, with a plan made once.** Planning and parsing
the round anew took a fifth of the server's time per task (3.6 ms and 0.7
ms of a 17 ms round of 390 no-op tasks, 2026-11-28). The statements the
dialect names ``preparable`` (the lean form's, whose every read of the task
table is by primary key, by location, or a range of an index with a LIMIT:
round.py) run prepared, by the enqueue's rules (preparing.py: only where
the session is the server's own, never behind a pooler) but from their first
run, since a worker's session runs each round's shape again and again, with
one generic plan, made once and kept until the table's statistics change.
Two things keep that plan from depending on the table's size when it was
made (a plan made on a near-empty table would otherwise read it whole, by a
sequential scan and a sort, once a backlog arrives):

- the session that prepares the round (the lane's round thread's) is told to
  make generic plans (``plan_cache_mode``: by cost, PostgreSQL would keep
  planning each run, a LIMIT given as a parameter being costed as a tenth of
  the index), and never to choose a sequential or bitmap scan where an index
  can serve. PostgreSQL applies ``plan_cache_mode`` to every statement sent
  with parameters, prepared or not, so on that session the statements not
  prepared (``finish``, renewals, the row locks) go with their values quoted
  into their text, as Django's own cursors send them: planned for their
  values at each run, as everywhere else (tests/test_db_plans.py holds those
  plans to their bounds). They still run without sequential or bitmap scans;
  each reads by primary key or a range of an index. A session that stops
  preparing (its statement dropped behind psycopg's back) is reset to its
  defaults;
- every read of the task table in the lean round is one that no join can
  turn into a read of the whole table (a LATERAL with a LIMIT, an array of
  ids or locations).

tests/test_postgresql_cursor.py builds the plan on an empty table and runs it on a
backlog of 300,000 rows.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from typing import Any
from weakref import WeakKeyDictionary

from .preparing import SessionPreparing

#: What a session that runs the round prepared is told, once: a generic plan,
#: and no plan that reads the task table by a sequential or bitmap scan where
#: an index can serve (see the module's docstring).
PLAN_ONCE_SESSION = (
    "SELECT set_config('plan_cache_mode', 'force_generic_plan', false), "
    "set_config('enable_seqscan', 'off', false), set_config('enable_bitmapscan', 'off', false)"
)
#: What undoes it: each setting back to the session's own default (what RESET gives).
PLAN_EACH_RUN_SESSION = (
    "SELECT set_config(name, reset_val, false) FROM pg_settings "
    "WHERE name IN ('plan_cache_mode', 'enable_seqscan', 'enable_bitmapscan')"
)

#: Per Django connection: the driver connection its cursor belongs to, and the cursor.
_kept: WeakKeyDictionary[Any, tuple[Any, Any]] = WeakKeyDictionary()


def worker_cursor(connection: Any, preparable: Collection[str] = frozenset()) -> Any:
    """The worker's cursor on ``connection`` (a Django connection), made once per session.

    ``preparable``: the statements it may keep prepared (the dialect's set,
    which grows as it compiles them).
    """
    connection.ensure_connection()
    driver_connection = connection.connection
    kept = _kept.get(connection)
    if kept is None or kept[0] is not driver_connection:
        with connection.wrap_database_errors:
            cursor = worker_cursor_class()(driver_connection)
            cursor.preparable = preparable
            _register_loaders(cursor, connection)
        kept = _kept[connection] = (driver_connection, cursor)
    return connection._prepare_cursor(kept[1])


#: How many long statements' conversions a worker keeps (``statement_query_class``):
#: the rounds' shapes a session runs are a few dozen.
LONG_STATEMENTS_KEPT = 256


@functools.cache
def statement_query_class() -> type:
    """psycopg's query class, but converting each long statement once per process.

    psycopg turns a statement's ``%(name)s`` placeholders into ``$n`` at every
    run, and keeps the result only for statements of up to 4 kB (its
    ``MAX_CACHED_STATEMENT_LENGTH``: an ORM's long statements are rarely
    run twice). The worker's rounds are 7 to 15 kB and a worker runs the same
    few dozen again and again: converted anew, 100 to 155 µs of a round's
    time in the worker, and a round is what each limited task costs (its
    slot's hand-over). Converted once, as psycopg does for short ones. Where
    psycopg's internals are not as expected, its own class.
    """
    from psycopg import Cursor, _queries

    base = Cursor._query_cls
    convert = getattr(_queries, "_query2pg_nocache", None)
    longest: int = getattr(_queries, "MAX_CACHED_STATEMENT_LENGTH", 0)
    if convert is None or not longest:  # pragma: no cover - another psycopg
        return base

    @functools.lru_cache(maxsize=LONG_STATEMENTS_KEPT)
    def converted(query: str, encoding: str) -> Any:
        # Keyed by the text itself: the rounds' statements are made once
        # (compiled and kept), so the key's hash is computed once.
        return convert(query.encode(encoding), encoding)

    class StatementQuery(base):  # type: ignore[misc,valid-type]
        def convert(self, query: Any, vars: Any) -> None:
            if vars is not None and type(query) is str and len(query) > longest:
                parts = converted(query, self._tx.encoding)
                self.query, self._want_formats, self._order, self._parts = parts
                self.dump(vars)
                return
            super().convert(query, vars)

    return StatementQuery


@functools.cache
def worker_cursor_class() -> type:
    """The cursor class, made on first use (psycopg may be absent where it is never used)."""
    from psycopg import Cursor

    class WorkerCursor(SessionPreparing, Cursor):
        #: psycopg's query class, converting the rounds' long statements once.
        _query_cls = statement_query_class()
        #: Results in binary, unless the project runs without time zones.
        binary_results = True
        #: Whether the session carries ``PLAN_ONCE_SESSION``'s settings.
        planning_once = False
        #: A round is prepared at its first run: each session runs each of its
        #: shapes again and again, and planning a window or walk round costs
        #: more than running it (5 to 30 ms against under 1 ms, issue 42's scenario).
        prepares_first_run = True
        #: What quotes values into a statement's text (a ``ClientCursor``), once needed.
        quoting: Any = None

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs.setdefault("binary", self.binary_results)
            if self.planning_once and self.direct is False:
                self.stop_preparing()
            if (
                type(query) is str
                and query in self.preparable
                and self.connection.prepare_threshold is None
            ):
                return self.execute_in_session(query, params, kwargs)
            if self.planning_once and params:
                # Its values in its text, as Django's own cursors send them: a
                # statement without parameters is planned for them, whatever
                # plan_cache_mode says (it rules only statements with some).
                query, params = self.inlined(query, params), None
            kwargs.setdefault("prepare", False)
            return super().execute(query, params, **kwargs)

        def inlined(self, query: Any, params: Any) -> Any:
            if self.quoting is None:
                from psycopg import ClientCursor

                self.quoting = ClientCursor(self.connection)
            return self.quoting.mogrify(query, params)

        def is_direct(self) -> bool:
            from psycopg.pq import TransactionStatus

            # Set outside any transaction (the round is a statement committed
            # on its own), where no rollback can undo it; a session met in
            # a transaction first is never asked to prepare.
            if self.connection.info.transaction_status != TransactionStatus.IDLE:
                return False
            if not super().is_direct():
                return False
            super().execute(PLAN_ONCE_SESSION)
            self.planning_once = True
            return True

        def stop_preparing(self) -> None:
            from psycopg.pq import TransactionStatus

            # Only outside a transaction, as the settings were made; until
            # then the session's statements keep their values inlined.
            if self.connection.info.transaction_status == TransactionStatus.IDLE:
                super().execute(PLAN_EACH_RUN_SESSION)
                self.planning_once = False

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
