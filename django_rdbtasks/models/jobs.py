"""Scheduled jobs and the idempotency ledger."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from ..db.functions import DbNow
from ..job_validation import validate_job_fields
from ..states import TaskStatus
from .tasks import Task


class MisfirePolicy(models.TextChoices):
    RUN_ONCE = "run_once", _("Run once for the missed ticks, then continue")
    SKIP = "skip", _("Skip missed ticks; wait for the next one")


class JobQuerySet(models.QuerySet["Job"]):
    def due(self) -> JobQuerySet:
        """Enabled, not retired, and their next tick has come (the database's clock)."""
        return self.filter(enabled=True, retired_at__isnull=True, next_run_at__lte=DbNow())

    def retired(self) -> JobQuerySet:
        """Code jobs no live scheduler declares any more: they never fire."""
        return self.filter(retired_at__isnull=False)


class Job(models.Model):
    """A cron schedule that enqueues a task once per tick, whatever the number of schedulers."""

    name = models.CharField(max_length=200, unique=True)
    task_path = models.CharField(_("task"), max_length=255)
    kwargs = models.JSONField(default=dict, blank=True)
    cron = models.CharField(
        max_length=100, help_text=_("Five fields: minute hour day month weekday.")
    )
    timezone = models.CharField(max_length=64, default="UTC")
    enabled = models.BooleanField(default=True)
    misfire_policy = models.CharField(
        max_length=16, choices=MisfirePolicy.choices, default=MisfirePolicy.RUN_ONCE
    )
    queue_name = models.CharField(
        max_length=100, blank=True, default="", help_text=_("Empty: the task's own queue.")
    )
    priority = models.SmallIntegerField(
        null=True, blank=True, help_text=_("Empty: the task's own priority.")
    )
    next_run_at = models.DateTimeField(null=True, blank=True, db_index=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    #: Bumped by every fire and every edit; a fire is a compare-and-set on it.
    version = models.PositiveBigIntegerField(default=0)
    #: Declared in code (settings or decorator) and synced at worker start.
    from_code = models.BooleanField(default=False, editable=False)
    #: Database time a live scheduler last declared this job in its code.
    last_declared_at = models.DateTimeField(null=True, blank=True, editable=False)
    #: Set once no live scheduler has declared this code job for a while: it
    #: no longer fires, and may be deleted. Cleared if code declares it again.
    retired_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        permissions = [
            ("run_job", _("Can run a job now")),
            ("pause_job", _("Can pause or resume a job")),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        validate_job_fields(
            self.cron, self.timezone, self.task_path, self.queue_name, self.priority
        )


class JobRecord(models.Model):
    """One execution of a Job tick or of a ``once()`` key: the idempotency ledger.

    The unique ``(job_name, key)`` pair is inserted in the same transaction as
    the work it stands for, so the same key can never be done twice.
    """

    job_name = models.CharField(max_length=200)
    key = models.CharField(max_length=255)
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.READY)
    # No constraint in the database (see TaskDependency).
    task = models.ForeignKey(
        Task,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="job_records",
        db_constraint=False,
    )
    scheduled_for = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=DbNow())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration = models.DurationField(null=True, blank=True)
    worker_id = models.CharField(max_length=100, blank=True, default="")
    error = models.TextField(blank=True, default="")

    class Meta:
        verbose_name = _("job record")
        verbose_name_plural = _("job records")
        constraints = [
            models.UniqueConstraint(fields=["job_name", "key"], name="rdbtasks_jobrecord_once"),
        ]
        indexes = [
            models.Index(fields=["job_name", "-created_at"], name="rdbtasks_jobrecord_recent")
        ]

    def __str__(self) -> str:
        return f"{self.job_name} [{self.key}]"
