"""Where the pages that only read go: the backend's ``READ_DATABASE`` (a replica), or the primary.

``OPTIONS = {"READ_DATABASE": "replica"}`` names a Django database alias that
holds a copy of the task tables (a streaming replica of ``DATABASE``). What
only shows the queue reads there: the admin's lists, detail pages, counts and
dashboard, ``rdbtasks status``, the metrics view and the autoscaler's backlog
sample. What claims, writes, or reads to decide a write never does: workers,
the scheduler, the fence, ``requeue``, ``prunetasks``, and every admin action
and form save (those re-read on the primary). ``read_database(using)`` is the
one answer to "which alias do reads of ``using``'s tasks go to"; without a
``READ_DATABASE`` it is ``using`` itself, so nothing changes.

A replica lags: what it shows may be a moment old (docs/scaling.md).
"""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.db import connections

from .backend_interface import TaskBackendInterface
from .compat import task_backends
from .conf import READ_DATABASE_MISSING
from .db import dialect_for


def read_database(using: str) -> str:
    """The alias that the read-only views read the tasks of ``using`` from."""
    for alias in getattr(settings, "TASKS", {}):
        backend = task_backends[alias]
        if isinstance(backend, TaskBackendInterface) and backend.database == using:
            read = backend.config.read_database
            if read:
                return read
    return using


def replica_lag(using: str) -> float | None:
    """Seconds the server behind ``using`` is behind its primary: 0 on a primary, None unknown."""
    connection = connections[using]
    with connection.cursor() as cursor:
        return dialect_for(connection).replica_lag(cursor)


def read_database_checks(backend: TaskBackendInterface) -> list[checks.CheckMessage]:
    """E050: ``READ_DATABASE`` names an alias that is not in DATABASES."""
    read = backend.config.read_database
    if read is None or read in connections:
        return []
    return [
        checks.Error(
            f"Task backend {backend.alias!r}: READ_DATABASE {read!r} is not in DATABASES.",
            hint=(
                "Name the alias of a replica of DATABASES"
                f"[{backend.database!r}] (it must hold the same task tables), "
                "or remove the option to read from the primary."
            ),
            id=READ_DATABASE_MISSING,
        )
    ]
