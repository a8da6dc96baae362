"""Which dialect speaks for a connection: one per alias and database, made on first use."""

from __future__ import annotations

import datetime as dt
from typing import Any

from . import clock
from .base import Dialect
from .mysql import MySQLDialect
from .postgresql import PostgreSQLDialect
from .sqlite import SQLiteDialect
from .tables import Tables

#: The dialect of each database, by Django's ``connection.vendor``.
DIALECTS: dict[str, type[Dialect]] = {
    "postgresql": PostgreSQLDialect,
    "mysql": MySQLDialect,
    "sqlite": SQLiteDialect,
}

#: The dialects made: (alias, vendor) -> its dialect.
made: dict[tuple[str, str], Dialect] = {}


def model_tables() -> Tables:
    """The tables' names, as the models define them."""
    # Read when the first dialect is made: models can be imported only once
    # the app registry is ready, which importing this module must not need.
    from ..models import LimitSlot, PausedQueue, Task

    return Tables(
        task=Task._meta.db_table,
        paused_queue=PausedQueue._meta.db_table,
        limit_slot=LimitSlot._meta.db_table,
    )


def dialect_for(connection: Any) -> Dialect:
    key = (connection.alias, connection.vendor)
    dialect = made.get(key)
    if dialect is None:
        cls = DIALECTS.get(connection.vendor)
        if cls is None:
            raise clock.unsupported(connection.vendor)
        dialect = made[key] = cls(
            connection, model_tables(), pinned_now=clock.pinned.get(connection.alias)
        )
    return dialect


def pin_clock(alias: str, at: dt.datetime | None) -> None:
    """Make every statement on ``alias`` read ``at`` as the database's now (None: its clock).

    For tests (``django_rdbtasks.testing.TaskClock``): the alias's dialect is
    made again, so that each statement it builds carries the instant
    (``DbNow`` reads the clock itself).
    """
    clock.pin(alias, at)
    for key in [key for key in made if key[0] == alias]:
        del made[key]


def forget_what_claims_learnt() -> None:
    """Every dialect's claims start afresh: one test's contention is not the next's."""
    for dialect in made.values():
        dialect.forget_learnt()
