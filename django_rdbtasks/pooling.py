"""What a transaction pooler (PgBouncer ``pool_mode = transaction``) asks of the settings.

Between two of our transactions the pooler may hand the server session to
another client, so nothing may live in the session: no ``SET`` (the worker sets
its bounds per transaction instead), no server-side prepared statements, no
server-side cursors, no ``LISTEN``. The backend's ``TRANSACTION_POOLING``
option says the task database is behind such a pooler; ``LISTEN_DATABASE``
names a second alias that connects straight to the server, for LISTEN.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.db import connections

from .conf import LISTEN_DATABASE_MISSING


def pooling_checks(backend: Any) -> list[checks.CheckMessage]:
    """The system checks of a backend's TRANSACTION_POOLING and LISTEN_DATABASE options."""
    messages: list[checks.CheckMessage] = []
    listen = backend.config.listen_database
    if listen is not None and listen not in connections:
        messages.append(
            checks.Error(
                f"Task backend {backend.alias!r}: LISTEN_DATABASE {listen!r} is not in DATABASES.",
                hint="Name an alias that connects straight to the PostgreSQL server.",
                id=LISTEN_DATABASE_MISSING,
            )
        )
    if not backend.config.transaction_pooling or backend.database not in connections:
        return messages
    settings = connections[backend.database].settings_dict
    options = settings.get("OPTIONS") or {}
    prefix = f"Task backend {backend.alias!r} is behind a transaction pooler, but DATABASES"
    if options.get("server_side_binding") is True or options.get("prepare_threshold") is not None:
        messages.append(
            checks.Error(
                f"{prefix}[{backend.database!r}] prepares statements on the server "
                "(server_side_binding or prepare_threshold): another client of the pooled "
                "session would meet them, or miss them.",
                hint="Remove both: Django's default binds parameters on the client.",
                id="django_rdbtasks.E031",
            )
        )
    if not settings.get("DISABLE_SERVER_SIDE_CURSORS"):
        messages.append(
            checks.Warning(
                f"{prefix}[{backend.database!r}] allows server-side cursors "
                "(QuerySet.iterator() outside a transaction breaks through the pooler).",
                hint="Set DISABLE_SERVER_SIDE_CURSORS = True for that database.",
                id="django_rdbtasks.W032",
            )
        )
    if listen is None and backend.notify:
        messages.append(
            checks.Info(
                f"Task backend {backend.alias!r} has no LISTEN_DATABASE: behind the pooler its "
                "workers poll for new tasks instead of being woken by NOTIFY.",
                hint="Add an alias that connects straight to the server and name it "
                "in OPTIONS['LISTEN_DATABASE'].",
                id="django_rdbtasks.I033",
            )
        )
    return messages
