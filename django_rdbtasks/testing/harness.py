"""Everything ``django_rdbtasks.testing`` offers, for one task backend (the pytest fixture)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from .capture import (
    Enqueued,
    assert_enqueued,
    assert_not_enqueued,
    captured_tasks,
    enqueued_tasks,
)
from .clock import TaskClock
from .runner import DrainReport, drain, rdb_backend, tick_jobs


class Harness:
    """Drain, move the clock, and assert what was enqueued, on one backend.

    What the ``rdbtasks`` pytest fixture gives; in a ``TestCase``, make one in
    ``setUp`` and ``close()`` it in a cleanup (``addCleanup(harness.close)``).
    """

    def __init__(self, backend: str = "default") -> None:
        self.backend = backend
        self.database = rdb_backend(backend).database
        self.clock = TaskClock(self.database)

    #: ``with rdbtasks.captured_tasks() as captured: ...``
    captured_tasks = staticmethod(captured_tasks)

    def drain(
        self,
        queue: str | None = None,
        *,
        queues: Sequence[str] | None = None,
        until_idle: bool = True,
        raise_errors: bool = False,
        jobs: bool = False,
        max_tasks: int = 10_000,
    ) -> DrainReport:
        return drain(
            queue,
            queues=queues,
            backend=self.backend,
            until_idle=until_idle,
            raise_errors=raise_errors,
            jobs=jobs,
            max_tasks=max_tasks,
        )

    run_tasks = drain

    def tick_jobs(self) -> int:
        return tick_jobs(self.database)

    def freeze(self, at: dt.datetime | None = None) -> dt.datetime:
        return self.clock.freeze(at)

    def advance(
        self, seconds: float = 0, *, minutes: float = 0, hours: float = 0, days: float = 0
    ) -> dt.datetime:
        return self.clock.advance(seconds, minutes=minutes, hours=hours, days=days)

    def now(self) -> dt.datetime:
        return self.clock.now()

    def enqueued(self, task: Any = None) -> list[Enqueued]:
        return enqueued_tasks(task, backend=self.backend)

    def assert_enqueued(
        self,
        task: Any,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        count: int | None = None,
        queue: str | None = None,
    ) -> list[Enqueued]:
        return assert_enqueued(task, args, kwargs, count=count, queue=queue, backend=self.backend)

    def assert_not_enqueued(
        self,
        task: Any,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        queue: str | None = None,
    ) -> None:
        assert_not_enqueued(task, args, kwargs, queue=queue, backend=self.backend)

    def close(self) -> None:
        """Give the database its own clock back."""
        self.clock.release()
