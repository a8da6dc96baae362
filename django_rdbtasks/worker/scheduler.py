"""The scheduler process: fires due Jobs. Every host may run one; the CAS on each
job's version makes sure each tick fires once."""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from django.db import DatabaseError, connections

from ..jobs import fire_due_jobs, sync_declared_jobs

logger = logging.getLogger("django_rdbtasks.scheduler")

#: How often a scheduler applies RDBTASKS_RETENTION (a lock lets one host do it).
RETENTION_EVERY = 300.0


class Scheduler:
    def __init__(self, *, database: str = "default", interval: float = 1.0) -> None:
        self.database = database
        self.interval = interval
        self.stopping = threading.Event()

    def run(self, *, install_signals: bool = True) -> int:
        if install_signals and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        logger.info("scheduler started")
        synced = False
        delay = self.interval
        next_retention = time.monotonic()
        while not self.stopping.is_set():
            try:
                if not synced:
                    sync_declared_jobs(self.database)
                    synced = True
                fired = fire_due_jobs(using=self.database)
                if time.monotonic() >= next_retention:
                    next_retention = time.monotonic() + RETENTION_EVERY
                    self._apply_retention()
                delay = self.interval
            except DatabaseError as exc:
                logger.warning("scheduler: database error (%s); retrying in %.1fs", exc, delay)
                try:
                    connections[self.database].close()
                except DatabaseError:
                    pass
                fired = 0
                delay = min(delay * 2, 5.0)
            if not fired:
                self.stopping.wait(delay)
        connections.close_all()
        logger.info("scheduler stopped")
        return 0

    def _apply_retention(self) -> None:
        from django.conf import settings

        if not getattr(settings, "RDBTASKS_RETENTION", None):
            return
        from ..retention import prune_by_setting

        prune_by_setting(using=self.database)

    def stop(self) -> None:
        self.stopping.set()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stop()
