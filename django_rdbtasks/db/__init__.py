"""Database-specific SQL of the claim protocol, one module per database."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import Dialect

_dialects: dict[tuple[str, str], Dialect] = {}
#: Aliases whose clock a test pinned (``testing.clock``): alias -> the instant.
_pinned: dict[str, dt.datetime] = {}


def dialect_for(connection: Any) -> Dialect:
    key = (connection.alias, connection.vendor)
    dialect = _dialects.get(key)
    if dialect is None:
        cls: type[Dialect]
        if connection.vendor == "postgresql":
            from .postgresql import PostgreSQLDialect

            cls = PostgreSQLDialect
        elif connection.vendor == "mysql":
            from .mysql import MySQLDialect

            cls = MySQLDialect
        elif connection.vendor == "sqlite":
            from .sqlite import SQLiteDialect

            cls = SQLiteDialect
        else:
            raise NotImplementedError(
                f"django-rdbtasks does not support the {connection.vendor!r} database."
            )
        dialect = _dialects[key] = cls(connection, pinned_now=_pinned.get(connection.alias))
    return dialect


def pin_clock(alias: str, at: dt.datetime | None) -> None:
    """Make every statement on ``alias`` read ``at`` as the database's now (None: its clock).

    For tests (``django_rdbtasks.testing.TaskClock``): the alias's dialect is
    made again, so that each statement it builds carries the instant.
    """
    if at is None:
        _pinned.pop(alias, None)
    else:
        _pinned[alias] = at
    for key in [key for key in _dialects if key[0] == alias]:
        del _dialects[key]


def forget_what_claims_learnt() -> None:
    """Every dialect's claims start afresh: one test's contention is not the next's."""
    for dialect in _dialects.values():
        dialect.forget_learnt()
