"""What a task leaves on its thread's connections, undone before the next task runs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from django.db import OperationalError, connections
from django.db.backends.signals import connection_created

from ..retrying import retry_database

logger = logging.getLogger("django_rdbtasks.worker")

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
                _this_thread.broken = True  # reconnected before the next task


def task_connection_broke() -> bool:
    """Whether a task left this thread's connection broken (and closed) since the
    last ``reconnect_task_connections``."""
    return getattr(_this_thread, "broken", False)


def close_task_connections() -> None:
    """Drop this thread's task connections; the next query reconnects (after a
    failover, to whichever server accepts writes)."""
    for connection in connections.all(initialized_only=True):
        _close_quietly(connection)


def reconnect_task_connections(
    lost: bool,
    writable: str,
    accepts_writes: Callable[[Any], bool],
    *,
    own: Any = None,
    stop: threading.Event,
    give_up: Callable[[], bool],
) -> bool:
    """Before the next task runs: when ``lost`` (the lane's round thread lost
    its connection) or a task's connection broke, connect this thread again to
    ``writable``, the database of the worker's tasks, if its tasks used it.
    True when the task may run. Other databases' connections reconnect when a
    task next uses them, as Django's always do: this failover is not theirs.
    ``own``, the runner's own worker connection (a taken-over attempt's record,
    progress), is connected again too when ``lost``, used before or not: the
    first thing a takeover writes on it is the attempt it took over.

    After a failover, a connection opened at once may still reach the old
    primary: HAProxy routes to it until its checks fail (two seconds with
    ``deploy/patroni/haproxy.cfg``), a DNS name until its answer expires.
    The task would spend an attempt on a connection that fails, or on a
    restarted old primary that now refuses writes. So the runner connects
    first, retrying as the round thread does, until it connects to a server
    that accepts writes. False if stopped (``stop``, ``give_up``) before it
    could: the task is not run.
    """
    if lost:
        close_task_connections()  # maybe half-open: they must not be trusted
        if own is not None:
            _close_quietly(own)
    elif not task_connection_broke():
        return True
    _this_thread.broken = False
    wanted = [(getattr(_this_thread, "connected", None) or {}).get(writable)]
    if lost:
        wanted.append(own)
    closed = [c for c in wanted if c is not None and c.connection is None]
    if not closed:
        return True  # never used by its tasks, or unharmed

    def reconnect() -> bool:
        for connection in closed:
            if connection.connection is not None:
                continue  # connected by an earlier try
            connection.ensure_connection()
            with connection.cursor() as cursor:
                if not accepts_writes(cursor):
                    raise OperationalError(f"the server of {writable!r} accepts no writes")
        return True

    def close() -> None:
        for connection in closed:
            _close_quietly(connection)

    return bool(
        retry_database(
            reconnect,
            "reconnecting the tasks' connection",
            alias=None,
            stop=stop,
            give_up=give_up,
            on_error=close,
            log=logger,
        )
    )


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
