"""A database clock a test controls: backoffs come due, leases lapse, cron ticks, without sleeping.

Everything the queue decides by time, it decides by the database's clock
(``db/clock.py``): when a task is due, when a lease has lapsed, when a
retry's backoff is over, when a cron job's tick has come, when a rate limit's
window turns. ``TaskClock`` pins that clock, for one database alias, to an
instant the test chooses, by making every statement built for the alias carry
the instant as a literal in place of the server's clock (``db.pin_clock``).
So it works alike on PostgreSQL, MySQL/MariaDB and SQLite, inside a
``TestCase``'s transaction or out of it, and nothing is set on the server.

What it governs: every statement this process makes through the app on that
alias: enqueues (``enqueue``, ``bulk_enqueue``), the in-process ``drain``, cron
jobs fired from the test (``tick_jobs``), the admin and the ORM queries of the
app's models. What it does not: another process (a real ``runworkers``, whose
statements read the server's clock) and a project's own SQL that calls the
server's clock itself. The instant stands still until ``advance`` moves it:
a test reads the same time however long it runs.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from ..db import pin_clock
from ..jobs import database_now, sync_declared_jobs


class TaskClock:
    """The database clock of ``using``, pinned while the test runs.

    ``freeze(at)`` pins it (at the server's time if ``at`` is None);
    ``advance(seconds=..., minutes=...)`` moves it on; ``release()`` gives the
    server's clock back. As a context manager (``with TaskClock(at=...)``) it
    freezes on entry and releases on exit.
    """

    def __init__(self, using: str = "default", *, at: dt.datetime | None = None) -> None:
        self.using = using
        self._at: dt.datetime | None = None
        #: Where a ``with TaskClock(...)`` block freezes it (None: the server's time).
        self.start_at = at

    @property
    def frozen(self) -> bool:
        return self._at is not None

    def now(self) -> dt.datetime:
        """The database's now as the queue sees it: the pinned instant, or the server's."""
        if self._at is not None:
            return self._at
        return database_now(self.using)

    def freeze(self, at: dt.datetime | None = None) -> dt.datetime:
        """Pin the clock at ``at`` (an aware datetime), or at the server's time now.

        Cron jobs declared in code (``@periodic``) are synced at that instant,
        so that their next tick counts from it, as a scheduler starting then
        would count it.
        """
        if at is None:
            pin_clock(self.using, None)
            at = database_now(self.using)
        elif at.tzinfo is None or at.utcoffset() is None:
            raise ValueError(
                f"TaskClock.freeze needs an aware datetime, not {at!r}: the database "
                "clock is UTC (datetime.datetime(..., tzinfo=datetime.UTC))."
            )
        self._pin(at)
        sync_declared_jobs(self.using)
        return at

    def advance(
        self, seconds: float = 0, *, minutes: float = 0, hours: float = 0, days: float = 0
    ) -> dt.datetime:
        """Move the clock on (freezing it first, at the server's time, if it is not);
        the new instant."""
        step = dt.timedelta(seconds=seconds, minutes=minutes, hours=hours, days=days)
        if step < dt.timedelta(0):
            raise ValueError(f"TaskClock.advance goes forward only, not by {step}.")
        if self._at is None:
            self.freeze()
        assert self._at is not None
        self._pin(self._at + step)
        return self._at

    def release(self) -> None:
        """The server's clock again."""
        self._at = None
        pin_clock(self.using, None)

    def _pin(self, at: dt.datetime) -> None:
        self._at = at.astimezone(dt.UTC)
        pin_clock(self.using, self._at)

    def __enter__(self) -> TaskClock:
        if self._at is None:
            self.freeze(self.start_at)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        state = self._at.isoformat() if self._at is not None else "the server's clock"
        return f"<TaskClock {self.using!r}: {state}>"
