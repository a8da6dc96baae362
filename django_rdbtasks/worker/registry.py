"""The worker registry: one row per worker process, as it last reported itself."""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, transaction

from ..db.functions import DbNow

logger = logging.getLogger("django_rdbtasks.worker")


class Registry:
    def __init__(self, alias: str, name: str) -> None:
        self.alias = alias
        self.name = name

    def _rows(self) -> Any:
        from ..models import Worker as WorkerRow

        return WorkerRow.objects.using(self.alias)

    def register(self, **fields: Any) -> bool:
        rows = self._rows()
        # Rows of workers gone for a day are history nobody reads.
        rows.filter(last_heartbeat_at__lt=DbNow() - timedelta(days=1)).delete()
        fields.update(
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=DbNow(),
            last_heartbeat_at=DbNow(),
            stopped_at=None,
            running=0,
            done=0,
            failed=0,
        )
        # Update, else insert: no read-then-write transaction (which SQLite
        # cannot upgrade while another process writes).
        if not rows.filter(name=self.name).update(**fields):
            try:
                with transaction.atomic(using=self.alias):
                    rows.create(name=self.name, **fields)
            except IntegrityError:
                rows.filter(name=self.name).update(**fields)
        return True

    def alive(self, *, running: int, done: int, failed: int) -> None:
        try:
            self._rows().filter(name=self.name).update(
                last_heartbeat_at=DbNow(), running=running, done=done, failed=failed
            )
        except DatabaseError as exc:
            logger.warning("could not update the worker registry (%s)", exc)

    def deregister(self, *, done: int, failed: int) -> None:
        self._rows().filter(name=self.name).update(
            stopped_at=DbNow(), last_heartbeat_at=DbNow(), running=0, done=done, failed=failed
        )
