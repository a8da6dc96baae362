from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from .compat import TaskResultStatus
from .db.functions import DbNow


def uuid7() -> uuid.UUID:
    """A time-ordered UUID (RFC 9562 version 7).

    New rows land at the right edge of the primary key index instead of on a
    random page, which keeps inserts cheap on a table of millions of rows.
    """
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10))
    value = (millis & (2**48 - 1)) << 80 | 0x7 << 76 | (rand >> 68) << 64
    value |= 0b10 << 62 | rand & (2**62 - 1)
    return uuid.UUID(int=value)


class StatusIndex(models.Index):
    """A partial index where the database has them, else a leading ``status`` column.

    PostgreSQL and SQLite index only the rows in the given status; MySQL and
    MariaDB have no partial indexes, so there the same index is prefixed with
    ``status`` and the equality on it finds the same range.
    """

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if self.condition is None or schema_editor.connection.features.supports_partial_indexes:
            return super().create_sql(model, schema_editor, using=using, **kwargs)
        plain = models.Index(fields=["status", *self.fields], name=self.name)
        return plain.create_sql(model, schema_editor, using=using, **kwargs)


class TaskQuerySet(models.QuerySet["Task"]):
    def ready(self) -> TaskQuerySet:
        return self.filter(status=TaskResultStatus.READY)

    def runnable(self) -> TaskQuerySet:
        """READY and due by the database clock."""
        return self.filter(status=TaskResultStatus.READY, run_after__lte=DbNow())

    def expired(self) -> TaskQuerySet:
        """RUNNING, but the holder's lease has run out: anyone may claim it."""
        return self.filter(status=TaskResultStatus.RUNNING, lease_expires_at__lte=DbNow())

    def claimable(self) -> TaskQuerySet:
        return self.filter(
            Q(status=TaskResultStatus.READY, run_after__lte=DbNow())
            | Q(status=TaskResultStatus.RUNNING, lease_expires_at__lte=DbNow())
        )

    def in_queues(self, queue_names: Iterable[str]) -> TaskQuerySet:
        return self.filter(queue_name__in=list(queue_names))

    def held_by(self, worker_id: str) -> TaskQuerySet:
        return self.filter(status=TaskResultStatus.RUNNING, worker_id=worker_id)

    def finished(self) -> TaskQuerySet:
        return self.filter(status__in=[TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED])


class Task(models.Model):
    """One enqueued task: its arguments, its claim and lease, and its outcome."""

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    task_path = models.CharField(_("task"), max_length=255)
    queue_name = models.CharField(_("queue"), max_length=100, default="default")
    backend_name = models.CharField(_("backend"), max_length=100, default="default")
    priority = models.SmallIntegerField(default=0)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)

    status = models.CharField(
        max_length=16, choices=TaskResultStatus.choices, default=TaskResultStatus.READY
    )
    #: Bumped by every change of state; a claim and every later write of its
    #: holder are conditional on it (optimistic locking and fencing).
    version = models.PositiveBigIntegerField(default=0)
    worker_id = models.CharField(_("worker"), max_length=100, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=1)

    enqueued_at = models.DateTimeField(db_default=DbNow())
    run_after = models.DateTimeField(db_default=DbNow())
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    return_value = models.JSONField(null=True, blank=True)
    #: One entry per finished attempt: worker, start, end, outcome and error.
    history = models.JSONField(default=list, blank=True)

    objects = TaskQuerySet.as_manager()

    class Meta:
        verbose_name = _("task")
        verbose_name_plural = _("tasks")
        indexes = [
            StatusIndex(
                fields=["queue_name", "-priority", "run_after"],
                condition=Q(status="READY"),
                name="rdbtasks_task_ready",
            ),
            StatusIndex(
                fields=["lease_expires_at"],
                condition=Q(status="RUNNING"),
                name="rdbtasks_task_lease",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} ({self.id})"

    @property
    def worker_ids(self) -> list[str]:
        ids = [entry.get("worker_id", "") for entry in self.history]
        if self.status == TaskResultStatus.RUNNING:
            ids.append(self.worker_id)
        return ids

    @property
    def errors(self) -> list[dict]:
        return [entry for entry in self.history if entry.get("exception_class_path")]
