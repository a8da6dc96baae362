"""List filters that never scan a big table for their choices.

Queues come from ``TASKS`` and the jobs, task paths from the newest rows and
the jobs; none runs ``DISTINCT`` over the task table.
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any, cast

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from .. import snapshots
from ..db.functions import DbNow
from ..models import Job, JobRecord, TaskQuerySet, TaskStatus, Worker, task_path_in
from .permissions import access_for, filter_jobs
from .reading import admin_database
from .utils import request_now

#: How many of the newest rows the "task" and "job" filters look at for their choices.
SAMPLE = 2000


class ListState(enum.StrEnum):
    """States of the task list that are not statuses of their own, but read with the clock."""

    #: RUNNING, but its lease lapsed: the worker is gone and the task claimable.
    STALLED = "STALLED"
    #: READY, but not due yet (deferred, or backing off before a retry).
    SCHEDULED = "SCHEDULED"


AGES = {
    "1h": dt.timedelta(hours=1),
    "24h": dt.timedelta(days=1),
    "7d": dt.timedelta(days=7),
    "30d": dt.timedelta(days=30),
}
AGE_LABELS = {
    "1h": _("Last hour"),
    "24h": _("Last 24 hours"),
    "7d": _("Last 7 days"),
    "30d": _("Last 30 days"),
}
OLDER = "older"


class StatusFilter(admin.SimpleListFilter):
    title = _("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            *TaskStatus.choices,
            (ListState.STALLED, _("Stalled (worker lost, lease lapsed)")),
            (ListState.SCHEDULED, _("Scheduled (ready later)")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == ListState.STALLED:
            # This filter serves the Task admin: its queryset is Task's own.
            return cast(TaskQuerySet, queryset).expired()
        if value == ListState.SCHEDULED:
            return cast(TaskQuerySet, queryset).ready().filter(run_after__gt=DbNow())
        if value == TaskStatus.READY:
            # Read off the READY rows' partial indexes, not the whole table.
            return cast(TaskQuerySet, queryset).ready()
        if value in TaskStatus.values:
            return queryset.filter(status=value)
        return queryset


def visible_queues(request: HttpRequest) -> list[str]:
    """The queues of ``TASKS`` and of the jobs that this user may see."""
    names = set(snapshots.configured_queues(snapshots.default_database()))
    jobs = Job.objects.using(admin_database(request, Job))
    names.update(jobs.exclude(queue_name="").values_list("queue_name", flat=True))
    return sorted(access_for(request.user).narrow(names))


class QueueFilter(admin.SimpleListFilter):
    title = _("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = set(visible_queues(request))
        value = self.value()
        if value:
            names.add(value)
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(queue_name=self.value()) if self.value() else queryset


class TaskPathFilter(admin.SimpleListFilter):
    """The tasks of the newest rows and of the jobs: a sample, never a scan."""

    title = _("task")
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        newest = model_admin.get_queryset(request).order_by("-pk")
        paths = set(newest.values_list("task_path", flat=True)[:SAMPLE])
        jobs = filter_jobs(
            Job.objects.using(admin_database(request, Job)), access_for(request.user)
        )
        paths.update(jobs.values_list("task_path", flat=True))
        value = self.value()
        if value:
            paths.add(value)
        return [(p, p) for p in sorted(paths)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        return queryset.filter(task_path_in([value])) if value else queryset


class EnqueuedFilter(admin.SimpleListFilter):
    """By enqueue time, through the primary key: task ids are time-ordered UUIDv7."""

    title = _("enqueued")
    parameter_name = "enqueued"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [*AGE_LABELS.items(), (OLDER, _("Older than 30 days"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value not in AGES and value != OLDER:
            return queryset
        now = request_now(request, queryset.db)
        if value == OLDER:
            return queryset.filter(pk__lt=snapshots.uuid7_floor(now - AGES["30d"]))
        return queryset.filter(pk__gte=snapshots.uuid7_floor(now - AGES[value]))


class FinishedFilter(admin.SimpleListFilter):
    title = _("finished")
    parameter_name = "finished"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [*AGE_LABELS.items(), (OLDER, _("Older than 30 days")), ("no", _("Not yet"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == "no":
            return cast(TaskQuerySet, queryset).unfinished()
        if value not in AGES and value != OLDER:
            return queryset
        now = request_now(request, queryset.db)
        if value == OLDER:
            return queryset.filter(finished_at__lt=now - AGES["30d"])
        return queryset.filter(finished_at__gte=now - AGES[value])


# -- jobs and their records ------------------------------------------------------------------


class JobLifeFilter(admin.SimpleListFilter):
    """Jobs declared in code that no live scheduler declares any more are retired."""

    title = _("declared")
    parameter_name = "declared"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            ("code", _("In code, live")),
            ("retired", _("In code, retired")),
            ("admin", _("In the admin")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == "code":
            return queryset.filter(from_code=True, retired_at__isnull=True)
        if value == "retired":
            return queryset.filter(from_code=True, retired_at__isnull=False)
        if value == "admin":
            return queryset.filter(from_code=False)
        return queryset


class JobNameFilter(admin.SimpleListFilter):
    title = _("job")
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        jobs = filter_jobs(
            Job.objects.using(admin_database(request, Job)), access_for(request.user)
        )
        names = set(jobs.values_list("name", flat=True))
        recent = model_admin.get_queryset(request).order_by("-pk")
        names.update(recent.values_list("job_name", flat=True)[:SAMPLE])
        value = self.value()
        if value:
            names.add(value)
        return [(n, n) for n in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(job_name=self.value()) if self.value() else queryset


class RecordStatusFilter(admin.SimpleListFilter):
    title = _("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return list(TaskStatus.choices)

    def queryset(self, request: HttpRequest, queryset: QuerySet[JobRecord]) -> QuerySet:
        return queryset.filter(status=self.value()) if self.value() else queryset


# -- workers ------------------------------------------------------------------------------


class WorkerState(enum.StrEnum):
    ALIVE = "alive"
    STOPPED = "stopped"
    GONE = "gone"


class WorkerStateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [
            (WorkerState.ALIVE, _("Alive")),
            (WorkerState.STOPPED, _("Stopped")),
            (WorkerState.GONE, _("Gone (no heartbeat)")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        alive = Worker.objects.alive(snapshots.ALIVE_WITHIN)
        if self.value() == WorkerState.ALIVE:
            return queryset.filter(pk__in=alive.values("pk"))
        if self.value() == WorkerState.STOPPED:
            return queryset.filter(stopped_at__isnull=False)
        if self.value() == WorkerState.GONE:
            return queryset.filter(stopped_at__isnull=True).exclude(pk__in=alive.values("pk"))
        return queryset
