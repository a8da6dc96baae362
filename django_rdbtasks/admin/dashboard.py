"""The dashboard: queue depth, lag, throughput over an hour, a day or a week, workers, jobs."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from .. import snapshots
from ..cleanup import CleanupReport, shown_tables
from ..models import Job, JobRecord, Task, TaskStatus, Worker
from .display import breakable, concurrency_text, cron_in_words, duration_text, when_text
from .filters import ListState, visible_queues
from .live import live_settings
from .permissions import access_for, filter_jobs
from .queues import can_pause
from .utils import admin_url, page_context

#: The chart's windows; each is also a "finished" filter of the task list.
RANGES = {
    "1h": (dt.timedelta(hours=1), _("last hour"), dt.timedelta(minutes=10), "%H:%M"),
    "24h": (dt.timedelta(days=1), _("last 24 hours"), dt.timedelta(hours=3), "%H:%M"),
    "7d": (dt.timedelta(days=7), _("last 7 days"), dt.timedelta(days=1), "%a %d"),
}
DEFAULT_RANGE = "1h"


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    width: float
    segments: tuple[tuple[str, float, float], ...]  # (css class, y, height)
    title: str


@dataclass(frozen=True, slots=True)
class Chart:
    """Finished tasks per bucket of time as stacked SVG bars; the template draws them."""

    width: int
    height: int
    left: int
    bottom: int
    top: int
    bars: tuple[Bar, ...]
    y_ticks: tuple[tuple[float, int], ...]  # (y, value)
    x_ticks: tuple[tuple[float, str], ...]  # (x, label)
    peak: int
    total_succeeded: int
    total_failed: int
    total_cancelled: int

    @property
    def plot_height(self) -> int:
        return self.bottom - self.top

    @classmethod
    def build(
        cls,
        series: snapshots.Throughput,
        width: int = 760,
        height: int = 200,
        tick_every: dt.timedelta = dt.timedelta(minutes=10),
        tick_format: str = "%H:%M",
    ) -> Chart:
        left, right, top, bottom = 44, 8, 10, 24
        plot_w, plot_h = width - left - right, height - top - bottom
        step_value = nice_step(series.peak)
        top_value = step_value * max(1, math.ceil(series.peak / step_value))
        step = plot_w / max(1, len(series.starts))
        scale = plot_h / top_value
        bars = []
        for i, start in enumerate(series.starts):
            counts = (
                ("ok", series.succeeded[i]),
                ("failed", series.failed[i]),
                ("cancelled", series.cancelled[i]),
            )
            y = float(top + plot_h)
            segments = []
            for css, value in counts:
                if value:
                    y -= value * scale
                    segments.append((css, round(y, 2), round(value * scale, 2)))
            title = (
                f"{when_text(start)}: {series.succeeded[i]} succeeded, {series.failed[i]} failed, "
                f"{series.cancelled[i]} cancelled"
            )
            x = round(left + i * step + step * 0.1, 2)
            bars.append(Bar(x, round(max(step * 0.8, 0.5), 2), tuple(segments), title))
        y_ticks = tuple(
            (round(top + plot_h - v * scale, 2), v) for v in range(0, top_value + 1, step_value)
        )
        epoch = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
        x_ticks = tuple(
            (round(left + i * step, 2), timezone.localtime(start).strftime(tick_format))
            for i, start in enumerate(series.starts)
            if (start - epoch) % tick_every == dt.timedelta(0)
        )
        return cls(
            width=width,
            height=height,
            left=left,
            bottom=top + plot_h,
            top=top,
            bars=tuple(bars),
            y_ticks=y_ticks,
            x_ticks=x_ticks,
            peak=series.peak,
            total_succeeded=sum(series.succeeded),
            total_failed=sum(series.failed),
            total_cancelled=sum(series.cancelled),
        )


def nice_step(peak: int, intervals: int = 4) -> int:
    """A round grid step (1, 2 or 5 times a power of ten) covering ``peak`` in ``intervals``."""
    raw = max(1.0, peak / intervals)
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if factor * magnitude >= raw:
            return int(factor * magnitude)
    return int(10 * magnitude)


def tasks_url(queue: str | None = None, **query: str) -> str:
    if queue:
        query["queue"] = queue
    return admin_url(Task, "changelist", query=query)


def queue_rows(snap: snapshots.Snapshot, range_key: str) -> list[dict[str, Any]]:
    """One row per queue and a total, each count with the link to its filtered list."""
    rows = []
    for name, stats in [*snap.queues.items(), (None, snap.total)]:
        # (css, count, link, label): the label heads the column, or the cell on a phone.
        cells: list[tuple[str, int, str, Any]] = [
            ("ready", stats.ready, tasks_url(name, status=TaskStatus.READY), _("Ready")),
            (
                "scheduled",
                stats.scheduled,
                tasks_url(name, status=ListState.SCHEDULED),
                _("Scheduled"),
            ),
            ("waiting", stats.waiting, tasks_url(name, status=TaskStatus.WAITING), _("Waiting")),
            ("running", stats.running, tasks_url(name, status=TaskStatus.RUNNING), _("Running")),
            ("stalled", stats.stalled, tasks_url(name, status=ListState.STALLED), _("Stalled")),
        ]
        cells += [
            (
                css,
                count,
                tasks_url(name, status=status, finished=range_key),
                f"{label} ({range_key})",
            )
            for css, count, status, label in (
                ("successful", stats.succeeded, TaskStatus.SUCCESSFUL, _("Succeeded")),
                ("failed", stats.failed, TaskStatus.FAILED, _("Failed")),
                ("cancelled", stats.cancelled, TaskStatus.CANCELLED, _("Cancelled")),
            )
        ]
        paused = stats.paused_since
        rows.append(
            {
                "name": name,
                "cells": cells,
                "lag_text": duration_text(stats.lag(snap.now)),
                "link": tasks_url(name),
                "paused_text": (
                    duration_text((snap.now - paused).total_seconds()) if paused else ""
                ),
                "pause_url": admin_url(Task, "queue", name, "resume" if paused else "pause"),
            }
        )
    return rows


def card_links(range_key: str) -> dict[str, str]:
    return {
        "ready": tasks_url(status=TaskStatus.READY),
        "running": tasks_url(status=TaskStatus.RUNNING),
        "succeeded": tasks_url(status=TaskStatus.SUCCESSFUL, finished=range_key),
        "failed": tasks_url(status=TaskStatus.FAILED, finished=range_key),
        "tasks": admin_url(Task, "changelist"),
        "workers": admin_url(Worker, "changelist", query={"state": "alive"}),
        "all_workers": admin_url(Worker, "changelist"),
        "jobs": admin_url(Job, "changelist"),
        "records": admin_url(JobRecord, "changelist"),
        "retry_failed": admin_url(Task, "retry_failed"),
    }


def upcoming_jobs(request: HttpRequest, using: str, limit: int = 5) -> list[dict[str, Any]]:
    jobs = Job.objects.using(using).filter(
        enabled=True, retired_at__isnull=True, next_run_at__isnull=False
    )
    jobs = filter_jobs(jobs, access_for(request.user)).order_by("next_run_at")[:limit]
    return [
        {
            "name": job.name,
            "url": admin_url(Job, "change", job.pk),
            "words": cron_in_words(job.cron),
            "next_run": when_text(job.next_run_at),
        }
        for job in jobs
    ]


def running_url(worker: Worker) -> str:
    query = {"status": TaskStatus.RUNNING, "worker_id__startswith": f"{worker.name}:"}
    return admin_url(Task, "changelist", query=query)


def worker_row(worker: Worker) -> dict[str, Any]:
    return {
        "name": worker.name,
        "name_html": breakable(worker.name),
        "url": admin_url(Worker, "change", worker.pk),
        "concurrency": concurrency_text(worker.mode, worker.threads, worker.batch),
        "queues": worker.queues,
        "running": worker.running,
        "running_url": running_url(worker),
        "done": worker.done,
        "failed": worker.failed,
    }


def replica_lag_text(snap: snapshots.Snapshot) -> Any:
    """What the dashboard says of the replica it read, or nothing when it read the primary."""
    if not snap.off_primary:
        return ""
    lag = snap.replica_lag
    behind = _("unknown") if lag is None else "0 s" if lag == 0 else duration_text(lag)
    return _("Read from the replica %(alias)s, behind the primary by %(lag)s.") % {
        "alias": snap.read_from,
        "lag": behind,
    }


#: Seconds an open transaction may hold back the cleanup before the dashboard
#: marks it, unless RDBTASKS_HEALTH["MAX_XMIN_AGE"] says otherwise.
DEFAULT_XMIN_ALERT = 300.0


def cleanup_section(report: CleanupReport | None) -> dict[str, Any] | None:
    """What holds back the cleanup of the tables (cleanup.py), as the dashboard shows it."""
    if report is None or not report.supported:
        return None
    limit = snapshots.health_limits().get("MAX_XMIN_AGE", DEFAULT_XMIN_ALERT)
    oldest = report.oldest_age
    return {
        "oldest_text": duration_text(oldest) if oldest is not None else _("none open"),
        "alert": oldest is not None and oldest > limit,
        "limit_text": duration_text(limit),
        "xid_age": report.oldest_xid_age,
        "open_transactions": report.open_transactions,
        "history_length": report.history_length,
        "holders": [
            {
                "kind": holder.kind,
                "name": holder.name,
                "age_text": duration_text(holder.age),
                "alert": holder.age is None or holder.age > limit,
                "xid_age": holder.xid_age,
                "state": holder.state,
                "isolation": holder.isolation,
                "application": holder.application,
                "client": holder.client,
                "user": holder.user,
                "query": holder.query,
            }
            for holder in report.holders
        ],
        "tables": [
            {
                "table": table.table,
                "live_rows": table.live_rows,
                "dead_rows": table.dead_rows,
                "last_vacuum": when_text(table.last_vacuum),
                "last_autovacuum": when_text(table.last_autovacuum),
            }
            for table in shown_tables(report)
        ],
        "problems": [*report.notes, *report.problems],
    }


def dashboard_view(model_admin: Any, request: HttpRequest) -> TemplateResponse:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    range_key = request.GET.get("range", DEFAULT_RANGE)
    if range_key not in RANGES:
        range_key = DEFAULT_RANGE
    window, window_label, tick_every, tick_format = RANGES[range_key]
    access = access_for(request.user)
    using = snapshots.default_database()
    queues = None if access.unrestricted else visible_queues(request)
    # Off the primary when the backend has a READ_DATABASE: the page only reads.
    # What holds back the cleanup shows other sessions' queries: to those who
    # see every queue only.
    snap = snapshots.snapshot(
        using, window=window, queues=queues, replica=True, cleanup=access.unrestricted
    )
    crumbs = [("", _("Dashboard"))]
    context = {
        **page_context(model_admin, request, _("Task queue"), crumbs),
        "snap": snap,
        "as_of": when_text(snap.now),
        "lag_text": duration_text(snap.lag) if snap.lag is not None else _("none waiting"),
        "rows": queue_rows(snap, range_key),
        "chart": Chart.build(snap.throughput, tick_every=tick_every, tick_format=tick_format),
        "ranges": [(key, label) for key, (_w, label, _t, _f) in RANGES.items()],
        "range_key": range_key,
        "window_label": window_label,
        "workers": [worker_row(w) for w in snap.workers],
        "jobs": upcoming_jobs(request, snap.read_from),
        "replica_lag_text": replica_lag_text(snap),
        "links": card_links(range_key),
        "live": live_settings(request, "#rdbtasks-live-region"),
        "can_retry": model_admin.has_retry_permission(request),
        "can_pause": can_pause(request),
        "show_rows": access.unrestricted,
        "cleanup": cleanup_section(snap.cleanup),
    }
    return TemplateResponse(request, "django_rdbtasks/admin/dashboard.html", context)


class DashboardAdmin(admin.ModelAdmin):
    """The dashboard's entry in the app list: its "list" is the dashboard itself."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_rdbtasks.view_task")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_rdbtasks.view_task")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list:
        # Only the entry: the proxy's change pages would show tasks unguarded.
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        view = self.admin_site.admin_view(self.changelist_view)
        return [path("", view, name=f"{info}_changelist")]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return HttpResponseRedirect(admin_url(Task, "dashboard"))
