"""The scheduler process: fires due Jobs. Every host may run one; the CAS on each
job's version makes sure each tick fires once.

It also keeps the declarations of code jobs alive: every ``DECLARE_EVERY``
seconds it marks the jobs its code declares, and retires the code jobs that no
live scheduler has declared for ``RDBTASKS_RETIRE_AFTER`` seconds. During a
rolling deploy old and new schedulers declare different sets; a job stays live
as long as any of them declares it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Mapping
from typing import Any

from django.db import connections

from ..conf import DECLARE_EVERY, RETENTION, project_settings
from ..index_rebuild import IndexRebuilder
from ..jobs import (
    JobSpec,
    fire_due_jobs,
    redeclare_jobs,
    retire_undeclared_jobs,
    sync_declared_jobs,
)
from ..retrying import retry_database
from .connection import bound_user_connections
from .processtree import ParentWatch

logger = logging.getLogger("django_rdbtasks.scheduler")

#: How often a scheduler applies RDBTASKS_RETENTION (a lock lets one host do it):
#: a call with nothing to delete is a handful of statements.
RETENTION_EVERY = 60.0
#: Seconds one application may take, during which the scheduler fires no job.
#: One that ends with rows left goes on at the next round, after the due jobs:
#: at thousands of tasks a second a minute's finished rows take longer than
#: this to delete, and waiting a full period each time the table only grew.
RETENTION_BUDGET = 10.0
#: What the scheduler's connections' TCP bounds derive from (a worker's
#: default lease): a server cut off silently fails a call in seconds.
CONNECTION_BOUNDS_LEASE = 30.0


class Scheduler:
    """Fires due jobs every ``interval`` seconds (at once again after a busy round).

    ``jobs`` are the jobs this scheduler declares (default: the code's, read
    from ``RDBTASKS_JOBS`` and ``@periodic`` at each declaration).
    """

    def __init__(
        self,
        *,
        database: str = "default",
        interval: float = 1.0,
        jobs: Mapping[str, JobSpec] | None = None,
        declare_every: float = DECLARE_EVERY,
        supervisor_pid: int | None = None,
        retention_every: float = RETENTION_EVERY,
        retention_budget: float = RETENTION_BUDGET,
    ) -> None:
        self.database = database
        self.retention_every = retention_every
        self.retention_budget = retention_budget
        self.interval = interval
        self.jobs = jobs
        self.declare_every = declare_every
        self.stopping = threading.Event()
        self.parent = ParentWatch(supervisor_pid)
        self._signalled = False
        self._synced = False
        self._next_declaration = time.monotonic()
        self._next_retention = time.monotonic()
        self.indexes = IndexRebuilder(database)

    def run(self, *, install_signals: bool = True) -> int:
        if install_signals and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        bound_user_connections(CONNECTION_BOUNDS_LEASE)
        logger.info("scheduler started")
        try:
            while not self._should_stop():
                fired = retry_database(
                    self.step,
                    "scheduling",
                    alias=self.database,
                    stop=self.stopping,
                    give_up=self._should_stop,
                    log=logger,
                )
                if fired is None:
                    break  # stopped while the database was away
                if not fired:
                    self._idle(self.interval)
        finally:
            connections.close_all()
        logger.info("scheduler stopped")
        return 0

    def step(self) -> int:
        """One round: declare (when due), fire what is due, apply retention (when due).

        Returns how many ticks it fired. A database error propagates; the
        next call redoes whatever did not complete.
        """
        if time.monotonic() >= self._next_declaration:
            self.declare()
            self._next_declaration = time.monotonic() + self.declare_every
        fired = fire_due_jobs(using=self.database)
        if time.monotonic() >= self._next_retention:
            # Set first: a failing prune waits for its next turn rather than
            # being retried every round.
            self._next_retention = time.monotonic() + self.retention_every
            if self._apply_retention():
                self._next_retention = time.monotonic()  # rows left: on at the next round
        return fired

    def declare(self) -> None:
        """Declare this scheduler's jobs (a full sync the first time), then retire the
        ones nobody declares. Declaring first: a scheduler back after a long
        outage must not retire its own jobs."""
        if not self._synced:
            sync_declared_jobs(self.database, self.jobs)
            self._synced = True
        else:
            redeclare_jobs(self.database, self.jobs)
        retire_undeclared_jobs(self.database)

    def _apply_retention(self) -> bool:
        """Apply RDBTASKS_RETENTION for a while, then move some rows finished in
        place to the finished rows' table (PostgreSQL: finished_rows.py, a
        bounded number each time, whatever is left) and rebuild the task
        table's indexes a held-back cleanup grew (index_rebuild.py); whether
        retention stopped with rows left."""
        from ..finished_rows import move_by_schedule

        incomplete = False
        configured = project_settings()
        # A bad value too: pruning by it raises, as the check (E020) said at start.
        if configured.retention or configured.problems_of(RETENTION):
            from ..retention import prune_by_setting

            result = prune_by_setting(using=self.database, time_budget=self.retention_budget)
            incomplete = result is not None and result.incomplete
        move_by_schedule(self.database)
        self.indexes.step()
        return incomplete

    def stop(self) -> None:
        self.stopping.set()

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only record it: a handler must take no lock (Event.set takes one).
        self._signalled = True

    def _should_stop(self) -> bool:
        if self._signalled or self.parent.orphaned():
            self.stopping.set()
        return self.stopping.is_set()

    def _idle(self, seconds: float) -> None:
        """Wait, looking at signals and the supervisor every 0.1 s."""
        deadline = time.monotonic() + seconds
        while not self._should_stop() and time.monotonic() < deadline:
            self.stopping.wait(min(0.1, max(0.0, deadline - time.monotonic())))
