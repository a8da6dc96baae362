"""The database clock as SQL, per database, and the instant a test pinned it to.

Below everything else of ``db``: ``DbNow`` (the ORM's now) and every dialect's
statements read the clock from here, so they agree, pinned or not, without
the ORM needing a dialect.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

#: Each database's clock, in the form its DateTimeField columns store.
SERVER_NOW = {
    "postgresql": "STATEMENT_TIMESTAMP()",
    "mysql": "UTC_TIMESTAMP(6)",
    # Django stores aware datetimes as UTC text in this shape.
    "sqlite": "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')",
}

#: Aliases whose clock a test pinned (``testing.clock``): alias -> the instant.
pinned: dict[str, dt.datetime] = {}


def unsupported(vendor: str) -> NotImplementedError:
    return NotImplementedError(f"django-rdbtasks does not support the {vendor!r} database.")


def time_literal(vendor: str, at: dt.datetime) -> str:
    """An instant as SQL, of the type the database's clock gives."""
    utc = at.astimezone(dt.UTC)
    if vendor == "postgresql":
        return f"'{utc.isoformat()}'::timestamptz"
    text = utc.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
    if vendor == "mysql":
        return f"CAST('{text}' AS DATETIME(6))"
    if vendor == "sqlite":
        # The text Django stores an aware datetime as (UTC, microseconds), so
        # that it compares with a stored one as the instants do.
        return f"'{text}'"
    raise unsupported(vendor)


def now_sql(vendor: str, at: dt.datetime | None = None) -> str:
    """The clock on ``vendor``: the server's, or the instant ``at`` where one is pinned."""
    if at is not None:
        return time_literal(vendor, at)
    try:
        return SERVER_NOW[vendor]
    except KeyError:
        raise unsupported(vendor) from None


def now_on(connection: Any) -> str:
    """The clock of ``connection`` (a Django connection), pinned if a test pinned its alias."""
    return now_sql(connection.vendor, pinned.get(connection.alias))


def pin(alias: str, at: dt.datetime | None) -> None:
    """Make ``alias``'s clock read ``at`` (None: the server's again)."""
    if at is None:
        pinned.pop(alias, None)
    else:
        pinned[alias] = at
