"""The worker's own database sessions, apart from the ones its tasks use.

Each worker thread talks to the task table through a connection of its own,
never through the connection the task it runs uses. So the worker can bound
its own sessions (lock waits, idle transactions, keepalives: a frozen or
partitioned worker must not hold locks for long) without imposing any of that
on task code, and a task that leaves its connection in a bad state cannot
break a claim.

The connection is a copy of the task database's, put under a private alias in
the calling thread only (``connections[alias] = ...``): the ORM and
``transaction.atomic`` take the alias like any other, and Django's test cases
treat it as the dynamically created connection it is.

Behind a transaction pooler (the backend's ``TRANSACTION_POOLING`` option) a
server session serves other clients between our transactions, so nothing is
SET on it: the same bounds are set per transaction (``worker_transaction``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.db.backends.signals import connection_created
from django.db.utils import load_backend
from django.utils.connection import ConnectionDoesNotExist

from ..db import dialect_for
from .lazy_autocommit import without_autocommit_toggles

SUFFIX = "__rdbtasks_worker"


@dataclass(frozen=True)
class _Bounds:
    database: str
    #: What the session's (or each transaction's) timeouts derive from.
    lease: float
    #: Behind a transaction pooler: nothing set on the session, bounds per transaction.
    pooled: bool


#: Private alias -> what it copies and how its sessions are bounded.
_aliases: dict[str, _Bounds] = {}
_lock = threading.Lock()


def worker_alias(database: str, lease: float, *, pooled: bool = False) -> str:
    """The alias of the worker's own connections to ``database``."""
    alias = f"{database}{SUFFIX}"
    with _lock:
        _aliases[alias] = _Bounds(database, lease, pooled)
    return alias


def is_pooled(alias: str) -> bool:
    """Whether the worker's connections under ``alias`` go through a transaction pooler."""
    bounds = _aliases.get(alias)
    return bounds is not None and bounds.pooled


@contextmanager
def worker_transaction(alias: str) -> Iterator[None]:
    """``transaction.atomic`` on a worker connection, bounded even behind a pooler."""
    with transaction.atomic(using=alias):
        bounds = _aliases.get(alias)
        if bounds is not None and bounds.pooled:
            connection = connections[alias]
            with connection.cursor() as cursor:
                for statement in dialect_for(connection).transaction_sql(bounds.lease):
                    cursor.execute(statement)
        yield


def open_in_thread(alias: str) -> Any:
    """This thread's worker connection under ``alias``, created on first use."""
    try:
        return connections[alias]
    except ConnectionDoesNotExist:
        pass
    bounds = _aliases[alias]
    source = connections[bounds.database]
    settings = dict(source.settings_dict)
    options = own_session_options(source, bounds.lease, settings.get("OPTIONS") or {})
    settings.update(
        OPTIONS=options,
        # Held for the worker's life: reconnecting per task would triple its cost.
        CONN_MAX_AGE=None,
        CONN_HEALTH_CHECKS=False,
        ATOMIC_REQUESTS=False,
        AUTOCOMMIT=True,
    )
    wrapper_class = load_backend(settings["ENGINE"]).DatabaseWrapper
    if dialect_for(source).autocommit_is_a_statement:
        wrapper_class = without_autocommit_toggles(wrapper_class)
    wrapper = wrapper_class(settings, alias)
    connections[alias] = wrapper
    return wrapper


def own_session_options(source: Any, lease: float, configured: dict[str, Any]) -> dict[str, Any]:
    """The driver options of a worker's own session to ``source``'s database: the
    ``configured`` ones, its bounds (keepalives, timeouts) over them, and its name."""
    dialect = dialect_for(source)
    options = {**configured, **dialect.connection_options(lease)}
    options.update(dialect.naming_options(session_role(), options))
    return options


def session_role() -> str:
    """What the calling thread's worker session does, and for which process: its
    thread's name (``rdbtasks-lane-0``, ``rdbtasks-beside-0_0``, ``rdbtasks-keeper``,
    ``rdbtasks-listener``) and the pid, as the worker table shows it."""
    name = threading.current_thread().name
    if not name.startswith("rdbtasks"):
        name = f"rdbtasks {name}"
    return f"{name} pid {os.getpid()}"


#: Bounds of the worker's own connections that would cut a task's long
#: statement short: a task's connections get the others only.
_WORKER_ONLY = frozenset({"read_timeout"})


def bound_user_connections(lease: float) -> list[str]:
    """Give this process's connections to ``DATABASES`` the worker's TCP bounds, where
    their settings have none: the connections task bodies (and the scheduler) use.

    Called once in a worker process, before its threads connect. A task body
    that talks to a server cut off silently would otherwise wait for the
    kernel's retransmissions (about 15 minutes) before its query fails, past
    its lease and past any grace. An option set in ``DATABASES[...]["OPTIONS"]``
    is left as it is. Returns the aliases that got a default.
    """
    changed = []
    for alias in connections:
        if alias.endswith(SUFFIX):
            continue
        try:
            defaults = dialect_for(connections[alias]).connection_options(lease)
        except NotImplementedError:
            continue  # a database this app does not run on: its driver's options are unknown
        options = connections[alias].settings_dict.setdefault("OPTIONS", {})
        added = {
            key: value
            for key, value in defaults.items()
            if key not in _WORKER_ONLY and key not in options
        }
        if added:
            # The settings dict is shared by every thread's connection to this
            # alias: set once here, every later connection has them.
            options.update(added)
            changed.append(alias)
    return changed


#: The driver connections a forked child inherited from its parent: referenced until
#: the child's ``os._exit``, never closed or collected (see ``leave_inherited``).
_inherited: list[Any] = []


def leave_inherited_connections() -> None:
    """In a forked child, first thing: connect anew, leaving the parent's sessions alone.

    The parent's connections are its own (``runworkers`` called from a test
    keeps the test's): the child must neither use them, which would interleave
    two processes' statements on one session, nor close them, which would end
    the parent's session (a MySQL connection says goodbye to the server as it
    is closed or collected). So each is forgotten by its Django wrapper, which
    connects again when the child first uses it, and kept referenced until the
    child exits.
    """
    for wrapper in connections.all(initialized_only=True):
        if wrapper.connection is not None:
            _inherited.append(wrapper.connection)
            wrapper.connection = None


def close_in_thread(alias: str) -> None:
    try:
        wrapper = connections[alias]
    except ConnectionDoesNotExist:
        return
    try:
        wrapper.close()
    except Exception:  # a broken connection may fail to close; it is gone either way
        pass


def _bound_session(sender: Any, connection: Any, **kwargs: Any) -> None:
    bounds = _aliases.get(connection.alias)
    if bounds is None or bounds.pooled:
        return
    statements = dialect_for(connection).session_sql(bounds.lease)
    if statements:
        with connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)


connection_created.connect(_bound_session, dispatch_uid="django_rdbtasks.worker.connection")
