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
"""

from __future__ import annotations

import threading
from typing import Any

from django.db import connections
from django.db.backends.signals import connection_created
from django.db.utils import load_backend
from django.utils.connection import ConnectionDoesNotExist

from ..db import dialect_for

SUFFIX = "__rdbtasks_worker"
#: Private alias -> (the database it copies, the lease its sessions are bounded by).
_aliases: dict[str, tuple[str, float]] = {}
_lock = threading.Lock()


def worker_alias(database: str, lease: float) -> str:
    """The alias of the worker's own connections to ``database``."""
    alias = f"{database}{SUFFIX}"
    with _lock:
        _aliases[alias] = (database, lease)
    return alias


def open_in_thread(alias: str) -> Any:
    """This thread's worker connection under ``alias``, created on first use."""
    try:
        return connections[alias]
    except ConnectionDoesNotExist:
        pass
    database, lease = _aliases[alias]
    source = connections[database]
    settings = dict(source.settings_dict)
    options = dict(settings.get("OPTIONS") or {})
    options.update(dialect_for(source).connection_options(lease))
    settings.update(
        OPTIONS=options,
        # Held for the worker's life: reconnecting per task would triple its cost.
        CONN_MAX_AGE=None,
        CONN_HEALTH_CHECKS=False,
        ATOMIC_REQUESTS=False,
        AUTOCOMMIT=True,
    )
    wrapper = load_backend(settings["ENGINE"]).DatabaseWrapper(settings, alias)
    connections[alias] = wrapper
    return wrapper


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
    known = _aliases.get(connection.alias)
    if known is None:
        return
    statements = dialect_for(connection).session_sql(known[1])
    if statements:
        with connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)


connection_created.connect(_bound_session, dispatch_uid="django_rdbtasks.worker.connection")
