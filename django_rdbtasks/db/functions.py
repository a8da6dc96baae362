from __future__ import annotations

from typing import Any

from django.db import models

from .clock import now_on


class DbNow(models.Func):
    """The database server's current time, in UTC where the column is naive.

    Django's ``Now()`` is the session time zone on MySQL, which is not UTC
    unless the server says so; leases and schedules must use one clock.
    """

    output_field = models.DateTimeField()

    def as_sql(  # type: ignore[override]
        self, compiler: Any, connection: Any, **extra_context: Any
    ) -> tuple[str, tuple[Any, ...]]:
        return now_on(connection), ()
