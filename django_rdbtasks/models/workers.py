"""The worker registry and leased locks."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..db.functions import DbNow
from ..states import TaskStatus
from .tasks import Task, TaskQuerySet


class WorkerQuerySet(models.QuerySet["Worker"]):
    def alive(self, within: float = 90.0) -> WorkerQuerySet:
        """Heartbeat seen within ``within`` seconds (database clock), not stopped."""
        from datetime import timedelta

        return self.filter(
            stopped_at__isnull=True, last_heartbeat_at__gte=DbNow() - timedelta(seconds=within)
        )


class Worker(models.Model):
    """A running (or recently gone) worker process, as it last reported itself."""

    name = models.CharField(max_length=200, unique=True)  # host:pid, the prefix of its worker ids
    host = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list)
    mode = models.CharField(max_length=20)
    threads = models.PositiveIntegerField(default=1)
    batch = models.PositiveIntegerField(default=1)
    started_at = models.DateTimeField(db_default=DbNow())
    last_heartbeat_at = models.DateTimeField(db_default=DbNow())
    stopped_at = models.DateTimeField(null=True, blank=True)
    running = models.PositiveIntegerField(default=0)
    done = models.PositiveBigIntegerField(default=0)
    failed = models.PositiveBigIntegerField(default=0)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")

    def __str__(self) -> str:
        return self.name

    def tasks(self) -> TaskQuerySet:
        """The tasks this process holds now."""
        # From the database this row was read from (a replica, on the admin's pages).
        tasks = Task.objects.db_manager(self._state.db)
        return tasks.filter(status=TaskStatus.RUNNING, worker_id__startswith=f"{self.name}:")


class Lock(models.Model):
    """A named lease held by one process at a time; ``token`` grows on every takeover."""

    name = models.CharField(max_length=200, primary_key=True)
    holder = models.CharField(max_length=200, blank=True, default="")
    token = models.PositiveBigIntegerField(default=0)
    expires_at = models.DateTimeField(null=True, blank=True)
    acquired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = _("lock")
        verbose_name_plural = _("locks")

    def __str__(self) -> str:
        return self.name
