"""PostgreSQL with psycopg 3: the enqueue's statements kept prepared in a server session.

A single enqueue is one statement and one commit; parsing and planning the
statement anew costs about a sixth of it (measured in bench/enqueue_profile.py;
inside a transaction, without the commit, a third of the server's time).
Django leaves psycopg's ``prepare_threshold`` at None, which turns prepared
statements off for the whole connection, because behind a transaction pooler
the next statement may run in another server session. So this cursor, which
runs only the enqueue's statements, prepares them itself, and only where the
session is known to be the server's own:

- never when the backend says ``TRANSACTION_POOLING`` (the cursor is not made);
- from a statement's second run on a connection, so that a connection that
  enqueues once (``CONN_MAX_AGE = 0`` and one task per request) pays nothing
  extra;
- after one check that the connection talks to a server process directly: its
  ``pg_backend_pid()`` is the process id the connection was given at start-up.
  A pooler (PgBouncer, pgcat, RDS Proxy) hands its clients a process id of its
  own, so behind any pooler, configured or not, nothing is prepared.

Inside a transaction as outside one: a project that enqueues only in
transactions (``ATOMIC_REQUESTS``, a task that enqueues) gets the prepared call
too, a third less of the server's time per call. The run that prepares is two
exchanges, and if the second fails (a deduplicated enqueue meeting its key),
psycopg must still know the statement the server now holds: it does when it
had counted a good run of the statement before (threshold 1, the first run
counted), and forgets it only when it prepared a statement never counted
(threshold 0), which would leave one more statement on the server with every
such failure.

The connection's ``prepare_threshold`` is set only for the duration of this
cursor's statement, so the project's other queries are never counted or
prepared. But a prepared statement on the connection makes psycopg deallocate
all of them (``DEALLOCATE ALL``, one more round trip) when a transaction is
rolled back, which also drops any the project made with SQL ``PREPARE``, and
forget its counts: the second enqueue after prepares again. If the statement was
deallocated behind psycopg's back (``DEALLOCATE ALL`` or ``DISCARD ALL`` sent
as SQL), the cursor stops preparing; outside a transaction the enqueue is run
again unprepared at once (the failed run did nothing), inside one the error is
raised, as the transaction is lost anyway.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from ..cursors import driver_cursor

try:  # psycopg 3; this cursor is never made under psycopg 2
    from psycopg.errors import InvalidSqlStatementName
    from psycopg.pq import TransactionStatus
except ImportError:  # pragma: no cover
    pass

#: A threshold no statement reaches: psycopg then runs prepared what it has
#: prepared already, and prepares nothing new.
_NEVER = sys.maxsize


class SessionPreparing:
    """Runs the statements in ``preparable`` prepared in the server session, by the
    rules above: from their second run on a connection, and only where the
    session is the server's own. A mixin of psycopg cursors (``execute`` is
    theirs)."""

    #: Whether the session is the server's own: None until checked.
    direct: bool | None = None
    #: The statements it may prepare; it runs others too, never prepared.
    preparable: Collection[str] = frozenset()
    #: Whether a statement is prepared at its first run rather than its second:
    #: for statements every session runs again and again (the worker's rounds),
    #: where the unprepared first run is one more plan of a statement whose
    #: planning costs more than its execution.
    prepares_first_run = False

    def execute_in_session(self, query: Any, params: Any, kwargs: dict[str, Any]) -> Any:
        """``query`` (one of ``preparable``), prepared once it has run once."""
        run = super().execute  # type: ignore[misc]
        connection = self.connection  # type: ignore[attr-defined]
        run_once: set[Any] = self.__dict__.setdefault("run_once", set())
        if not self.prepares_first_run and query not in run_once:
            # Not prepared, but counted: psycopg prepares (threshold 1) only
            # a statement it has counted a good run of.
            run_once.add(query)
            connection.prepare_threshold = _NEVER
            try:
                return run(query, params, **kwargs)
            finally:
                connection.prepare_threshold = None
        if self.direct is None:
            self.direct = self.is_direct()
        if not self.direct:
            return run(query, params, **kwargs)
        # Threshold 0 prepares at first sight. If that first run fails,
        # psycopg forgets the statement the server holds by then: one
        # statement left in the session per failed first run of a shape
        # (dropped with the others at psycopg's next DEALLOCATE ALL, after a
        # ROLLBACK), where threshold 1 leaves none.
        connection.prepare_threshold = 0 if self.prepares_first_run else 1
        try:
            return run(query, params, **kwargs)
        except InvalidSqlStatementName:
            self.direct = False
            self.stop_preparing()
            if connection.info.transaction_status != TransactionStatus.IDLE:
                raise
            return run(query, params, prepare=False, **kwargs)
        finally:
            connection.prepare_threshold = None

    def stop_preparing(self) -> None:
        """What the cursor undoes once it prepares no more (a statement dropped behind its back)."""

    def is_direct(self) -> bool:
        """Whether the connection talks to a server process itself (no pooler between)."""
        # A query of its own, once per connection, on this cursor (whose
        # result the next execute replaces).
        super().execute("SELECT pg_backend_pid()")  # type: ignore[misc]
        row = self.fetchone()  # type: ignore[attr-defined]
        return row is not None and row[0] == self.connection.info.backend_pid  # type: ignore[attr-defined]


def prepares(cursor: Any) -> bool:
    """Whether ``cursor`` (a driver cursor, or Django's wrapper of one) keeps its
    statements prepared: a preparing cursor not yet found behind a pooler."""
    driver = driver_cursor(cursor)
    return isinstance(driver, SessionPreparing) and driver.direct is not False


@functools.cache
def preparing_cursor_class() -> type:
    """The cursor class, made on first use (Django defines its base only under psycopg 3)."""
    if TYPE_CHECKING:
        from psycopg import Cursor as ServerBindingCursor
    else:
        from django.db.backends.postgresql.base import ServerBindingCursor

    class PreparingCursor(SessionPreparing, ServerBindingCursor):
        def __init__(self, *args: Any, preparable: Collection[str] = (), **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            #: A single enqueue's statements; it runs others too (a bulk
            #: enqueue's, a limit's) but never prepares them.
            self.preparable = frozenset(preparable)

        def execute(
            self, query: Any, params: Any = None, *, prepare: bool | None = None, **kwargs: Any
        ) -> Any:
            if prepare is not None or self.connection.prepare_threshold is not None:
                # Asked explicitly, or the project prepares statements itself:
                # psycopg's own rules apply.
                return super().execute(query, params, prepare=prepare, **kwargs)
            if query not in self.preparable:
                return super().execute(query, params, **kwargs)
            return self.execute_in_session(query, params, kwargs)

    return PreparingCursor
