"""What a task leaves on its thread's connections, undone before the next task runs."""

from __future__ import annotations

import threading
from typing import Any

from django.db import connections
from django.db.backends.signals import connection_created

#: Per thread, the connections it opened: alias -> Django's wrapper.
_this_thread = threading.local()


def _note_connected(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Every connection a thread opens, by its ``connection_created``.

    ``reset_task_connections`` runs after every task; asking Django which of
    the thread's connections exist (``connections.all(initialized_only=True)``)
    goes through its thread-critical local twice per alias, each time asking
    asyncio for a running loop: about 8 µs per no-op task, a fifth of its
    runner's busy time. A connection that was never opened has nothing to
    undo; one opened on this thread said so here. Only Django's own for this
    thread are kept: one a task made itself (``connections.create_connection``)
    is the task's to keep open, as before.
    """
    if not any(own is connection for own in connections.all(initialized_only=True)):
        return
    connected = getattr(_this_thread, "connected", None)
    if connected is None:
        connected = _this_thread.connected = {}
    connected[connection.alias] = connection


connection_created.connect(_note_connected, dispatch_uid="django_rdbtasks.task_connections")


def reset_task_connections() -> None:
    """Undo what a task may have left on this thread's connections.

    Like Django's request-end cleanup, but the connection stays open whatever
    ``CONN_MAX_AGE`` says: reconnecting per task would triple the cost.
    """
    connected = getattr(_this_thread, "connected", None)
    if not connected:
        return
    for connection in list(connected.values()):
        if connection.connection is None:
            continue
        if connection.in_atomic_block:
            _abandon_atomic(connection)
        # Connected (above): the attribute is what get_autocommit() returns,
        # without its async guard and connection check (a tenth of a no-op task).
        elif connection.autocommit != connection.settings_dict["AUTOCOMMIT"]:
            _close_quietly(connection)
        elif connection.errors_occurred:
            if connection.is_usable():
                connection.errors_occurred = False
            else:
                _close_quietly(connection)


def close_task_connections() -> None:
    """Drop this thread's task connections; the next query reconnects (after a
    failover, to whichever server accepts writes)."""
    for connection in connections.all(initialized_only=True):
        _close_quietly(connection)


def _abandon_atomic(connection: Any) -> None:
    """A task returned inside an ``atomic()`` block it never left: drop the connection.

    Closing it makes the server roll back what the block wrote. Django would
    keep the block's state on the connection (and refuse to reconnect inside
    it), so every later task on this thread would fail: the bookkeeping of
    the abandoned block is cleared first, as if it had been rolled back.
    """
    connection.atomic_blocks = []
    connection.savepoint_ids = []
    connection.savepoint_state = 0
    connection.in_atomic_block = False
    connection.needs_rollback = False
    connection.commit_on_exit = True
    _close_quietly(connection)
    connection.closed_in_transaction = False


def _close_quietly(connection: Any) -> None:
    try:
        connection.close()
    except Exception:
        pass
