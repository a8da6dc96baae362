"""A driver cursor kept for the life of its connection, for the enqueue's statement."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any
from weakref import WeakKeyDictionary

from .base import Dialect

#: Per Django connection (one per thread): the driver connection the cursor
#: belongs to, whether it may prepare, and the cursor in Django's wrapper. Gone
#: with the Django connection object.
_kept: WeakKeyDictionary[Any, tuple[Any, bool, Any]] = WeakKeyDictionary()


def kept_cursor(connection: Any, dialect: Dialect, *, prepare: bool = False) -> Any:
    """What ``connection.cursor()`` returns, over a driver cursor made once.

    A new psycopg cursor per statement costs about a tenth of a single
    enqueue: it sets up its adapters again and looks up the dumper of every
    parameter afresh. The kept cursor is wrapped as Django wraps every cursor
    (execute wrappers, errors translated), and replaced when Django
    reconnects. ``prepare`` lets the dialect's cursor keep its statements
    prepared in the session (False behind a transaction pooler).
    """
    if "cursor" in vars(connection) or connection.queries_logged:
        # Someone wrapped this connection's cursor() (django-debug-toolbar's
        # SQL panel, SimpleTestCase's refusal of queries): go through it. And
        # while queries are logged (DEBUG, assertNumQueries), Django's own
        # cursor: its log reads the statement's text, which a run of a
        # prepared statement leaves unset.
        return connection.cursor()
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    driver_connection = connection.connection
    kept = _kept.get(connection)
    if kept is None or kept[0] is not driver_connection or kept[1] is not prepare:
        with connection.wrap_database_errors:
            cursor = dialect.inserts.new_cursor(connection, prepare=prepare)
        # Django's own wrapper (queries are not logged here), made once: a
        # new one per statement cost a single enqueue 4 µs of client CPU.
        kept = _kept[connection] = (driver_connection, prepare, connection.make_cursor(cursor))
    # What Django checks before it hands out a cursor.
    connection.validate_thread_sharing()
    return kept[2]


def driver_cursor(cursor: Any) -> Any:
    """The driver's cursor under ``cursor`` (Django's wrapper of one, or one itself)."""
    return getattr(cursor, "cursor", cursor)


def copy_in(
    cursor: Any,
    statement: str,
    blocks: Iterable[str],
    meanwhile: Callable[[], object] | None = None,
) -> None:
    """Run ``statement`` (a ``COPY ... FROM STDIN``) with ``blocks`` of data on a psycopg 3 cursor.

    Each block is sent as soon as it is made, and the server reads it as it
    comes; ``meanwhile`` runs once all are sent, while the server still works
    through them, before the COPY's end is waited for.

    ``cursor`` is as ``kept_cursor`` returns it: Django's ``execute()`` cannot
    run a COPY, so it goes through the connection's execute wrappers here as
    any statement would (they see the statement, no parameters), its errors
    become Django's, and Django's debug cursor logs it while queries are logged.
    """

    def run(sql: str, params: Any, many: bool, context: dict[str, Any]) -> None:
        with cursor.copy(sql) as copying:
            for block in blocks:
                copying.write(block)
            if meanwhile is not None:
                meanwhile()

    db = getattr(cursor, "db", None)
    if db is None:  # a bare driver cursor
        run(statement, None, False, {})
        return

    def wrapped(sql: str, params: Any, many: bool, context: dict[str, Any]) -> None:
        db.validate_no_broken_transaction()
        with db.wrap_database_errors:
            run(sql, params, many, context)

    # As Django's CursorWrapper._execute_with_wrappers.
    execute: Callable[..., Any] = wrapped
    for wrapper in reversed(db.execute_wrappers):
        execute = functools.partial(wrapper, execute)
    execute(statement, None, False, {"connection": db, "cursor": cursor})
