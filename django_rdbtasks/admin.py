"""The operators' admin: what is stuck, what failed and why, and fixing it without a shell.

Rows are read-only: every change goes through an operator API (requeue,
cancel, run now, pause) guarded by its own permission and logged in the admin
log. Lists stay fast on millions of rows: no COUNT(*) of the table, no
DISTINCT over it for filters, and only indexed columns to sort by.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import django
from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import PAGE_VAR, SEARCH_VAR, ChangeList
from django.core.exceptions import NON_FIELD_ERRORS, PermissionDenied, ValidationError
from django.core.paginator import InvalidPage, Page, Paginator
from django.db import router
from django.db.models import F, OuterRef, Q, QuerySet, Subquery
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone, translation
from django.utils.decorators import method_decorator
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext
from django.views.decorators.http import require_POST

from . import ops
from .db.functions import DbNow
from .jobs import database_now, next_tick, upcoming_ticks
from .models import Job, JobRecord, Task, TaskStatus, Worker

#: Keys whose values are never shown (HTTP task headers, credentials in kwargs).
SECRET_KEY_PATTERN = re.compile(
    r"pass(word|wd)?|secret|token|authori[sz]ation|api[-_]?key|cookie|credential|private[-_]?key",
    re.IGNORECASE,
)
REDACTED = "•••••• (hidden)"
#: JSON longer than this is cut in the page (the row keeps all of it).
JSON_DISPLAY_LIMIT = 100_000
#: How many of the newest rows the "task" filter looks at for its choices.
TASK_FILTER_SAMPLE = 2000

CSS = {"all": ["django_rdbtasks/admin.css"]}


# -- presentation helpers -------------------------------------------------------------


def status_badge(status: str, label: Any = None, title: Any = "") -> SafeString:
    """A coloured label; ``status`` picks the colour (a TaskStatus or a CSS name)."""
    if label is None:
        label = TaskStatus(status).label if status in TaskStatus.values else status.title()
    return format_html(
        '<span class="rdbtasks-badge rdbtasks-{}" title="{}">{}</span>',
        status.lower(),
        title,
        label,
    )


def redact(value: Any) -> Any:
    """A copy of ``value`` with the values of secret-looking keys hidden."""
    if isinstance(value, dict):
        return {
            key: REDACTED if SECRET_KEY_PATTERN.search(str(key)) else redact(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [redact(item) for item in value]
    return value


def pretty_json(value: Any) -> SafeString:
    if value is None:
        return format_html('<span class="rdbtasks-muted">{}</span>', "null")
    text = json.dumps(redact(value), indent=2, ensure_ascii=False, sort_keys=False)
    note = ""
    if len(text) > JSON_DISPLAY_LIMIT:
        note = f"\n… cut at {JSON_DISPLAY_LIMIT:,} of {len(text):,} characters"
        text = text[:JSON_DISPLAY_LIMIT]
    return format_html('<pre class="rdbtasks-json">{}{}</pre>', text, note)


def humanize_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


def parse_when(value: Any) -> dt.datetime | None:
    """History entries store ISO 8601 strings."""
    if not value:
        return None
    try:
        moment = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def request_now(request: HttpRequest, using: str) -> dt.datetime:
    """The database clock, read once per request: ages and durations of a page agree."""
    cache = request.__dict__.setdefault("_rdbtasks_now", {})
    if using not in cache:
        cache[using] = database_now(using)
    return cache[using]


def page_context(
    model_admin: admin.ModelAdmin, request: HttpRequest, title: Any, crumbs: list
) -> dict[str, Any]:
    """The context of an admin page of our own: the site's, plus breadcrumbs."""
    request.current_app = model_admin.admin_site.name
    return {
        **model_admin.admin_site.each_context(request),
        "title": title,
        "opts": model_admin.opts,
        "crumbs": crumbs,
        # Django 6 marks breadcrumbs up as a list; 5.2 as a div.
        "ol_breadcrumbs": django.VERSION >= (6, 0),
    }


def admin_url(model: type, view: str, *args: Any, query: dict | None = None) -> str:
    opts = model._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=args)
    return f"{url}?{urlencode(query)}" if query else url


def short_time(value: dt.datetime | None, now: dt.datetime | None) -> SafeString | str:
    """A list's timestamp: the time alone if today, the full one on hover."""
    if value is None:
        return "—"
    local = timezone.localtime(value)
    today = now is not None and timezone.localtime(now).date() == local.date()
    shown = local.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M")
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        value.isoformat(),
        local.strftime("%Y-%m-%d %H:%M:%S %Z"),
        shown,
    )


def short_worker(worker_id: str) -> str:
    """``host:pid`` of a worker id (``host:pid:slot:random``): the Worker row's name."""
    parts = worker_id.split(":")
    return ":".join(parts[:2]) if len(parts) > 2 else worker_id


#: Operator views change state: POST only, so that no link or prefetch can trigger one.
_post_only = method_decorator(require_POST)


def not_found(model: type, object_id: str) -> Http404:
    return Http404(f"No {model._meta.verbose_name} with id {object_id!r}.")


# -- a changelist that never counts the table ---------------------------------------------


class NoCountPaginator(Paginator):
    """Pages by LIMIT/OFFSET, reading one row more than a page to know if another follows.

    Django's changelist counts the filtered rows for its page links; on a
    table of millions of rows a COUNT(*) with a filter nobody indexed is a
    full scan on every page view. The count this paginator reports is a
    lower bound (the rows up to this page, plus one if more follow): enough
    for "previous/next" links; the admin shows the table's estimate beside.
    """

    def __init__(self, object_list: QuerySet, per_page: int, *, number: int) -> None:
        super().__init__(object_list, per_page)
        self.number = max(1, number)

    @cached_property
    def _rows(self) -> list[Any]:
        bottom = (self.number - 1) * self.per_page
        return list(self.object_list[bottom : bottom + self.per_page + 1])

    @cached_property
    def count(self) -> int:
        return (self.number - 1) * self.per_page + len(self._rows)

    @property
    def has_more(self) -> bool:
        return len(self._rows) > self.per_page

    def page(self, number: Any) -> Page:
        number = self.validate_number(number)
        if number == self.number:
            return self._get_page(self._rows[: self.per_page], number, self)
        return super().page(number)


class NoCountChangeList(ChangeList):
    """A changelist paged by "previous/next" (see ``NoCountPaginator``).

    Django's ``get_results`` reads the whole filtered queryset again when it
    fits on one page; this one reads each page once, whatever it holds.
    """

    def get_results(self, request: HttpRequest) -> None:
        paginator = self.model_admin.get_paginator(request, self.queryset, self.list_per_page)
        try:
            self.result_list = paginator.page(self.page_num).object_list
        except InvalidPage as exc:
            raise IncorrectLookupParameters from exc
        shown = len(self.result_list)
        has_more = getattr(paginator, "has_more", False)
        self.paginator = paginator
        # The actions bar offers "select all N" when the count exceeds the page;
        # there is no count here, so selection is per page; bulk work has its
        # own views (retry all failed) and commands (requeue, prunetasks).
        self.result_count = shown
        self.full_result_count = None
        self.show_full_result_count = False
        self.show_admin_actions = True
        self.can_show_all = False
        self.multi_page = has_more or self.page_num > 1
        self.first_shown = (self.page_num - 1) * self.list_per_page + 1 if shown else 0
        self.last_shown = self.first_shown + shown - 1 if shown else 0
        self.previous_url = (
            self.get_query_string({PAGE_VAR: self.page_num - 1}) if self.page_num > 1 else ""
        )
        self.next_url = self.get_query_string({PAGE_VAR: self.page_num + 1}) if has_more else ""
        self.clear_search_url = self.get_query_string(remove=[SEARCH_VAR, PAGE_VAR])


class FastListMixin:
    """No COUNT(*), no facets, no "show all" on big tables."""

    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_max_show_all = 0
    list_per_page = 50

    change_list_template = "django_rdbtasks/admin/change_list.html"

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return NoCountChangeList

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet,
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Paginator:
        try:
            number = int(request.GET.get(PAGE_VAR, 1))
        except ValueError:
            number = 1
        return NoCountPaginator(queryset, per_page, number=number)


# -- filters ------------------------------------------------------------------------------


class StatusFilter(admin.SimpleListFilter):
    title = _("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            *TaskStatus.choices,
            ("STALLED", _("Stalled (worker lost, lease lapsed)")),
            ("SCHEDULED", _("Scheduled (ready later)")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == "STALLED":
            return queryset.expired()
        if value == "SCHEDULED":
            return queryset.filter(status=TaskStatus.READY, run_after__gt=DbNow())
        if value in TaskStatus.values:
            return queryset.filter(status=value)
        return queryset


class QueueFilter(admin.SimpleListFilter):
    """Queues from the settings and the jobs: no DISTINCT over the task table."""

    title = _("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        using = ops.default_database()
        names = set(ops.configured_queues(using))
        names.update(
            Job.objects.using(using).exclude(queue_name="").values_list("queue_name", flat=True)
        )
        if self.value():
            names.add(self.value())
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(queue_name=self.value()) if self.value() else queryset


class TaskPathFilter(admin.SimpleListFilter):
    """The tasks of the newest rows and of the jobs: a sample, never a scan."""

    title = _("task")
    parameter_name = "task"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = model_admin.model.objects.order_by("-pk").values_list("task_path", flat=True)
        paths = set(recent[:TASK_FILTER_SAMPLE])
        paths.update(Job.objects.values_list("task_path", flat=True))
        if self.value():
            paths.add(self.value())
        return [(p, p) for p in sorted(paths)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(task_path=self.value()) if self.value() else queryset


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


class EnqueuedFilter(admin.SimpleListFilter):
    """By enqueue time, through the primary key: task ids are time-ordered UUIDv7."""

    title = _("enqueued")
    parameter_name = "enqueued"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [*AGE_LABELS.items(), ("older", _("Older than 30 days"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value not in AGES and value != "older":
            return queryset
        now = request_now(request, queryset.db)
        if value == "older":
            return queryset.filter(pk__lt=ops.uuid7_floor(now - AGES["30d"]))
        return queryset.filter(pk__gte=ops.uuid7_floor(now - AGES[value]))


class FinishedFilter(admin.SimpleListFilter):
    title = _("finished")
    parameter_name = "finished"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [*AGE_LABELS.items(), ("older", _("Older than 30 days")), ("no", _("Not yet"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == "no":
            return queryset.filter(finished_at__isnull=True)
        if value not in AGES and value != "older":
            return queryset
        now = request_now(request, queryset.db)
        if value == "older":
            return queryset.filter(finished_at__lt=now - AGES["30d"])
        return queryset.filter(finished_at__gte=now - AGES[value])


# -- tasks -------------------------------------------------------------------------------

#: Big JSON columns a list does not show.
HEAVY_COLUMNS = ("args", "kwargs", "return_value", "history", "checkpoint")


class TaskChangeList(NoCountChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet:
        return super().get_queryset(request, exclude_parameters).defer(*HEAVY_COLUMNS)


def db_now(obj: Any) -> dt.datetime | None:
    """The database clock as read with the row (``get_queryset`` annotates it)."""
    return getattr(obj, "db_now", None)


@admin.register(Task)
class TaskAdmin(FastListMixin, admin.ModelAdmin):
    list_display = (
        "status_display",
        "task_name",
        "queue_name",
        "priority",
        "attempts_display",
        "worker_display",
        "progress_display",
        "enqueued",
        "started",
        "finished",
        "duration_display",
    )
    list_display_links = ("task_name",)
    list_filter = (StatusFilter, QueueFilter, TaskPathFilter, EnqueuedFilter, FinishedFilter)
    # Sorting by anything unindexed would sort the whole (filtered) table.
    sortable_by = ("enqueued", "finished")
    empty_value_display = "—"
    ordering = ("-pk",)
    search_fields = ("task_path",)  # searched by get_search_results below
    search_help_text = _(
        "A task id, a worker (host:pid), a dedup key, a job name, or part of a task path."
    )
    actions = ("retry_tasks", "cancel_tasks")
    change_list_template = "django_rdbtasks/admin/task/change_list.html"
    change_form_template = "django_rdbtasks/admin/task/change_form.html"
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "status_display",
                    "task_path",
                    "id",
                    "queue_name",
                    "priority",
                    "attempts_display",
                    "worker_id",
                    "lease_expires_at",
                    "cancel_requested",
                )
            },
        ),
        (_("Arguments and result"), {"fields": ("args_json", "kwargs_json", "return_json")}),
        (_("Progress"), {"fields": ("progress_display", "progress_message", "checkpoint_json")}),
        (
            _("Times"),
            {
                "fields": (
                    "enqueued_at",
                    "run_after",
                    "started_at",
                    "last_attempted_at",
                    "finished_at",
                    "duration_display",
                )
            },
        ),
        (
            _("Related"),
            {"fields": ("parents_display", "children_display", "job_display", "dedup_key")},
        ),
    )
    # Every field is shown read-only: nobody edits raw rows.
    readonly_fields = tuple(name for _, section in fieldsets for name in section["fields"])

    class Media:
        css = CSS

    # -- permissions: read-only rows, one permission per operator action --

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Finished tasks go with `manage.py prunetasks`; others are cancelled.
        return False

    def has_retry_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_rdbtasks.retry_task")

    def has_cancel_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_rdbtasks.cancel_task")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return TaskChangeList

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Each row carries the database clock, so ages and "stalled" need no
        # extra query and no state on this shared ModelAdmin instance.
        return super().get_queryset(request).annotate(db_now=DbNow())

    # -- search: indexed lookups first --

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet, search_term: str
    ) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(pk=uuid.UUID(term)), False
        except ValueError:
            pass
        # The newest rows are read first (ordering by id); a rare term scans further.
        condition = (
            Q(task_path__icontains=term)
            | Q(worker_id__startswith=term)
            | Q(dedup_key=term)
            | Q(job_name=term)
        )
        return queryset.filter(condition), False

    # -- list columns --

    @admin.display(description=_("status"))
    def status_display(self, obj: Task) -> SafeString:
        now = db_now(obj)
        title = ""
        label = None
        if obj.status == TaskStatus.RUNNING and obj.cancel_requested:
            label, title = _("Cancelling"), _("Cancel requested; the task stops at its next check.")
        elif (
            obj.status == TaskStatus.RUNNING
            and now
            and obj.lease_expires_at
            and obj.lease_expires_at <= now
        ):
            return status_badge(
                "stalled", _("Stalled"), _("Its worker stopped renewing the lease.")
            )
        elif obj.status == TaskStatus.READY and now and obj.run_after and obj.run_after > now:
            label = _("Scheduled")
            title = _("Runs after %(when)s") % {"when": timezone.localtime(obj.run_after)}
        return status_badge(obj.status, label, title)

    @admin.display(description=_("task"))
    def task_name(self, obj: Task) -> SafeString:
        module, _dot, name = obj.task_path.rpartition(".")
        return format_html(
            '<strong title="{}">{}</strong><br><small class="rdbtasks-muted">{}</small>',
            obj.task_path,
            name,
            module,
        )

    @admin.display(description=_("attempts"))
    def attempts_display(self, obj: Task) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description=_("worker"))
    def worker_display(self, obj: Task) -> SafeString | str:
        if not obj.worker_id:
            return "—"
        return format_html(
            '<span class="rdbtasks-worker" title="{}">{}</span>',
            obj.worker_id,
            short_worker(obj.worker_id),
        )

    @admin.display(description=_("progress"))
    def progress_display(self, obj: Task) -> SafeString | str:
        if obj.progress is None:
            return "—" if not obj.progress_message else obj.progress_message
        fraction = min(1.0, max(0.0, obj.progress))
        return format_html(
            '<span class="rdbtasks-progress" title="{}"><progress max="1" value="{}">{}</progress>'
            " {}</span>",
            obj.progress_message,
            f"{fraction:.4f}",
            f"{fraction:.0%}",
            f"{fraction:.0%}",
        )

    @admin.display(description=_("enqueued"), ordering="pk")
    def enqueued(self, obj: Task) -> SafeString | str:
        return short_time(obj.enqueued_at, db_now(obj))

    @admin.display(description=_("started"))
    def started(self, obj: Task) -> SafeString | str:
        return short_time(obj.started_at, db_now(obj))

    @admin.display(description=_("finished"), ordering="finished_at")
    def finished(self, obj: Task) -> SafeString | str:
        return short_time(obj.finished_at, db_now(obj))

    @admin.display(description=_("duration"))
    def duration_display(self, obj: Task) -> str:
        if obj.last_attempted_at is None:
            return "—"
        if obj.finished_at is not None:
            return humanize_seconds((obj.finished_at - obj.last_attempted_at).total_seconds())
        now = db_now(obj)
        if obj.status == TaskStatus.RUNNING and now is not None:
            return f"{humanize_seconds((now - obj.last_attempted_at).total_seconds())} …"
        return "—"

    # -- detail fields --

    @admin.display(description=_("arguments"))
    def args_json(self, obj: Task) -> SafeString:
        return pretty_json(obj.args)

    @admin.display(description=_("keyword arguments"))
    def kwargs_json(self, obj: Task) -> SafeString:
        return pretty_json(obj.kwargs)

    @admin.display(description=_("return value"))
    def return_json(self, obj: Task) -> SafeString:
        return pretty_json(obj.return_value)

    @admin.display(description=_("checkpoint"))
    def checkpoint_json(self, obj: Task) -> SafeString:
        return pretty_json(obj.checkpoint)

    def history_table(self, obj: Task) -> SafeString:
        """Every attempt: shown after the fieldsets, as wide as the page (see change_form)."""
        entries = [_history_row(entry) for entry in obj.history]
        current = None
        if obj.status == TaskStatus.RUNNING:
            current = {
                "attempt": obj.attempts,
                "worker_id": obj.worker_id,
                "started_at": obj.last_attempted_at,
                "lease_expires_at": obj.lease_expires_at,
            }
        return render_to_string(
            "django_rdbtasks/admin/task/history.html",
            {"entries": entries, "current": current, "task": obj},
        )

    @admin.display(description=_("waits for"))
    def parents_display(self, obj: Task) -> SafeString | str:
        return _task_links(obj.parents.order_by("pk").only("pk", "task_path", "status")[:50])

    @admin.display(description=_("then runs"))
    def children_display(self, obj: Task) -> SafeString | str:
        return _task_links(obj.children.order_by("pk").only("pk", "task_path", "status")[:50])

    @admin.display(description=_("job"))
    def job_display(self, obj: Task) -> SafeString | str:
        if not obj.job_name:
            return "—"
        job = Job.objects.filter(name=obj.job_name).only("pk").first()
        records = list(obj.job_records.all()[:5])
        parts = [
            format_html('<a href="{}">{}</a>', admin_url(Job, "change", job.pk), obj.job_name)
            if job
            else format_html("{} <span class='rdbtasks-muted'>(deleted)</span>", obj.job_name)
        ]
        parts += [
            format_html(
                '<a href="{}">record {}</a>', admin_url(JobRecord, "change", record.pk), record.key
            )
            for record in records
        ]
        return mark_safe(" · ".join(parts))  # every part went through format_html

    # -- views --

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> Any:
        extra = {
            "rows": ops.estimated_task_rows(ops.default_database()),
            "can_retry": self.has_retry_permission(request),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> Any:
        task = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if task is not None:
            extra["history"] = self.history_table(task)
            extra.update(
                can_retry=self.has_retry_permission(request) and task.status in ops.REQUEUEABLE,
                can_cancel=self.has_cancel_permission(request)
                and task.status in (TaskStatus.READY, TaskStatus.WAITING, TaskStatus.RUNNING)
                and not task.cancel_requested,
            )
        return super().change_view(request, object_id, form_url, extra)

    def get_urls(self) -> list:
        wrap = self.admin_site.admin_view
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("dashboard/", wrap(self.dashboard_view), name=f"{info}_dashboard"),
            path("retry-failed/", wrap(self.retry_failed_view), name=f"{info}_retry_failed"),
            path("<path:object_id>/retry/", wrap(self.retry_view), name=f"{info}_retry"),
            path("<path:object_id>/cancel/", wrap(self.cancel_view), name=f"{info}_cancel"),
            *super().get_urls(),
        ]

    def dashboard_view(self, request: HttpRequest) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        snap = ops.snapshot(ops.default_database())
        crumbs = [(admin_url(Task, "changelist"), Task._meta.verbose_name_plural.capitalize())]
        crumbs.append(("", _("Dashboard")))
        context = {
            **page_context(self, request, _("Task queue"), crumbs),
            "snap": snap,
            "lag_text": humanize_seconds(snap.lag) if snap.lag is not None else _("none waiting"),
            "rows": _dashboard_rows(snap),
            "chart": Chart.build(snap.throughput),
            "workers": [_worker_row(w) for w in snap.workers],
            "jobs": _upcoming_jobs(snap.using),
            "links": _dashboard_links(),
            "refresh": _refresh_seconds(request),
            "can_retry": self.has_retry_permission(request),
        }
        return TemplateResponse(request, "django_rdbtasks/admin/dashboard.html", context)

    # -- operator actions --

    @admin.action(description=_("Retry / requeue now"), permissions=["retry"])
    def retry_tasks(self, request: HttpRequest, queryset: QuerySet) -> None:
        requeued = ops.requeue_tasks(queryset, on_batch=lambda batch: _log_requeued(request, batch))
        skipped = queryset.count() - requeued
        self.message_user(
            request,
            ngettext("Requeued %d task.", "Requeued %d tasks.", requeued) % requeued,
            messages.SUCCESS if requeued else messages.WARNING,
        )
        if skipped:
            self.message_user(
                request,
                ngettext(
                    "%d task was not requeued: only failed, cancelled or ready tasks can be.",
                    "%d tasks were not requeued: only failed, cancelled or ready tasks can be.",
                    skipped,
                )
                % skipped,
                messages.WARNING,
            )

    @admin.action(description=_("Cancel"), permissions=["cancel"])
    def cancel_tasks(self, request: HttpRequest, queryset: QuerySet) -> None:
        outcomes = {"cancelled": 0, "stopping": 0, "finished": 0}
        for task in queryset.only("pk", "task_path", "status"):
            outcomes[self._cancel(request, task)] += 1
        self._report_cancel(request, outcomes)

    def _cancel(self, request: HttpRequest, task: Task) -> str:
        was = task.status
        now = ops.backend_for_database(task._state.db or "default").cancel(str(task.pk))
        if now == TaskStatus.CANCELLED and was != TaskStatus.CANCELLED:
            self.log_change(request, task, f"Cancelled (was {was}).")
            return "cancelled"
        if now == TaskStatus.RUNNING:
            self.log_change(request, task, "Asked to stop (cancel requested while running).")
            return "stopping"
        return "finished"

    def _report_cancel(self, request: HttpRequest, outcomes: dict[str, int]) -> None:
        if outcomes["cancelled"]:
            n = outcomes["cancelled"]
            self.message_user(request, ngettext("Cancelled %d task.", "Cancelled %d tasks.", n) % n)
        if outcomes["stopping"]:
            n = outcomes["stopping"]
            self.message_user(
                request,
                ngettext(
                    "Asked %d running task to stop; it ends cancelled when it does.",
                    "Asked %d running tasks to stop; they end cancelled when they do.",
                    n,
                )
                % n,
            )
        if outcomes["finished"]:
            n = outcomes["finished"]
            self.message_user(
                request,
                ngettext(
                    "%d task had already finished and was left as it was.",
                    "%d tasks had already finished and were left as they were.",
                    n,
                )
                % n,
                messages.WARNING,
            )

    @_post_only
    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        task = self._object_or_404(request, object_id)
        if not self.has_retry_permission(request, task):
            raise PermissionDenied
        was = task.status
        if ops.backend_for_database(task._state.db).requeue(str(task.pk)):
            self.log_change(request, task, f"Requeued (was {was}).")
            self.message_user(request, _("The task was requeued and runs again shortly."))
        else:
            self.message_user(
                request,
                _("Only failed, cancelled or ready tasks can be requeued; this one is %(s)s.")
                % {"s": Task.objects.filter(pk=task.pk).values_list("status", flat=True).first()},
                messages.WARNING,
            )
        return HttpResponseRedirect(admin_url(Task, "change", task.pk))

    @_post_only
    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        task = self._object_or_404(request, object_id)
        if not self.has_cancel_permission(request, task):
            raise PermissionDenied
        outcomes = {"cancelled": 0, "stopping": 0, "finished": 0}
        outcomes[self._cancel(request, task)] += 1
        self._report_cancel(request, outcomes)
        return HttpResponseRedirect(admin_url(Task, "change", task.pk))

    def retry_failed_view(self, request: HttpRequest) -> HttpResponse:
        """Requeue every FAILED task (of a queue, of a time window) after a confirmation."""
        if not self.has_retry_permission(request):
            raise PermissionDenied
        form = RetryFailedForm(request.POST or request.GET or None)
        form.fields["queue"].choices = [("", _("All queues"))] + [
            (q, q) for q in ops.configured_queues(ops.default_database())
        ]
        selected = form.is_valid()
        failed = _failed_tasks(form.cleaned_data if selected else {}, request)
        if request.method == "POST" and selected and form.cleaned_data.get("confirm"):
            requeued = ops.requeue_tasks(
                failed, on_batch=lambda batch: _log_requeued(request, batch)
            )
            self.message_user(
                request,
                ngettext("Requeued %d failed task.", "Requeued %d failed tasks.", requeued)
                % requeued,
            )
            return HttpResponseRedirect(admin_url(Task, "changelist", query={"status": "READY"}))
        crumbs = [
            (admin_url(Task, "changelist"), Task._meta.verbose_name_plural.capitalize()),
            ("", _("Retry all failed")),
        ]
        context = {
            **page_context(self, request, _("Retry all failed tasks"), crumbs),
            "form": form,
            "count": ops.capped_count(failed),
            "by_task": _failed_by_task(failed),
        }
        return TemplateResponse(
            request, "django_rdbtasks/admin/task/retry_failed_confirmation.html", context
        )

    def _object_or_404(self, request: HttpRequest, object_id: str) -> Task:
        task = self.get_object(request, object_id)
        if task is None:
            raise not_found(Task, object_id)
        return task


# -- retry all failed --------------------------------------------------------------------


class RetryFailedForm(forms.Form):
    queue = forms.ChoiceField(label=_("Queue"), required=False)
    window = forms.ChoiceField(
        label=_("Failed in"),
        required=False,
        choices=[("", _("Any time")), *AGE_LABELS.items()],
    )
    confirm = forms.BooleanField(required=False, widget=forms.HiddenInput)


def _failed_tasks(options: dict, request: HttpRequest) -> QuerySet:
    failed = Task.objects.filter(status=TaskStatus.FAILED)
    if options.get("queue"):
        failed = failed.filter(queue_name=options["queue"])
    if options.get("window") in AGES:
        now = request_now(request, failed.db)
        failed = failed.filter(finished_at__gte=now - AGES[options["window"]])
    return failed


def _failed_by_task(failed: QuerySet, limit: int = 20) -> list[dict[str, Any]]:
    """The most frequent failing tasks among the (at most 10,000) newest failures."""
    sample = list(failed.order_by("-pk").values_list("task_path", "queue_name")[:10_000])
    counts: dict[tuple[str, str], int] = {}
    for key in sample:
        counts[key] = counts.get(key, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: -item[1])[:limit]
    return [{"task_path": t, "queue": q, "count": n} for (t, q), n in ranked]


def _log_requeued(request: HttpRequest, batch: Sequence[ops.Requeued]) -> None:
    """One admin log entry per requeued task, written in bulk."""
    by_message: dict[str, list[Task]] = {}
    for item in batch:
        by_message.setdefault(f"Requeued (was {item.was}).", []).append(
            Task(pk=item.id, task_path=item.task_path)
        )
    for message, tasks in by_message.items():
        LogEntry.objects.log_actions(request.user.pk, tasks, CHANGE, message)


def _history_row(entry: dict[str, Any]) -> dict[str, Any]:
    started = parse_when(entry.get("started_at"))
    finished = parse_when(entry.get("finished_at"))
    duration = (finished - started).total_seconds() if started and finished else None
    lines = [line for line in str(entry.get("traceback") or "").splitlines() if line.strip()]
    message = lines[-1] if lines else ""
    # The last line of a traceback repeats the class: "ValueError: boom" -> "boom".
    for prefix in (str(entry.get("exception_class_path", "")), message.split(":")[0]):
        short = prefix.rpartition(".")[2]
        if short and message.startswith(f"{short}: "):
            message = message[len(short) + 2 :]
            break
    return {
        **entry,
        "started": started,
        "finished": finished,
        "duration": humanize_seconds(duration),
        "outcome_class": str(entry.get("outcome", "")).lower(),
        "message": message[:300],
    }


def _task_links(tasks: Iterable[Task]) -> SafeString | str:
    items = list(tasks)
    if not items:
        return "—"
    return format_html_join(
        mark_safe("<br>"),
        '{} <a href="{}">{}</a>',
        ((status_badge(t.status), admin_url(Task, "change", t.pk), str(t)) for t in items),
    )


# -- the dashboard ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bar:
    x: float
    width: float
    segments: tuple[tuple[str, float, float], ...]  # (css class, y, height)
    title: str


@dataclass(frozen=True, slots=True)
class Chart:
    """Finished tasks per minute as stacked SVG bars, computed here, drawn by the template."""

    width: int
    height: int
    left: int
    bottom: int
    top: int
    bars: tuple[Bar, ...]
    y_ticks: tuple[tuple[float, int], ...]  # (y, value)
    x_ticks: tuple[tuple[float, dt.datetime], ...]
    peak: int
    total_succeeded: int
    total_failed: int
    total_cancelled: int

    @property
    def plot_height(self) -> int:
        return self.bottom - self.top

    @classmethod
    def build(cls, series: ops.Throughput, width: int = 760, height: int = 200) -> Chart:
        left, right, top, bottom = 44, 8, 10, 24
        plot_w, plot_h = width - left - right, height - top - bottom
        step_value = _nice_step(series.peak)
        top_value = step_value * max(1, math.ceil(series.peak / step_value))
        n = max(1, len(series.minutes))
        step = plot_w / n
        scale = plot_h / top_value
        bars = []
        for i, minute in enumerate(series.minutes):
            y = float(top + plot_h)
            segments = []
            values = (
                ("ok", series.succeeded[i]),
                ("failed", series.failed[i]),
                ("cancelled", series.cancelled[i]),
            )
            for css, value in values:
                if value:
                    h = value * scale
                    y -= h
                    segments.append((css, round(y, 2), round(h, 2)))
            local = timezone.localtime(minute)
            title = (
                f"{local:%H:%M}: {series.succeeded[i]} succeeded, {series.failed[i]} failed, "
                f"{series.cancelled[i]} cancelled"
            )
            bars.append(
                Bar(round(left + i * step + 1, 2), round(step - 2, 2), tuple(segments), title)
            )
        y_ticks = tuple(
            (round(top + plot_h - v * scale, 2), v) for v in range(0, top_value + 1, step_value)
        )
        x_ticks = tuple(
            (round(left + i * step + step / 2, 2), minute)
            for i, minute in enumerate(series.minutes)
            if minute.minute % 10 == 0
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


def _nice_step(peak: int, intervals: int = 4) -> int:
    """A round grid step (1, 2 or 5 times a power of ten) covering ``peak`` in ``intervals``."""
    raw = max(1.0, peak / intervals)
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if factor * magnitude >= raw:
            return int(factor * magnitude)
    return int(10 * magnitude)


def _dashboard_links() -> dict[str, str]:
    return {
        "tasks": admin_url(Task, "changelist"),
        "workers": admin_url(Worker, "changelist"),
        "jobs": admin_url(Job, "changelist"),
        "records": admin_url(JobRecord, "changelist"),
        "retry_failed": admin_url(Task, "retry_failed"),
    }


def _dashboard_rows(snap: ops.Snapshot) -> list[dict[str, Any]]:
    """One row per queue and a total, each count with the link to its filtered list."""

    def link(queue: str | None, **query: str) -> str:
        if queue:
            query["queue"] = queue
        return admin_url(Task, "changelist", query=query)

    rows = []
    for name, stats in [*snap.queues.items(), (None, snap.total)]:
        cells = [
            ("ready", stats.ready, link(name, status="READY")),
            ("scheduled", stats.scheduled, link(name, status="SCHEDULED")),
            ("waiting", stats.waiting, link(name, status="WAITING")),
            ("running", stats.running, link(name, status="RUNNING")),
            ("stalled", stats.stalled, link(name, status="STALLED")),
            ("successful", stats.succeeded, link(name, status="SUCCESSFUL", finished="1h")),
            ("failed", stats.failed, link(name, status="FAILED", finished="1h")),
            ("cancelled", stats.cancelled, link(name, status="CANCELLED", finished="1h")),
        ]
        rows.append(
            {
                "name": name,
                "cells": cells,
                "lag": stats.lag(snap.now),
                "lag_text": humanize_seconds(stats.lag(snap.now)),
                "link": link(name),
            }
        )
    return rows


def _upcoming_jobs(using: str, limit: int = 5) -> list[dict[str, Any]]:
    jobs = (
        Job.objects.using(using)
        .filter(enabled=True, next_run_at__isnull=False)
        .order_by("next_run_at")[:limit]
    )
    return [
        {
            "name": job.name,
            "url": admin_url(Job, "change", job.pk),
            "words": cron_in_words(job.cron),
            "next_run_at": job.next_run_at,
        }
        for job in jobs
    ]


def _worker_row(worker: Worker) -> dict[str, Any]:
    return {
        "name": worker.name,
        "url": admin_url(Worker, "change", worker.pk),
        "mode": worker.mode,
        "threads": worker.threads,
        "batch": worker.batch,
        "queues": worker.queues,
        "running": worker.running,
        "running_url": _running_url(worker),
        "done": worker.done,
        "failed": worker.failed,
    }


def _running_url(worker: Worker) -> str:
    query = {"status": "RUNNING", "worker_id__startswith": f"{worker.name}:"}
    return admin_url(Task, "changelist", query=query)


def _refresh_seconds(request: HttpRequest) -> int | None:
    try:
        seconds = int(request.GET.get("refresh", ""))
    except ValueError:
        return None
    return min(max(seconds, 5), 3600)


# -- jobs --------------------------------------------------------------------------------


#: cronsim's shorthands, which cron-descriptor does not read.
CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def cron_in_words(cron: str) -> str:
    """ "At 02:30, Monday through Friday", in the active language where cron-descriptor has it."""
    from cron_descriptor import ExpressionDescriptor, Options

    options = Options()
    options.use_24hour_time_format = True
    # cron-descriptor names locales like de_DE and falls back to English.
    language = translation.to_locale(translation.get_language() or "en-us")
    options.locale_code = language if "_" in language else f"{language}_{language.upper()}"
    expression = CRON_ALIASES.get(cron.strip().lower(), cron)
    try:
        return ExpressionDescriptor(expression, options).get_description()
    except Exception:  # a form cronsim accepts but cron-descriptor does not
        return cron


class JobForm(forms.ModelForm):
    class Meta:
        model = Job
        fields = (
            "name",
            "task_path",
            "kwargs",
            "queue_name",
            "priority",
            "cron",
            "timezone",
            "misfire_policy",
            "enabled",
        )
        help_texts = {
            "task_path": _("Dotted path of a @task function, e.g. myapp.tasks.send_report."),
            "kwargs": _('Keyword arguments as a JSON object, e.g. {"days": 7}.'),
        }

    def clean_kwargs(self) -> Any:
        value = self.cleaned_data.get("kwargs")
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ValidationError(_("Keyword arguments must be a JSON object ({…})."))
        return value

    def _update_errors(self, errors: ValidationError) -> None:
        # Job.clean() checks cron, time zone and task together; when one of them
        # is read-only (a job declared in code) its error must still be shown,
        # not crash the form for naming a field it does not have.
        if hasattr(errors, "error_dict"):
            moved: dict[str, list] = {}
            for name, items in errors.error_dict.items():
                if name in self.fields or name == NON_FIELD_ERRORS:
                    moved.setdefault(name, []).extend(items)
                else:
                    moved.setdefault(NON_FIELD_ERRORS, []).extend(
                        ValidationError(f"{name}: {message}") for item in items for message in item
                    )
            errors = ValidationError(moved)
        super()._update_errors(errors)


class JobRecordInlineDisplay:
    """Recent records of a job, rendered as a table in the job's page.

    JobRecord names its job by ``job_name`` rather than a foreign key, so an
    admin inline (which needs one) cannot show them; this table does.
    """

    @staticmethod
    def render(job: Job, limit: int = 15) -> SafeString:
        records = JobRecord.objects.filter(job_name=job.name).order_by("-created_at")[:limit]
        rows = [
            {
                "record": record,
                "url": admin_url(JobRecord, "change", record.pk),
                "badge": status_badge(record.status),
                "duration": humanize_seconds(
                    record.duration.total_seconds() if record.duration is not None else None
                ),
                "task_url": admin_url(Task, "change", record.task_id) if record.task_id else "",
                "error": (record.error.strip().splitlines() or [""])[-1][:200],
            }
            for record in records
        ]
        return render_to_string(
            "django_rdbtasks/admin/job/records.html",
            {
                "records": rows,
                "all_url": admin_url(JobRecord, "changelist", query={"job": job.name}),
            },
        )


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    empty_value_display = "—"
    form = JobForm
    list_display = (
        "name",
        "task_display",
        "schedule",
        "timezone",
        "state",
        "next_run_at",
        "last_run_at",
        "last_outcome",
        "from_code",
    )
    list_filter = ("enabled", "from_code", "misfire_policy")
    search_fields = ("name", "task_path")
    ordering = ("name",)
    actions = ("run_now", "pause_jobs", "enable_jobs")
    change_form_template = "django_rdbtasks/admin/job/change_form.html"
    change_list_template = "django_rdbtasks/admin/small_change_list.html"
    fieldsets = (
        (None, {"fields": ("name", "task_path", "kwargs", "queue_name", "priority")}),
        (
            _("Schedule"),
            {
                "fields": (
                    "cron",
                    "cron_words",
                    "timezone",
                    "misfire_policy",
                    "enabled",
                    "upcoming",
                    "next_run_at",
                    "last_run_at",
                )
            },
        ),
        (_("Recent runs"), {"fields": ("recent_records",)}),
        (_("Bookkeeping"), {"fields": ("from_code", "version", "created_at", "updated_at")}),
    )
    base_readonly = (
        "cron_words",
        "upcoming",
        "next_run_at",
        "last_run_at",
        "recent_records",
        "from_code",
        "version",
        "created_at",
        "updated_at",
    )
    #: A job declared in code is redefined from the code at every worker start.
    code_owned = ("name", "task_path", "kwargs", "queue_name", "priority", "cron", "timezone")

    class Media:
        css = CSS

    def has_run_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_rdbtasks.run_job")

    def has_pause_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_rdbtasks.pause_job")

    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> Sequence[str]:
        fields = list(self.base_readonly)
        if obj is not None and obj.from_code:
            fields += [*self.code_owned, "misfire_policy"]
        if not self.has_pause_permission(request):
            fields.append("enabled")  # pausing has its own permission
        return fields

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        latest = JobRecord.objects.filter(job_name=OuterRef("name")).order_by("-created_at")
        return (
            super()
            .get_queryset(request)
            .annotate(
                last_status=Subquery(latest.values("status")[:1]),
                last_error=Subquery(latest.values("error")[:1]),
            )
        )

    # -- columns and read-only fields --

    @admin.display(description=_("task"), ordering="task_path")
    def task_display(self, obj: Job) -> SafeString:
        module, _dot, name = obj.task_path.rpartition(".")
        return format_html(
            '<span title="{}"><span class="rdbtasks-muted">{}.</span>{}</span>',
            obj.task_path,
            module,
            name,
        )

    @admin.display(description=_("schedule"), ordering="cron")
    def schedule(self, obj: Job) -> SafeString:
        return format_html("<code>{}</code><br>{}", obj.cron, cron_in_words(obj.cron))

    @admin.display(description=_("in words"))
    def cron_words(self, obj: Job) -> str:
        return cron_in_words(obj.cron) if obj.cron else "—"

    @admin.display(description=_("state"), ordering="enabled")
    def state(self, obj: Job) -> SafeString:
        if obj.enabled:
            return status_badge("successful", _("Active"))
        return status_badge("cancelled", _("Paused"))

    @admin.display(description=_("last run"))
    def last_outcome(self, obj: Job) -> SafeString | str:
        status = getattr(obj, "last_status", None)
        if not status:
            return "—"
        return status_badge(status, title=getattr(obj, "last_error", "") or "")

    @admin.display(description=_("next five runs"))
    def upcoming(self, obj: Job) -> SafeString | str:
        if not obj.pk or not obj.cron:
            return "—"
        try:
            ticks = upcoming_ticks(obj.cron, obj.timezone, database_now(obj._state.db), 5)
        except Exception:  # an invalid schedule shows nothing here
            return "—"
        from zoneinfo import ZoneInfo

        zone = ZoneInfo(obj.timezone)
        return format_html(
            '<ol class="rdbtasks-ticks">{}</ol>',
            format_html_join(
                "",
                "<li>{} <span class='rdbtasks-muted'>({} UTC)</span></li>",
                (
                    (
                        tick.astimezone(zone).strftime(f"%a %Y-%m-%d %H:%M %Z ({obj.timezone})"),
                        tick.strftime("%H:%M"),
                    )
                    for tick in ticks
                ),
            ),
        )

    @admin.display(description=_("records"))
    def recent_records(self, obj: Job) -> SafeString | str:
        return JobRecordInlineDisplay.render(obj) if obj.pk else "—"

    # -- saving: a changed schedule takes effect from its next tick --

    def save_model(
        self, request: HttpRequest, obj: Job, form: forms.ModelForm, change: bool
    ) -> None:
        changed = set(form.changed_data)
        if not change or obj.next_run_at is None or changed & {"cron", "timezone", "enabled"}:
            using = obj._state.db or router.db_for_write(Job)
            obj.next_run_at = next_tick(obj.cron, obj.timezone, database_now(using))
        if change:
            # An edit bumps the version: a scheduler firing from the old row misses its CAS.
            obj.version = F("version") + 1
        super().save_model(request, obj, form, change)
        if change:
            obj.refresh_from_db(fields=["version"])

    # -- operator actions --

    @admin.action(description=_("Run now"), permissions=["run"])
    def run_now(self, request: HttpRequest, queryset: QuerySet) -> None:
        started = [job for job in queryset if self._run_now(request, job)]
        paused = queryset.filter(enabled=False).count()
        if started:
            self.message_user(
                request,
                ngettext(
                    "%d job will run within seconds.",
                    "%d jobs will run within seconds.",
                    len(started),
                )
                % len(started),
            )
        if paused:
            self.message_user(
                request,
                ngettext(
                    "%d job is paused and was not run; enable it first.",
                    "%d jobs are paused and were not run; enable them first.",
                    paused,
                )
                % paused,
                messages.WARNING,
            )

    def _run_now(self, request: HttpRequest, job: Job) -> bool:
        # The scheduler fires a due job within a second and writes its JobRecord.
        updated = Job.objects.filter(pk=job.pk, enabled=True).update(
            next_run_at=DbNow(), version=F("version") + 1
        )
        if updated:
            self.log_change(request, job, "Run now requested.")
        return bool(updated)

    @admin.action(description=_("Pause"), permissions=["pause"])
    def pause_jobs(self, request: HttpRequest, queryset: QuerySet) -> None:
        n = sum(self._set_enabled(request, job, False) for job in queryset)
        self.message_user(request, ngettext("Paused %d job.", "Paused %d jobs.", n) % n)

    @admin.action(description=_("Enable"), permissions=["pause"])
    def enable_jobs(self, request: HttpRequest, queryset: QuerySet) -> None:
        n = sum(self._set_enabled(request, job, True) for job in queryset)
        self.message_user(request, ngettext("Enabled %d job.", "Enabled %d jobs.", n) % n)

    def _set_enabled(self, request: HttpRequest, job: Job, enabled: bool) -> bool:
        if job.enabled == enabled:
            return False
        changes: dict[str, Any] = {"enabled": enabled, "version": F("version") + 1}
        if enabled:
            # Resume from the next tick: the ticks missed while paused are not owed.
            changes["next_run_at"] = next_tick(job.cron, job.timezone, database_now(job._state.db))
        if Job.objects.filter(pk=job.pk, enabled=not enabled).update(**changes):
            self.log_change(request, job, "Enabled." if enabled else "Paused.")
            return True
        return False

    def get_urls(self) -> list:
        wrap = self.admin_site.admin_view
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("<path:object_id>/run/", wrap(self.run_view), name=f"{info}_run"),
            path("<path:object_id>/pause/", wrap(self.pause_view), name=f"{info}_pause"),
            path("<path:object_id>/enable/", wrap(self.enable_view), name=f"{info}_enable"),
            *super().get_urls(),
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> Any:
        extra = {
            "can_run": self.has_run_permission(request),
            "can_pause": self.has_pause_permission(request),
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, extra)

    @_post_only
    def run_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        job = self._job(request, object_id)
        if not self.has_run_permission(request, job):
            raise PermissionDenied
        if self._run_now(request, job):
            self.message_user(request, _("The job will run within seconds."))
        else:
            self.message_user(request, _("The job is paused; enable it first."), messages.WARNING)
        return HttpResponseRedirect(admin_url(Job, "change", job.pk))

    @_post_only
    def pause_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._toggle(request, object_id, False)

    @_post_only
    def enable_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._toggle(request, object_id, True)

    def _toggle(self, request: HttpRequest, object_id: str, enabled: bool) -> HttpResponse:
        job = self._job(request, object_id)
        if not self.has_pause_permission(request, job):
            raise PermissionDenied
        if self._set_enabled(request, job, enabled):
            self.message_user(
                request, _("The job is enabled.") if enabled else _("The job is paused.")
            )
        return HttpResponseRedirect(admin_url(Job, "change", job.pk))

    def _job(self, request: HttpRequest, object_id: str) -> Job:
        job = self.get_object(request, object_id)
        if job is None:
            raise not_found(Job, object_id)
        return job


# -- job records -------------------------------------------------------------------------


class JobNameFilter(admin.SimpleListFilter):
    title = _("job")
    parameter_name = "job"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = set(Job.objects.values_list("name", flat=True))
        recent = JobRecord.objects.order_by("-pk").values_list("job_name", flat=True)
        names.update(recent[:TASK_FILTER_SAMPLE])
        if self.value():
            names.add(self.value())
        return [(n, n) for n in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(job_name=self.value()) if self.value() else queryset


class RecordStatusFilter(admin.SimpleListFilter):
    title = _("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(TaskStatus.choices)

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(status=self.value()) if self.value() else queryset


@admin.register(JobRecord)
class JobRecordAdmin(FastListMixin, admin.ModelAdmin):
    empty_value_display = "—"
    list_display = (
        "job_display",
        "key",
        "status_display",
        "scheduled_for",
        "created_at",
        "finished_at",
        "duration",
        "worker_id",
        "task_display",
        "error_display",
    )
    list_display_links = ("key",)
    list_filter = (JobNameFilter, RecordStatusFilter, ("created_at", admin.DateFieldListFilter))
    search_fields = ("=job_name", "=key", "=worker_id")
    sortable_by = ("created_at",)
    ordering = ("-created_at", "-pk")
    readonly_fields = (
        "job_display",
        "key",
        "status_display",
        "scheduled_for",
        "created_at",
        "started_at",
        "finished_at",
        "duration",
        "worker_id",
        "task_display",
        "error_display",
    )
    fields = readonly_fields

    class Media:
        css = CSS

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The idempotency ledger: deleting a record would let its key run again.
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        job = Job.objects.filter(name=OuterRef("job_name")).values("pk")[:1]
        return super().get_queryset(request).annotate(job_pk=Subquery(job))

    @admin.display(description=_("job"), ordering="job_name")
    def job_display(self, obj: JobRecord) -> SafeString:
        job_pk = getattr(obj, "job_pk", None)
        if job_pk is None:  # a once() key, or a job deleted since
            return format_html("{}", obj.job_name)
        return format_html('<a href="{}">{}</a>', admin_url(Job, "change", job_pk), obj.job_name)

    @admin.display(description=_("status"), ordering="status")
    def status_display(self, obj: JobRecord) -> SafeString:
        return status_badge(obj.status)

    @admin.display(description=_("task"))
    def task_display(self, obj: JobRecord) -> SafeString | str:
        if obj.task_id is None:
            return "—"
        return format_html(
            '<a href="{}">{}</a>',
            admin_url(Task, "change", obj.task_id),
            str(obj.task_id)[:13] + "…",
        )

    @admin.display(description=_("error"))
    def error_display(self, obj: JobRecord) -> SafeString | str:
        if not obj.error:
            return ""
        first = obj.error.strip().splitlines()[-1] if obj.error.strip() else obj.error
        return format_html('<span title="{}">{}</span>', obj.error, first[:120])


# -- workers -----------------------------------------------------------------------------


class WorkerStateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("alive", _("Alive")),
            ("stopped", _("Stopped")),
            ("gone", _("Gone (no heartbeat)")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        alive = Worker.objects.alive(ops.ALIVE_WITHIN)
        if self.value() == "alive":
            return queryset.filter(pk__in=alive.values("pk"))
        if self.value() == "stopped":
            return queryset.filter(stopped_at__isnull=False)
        if self.value() == "gone":
            return queryset.filter(stopped_at__isnull=True).exclude(pk__in=alive.values("pk"))
        return queryset


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    empty_value_display = "—"
    list_display = (
        "name",
        "state_display",
        "queues_display",
        "mode",
        "concurrency",
        "running_display",
        "done",
        "failed",
        "started_at",
        "heartbeat_display",
    )
    list_filter = (WorkerStateFilter, "host")
    search_fields = ("name", "host")
    ordering = ("-last_heartbeat_at",)
    fields = (
        "name",
        "state_display",
        "host",
        "pid",
        "queues_display",
        "mode",
        "concurrency",
        "started_at",
        "heartbeat_display",
        "stopped_at",
        "done",
        "failed",
        "running_display",
        "running_tasks",
    )
    readonly_fields = fields
    change_list_template = "django_rdbtasks/admin/small_change_list.html"

    class Media:
        css = CSS

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Worker | None = None) -> bool:
        # Rows of live workers are theirs; rows of gone ones may be cleaned up.
        if obj is not None and self._state(obj) == "alive":
            return False
        return super().has_delete_permission(request, obj)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(db_now=DbNow())

    def _now(self, obj: Worker) -> dt.datetime:
        return db_now(obj) or database_now(obj._state.db or ops.default_database())

    def _state(self, obj: Worker) -> str:
        return ops.worker_state(obj, self._now(obj))

    @admin.display(description=_("state"))
    def state_display(self, obj: Worker) -> SafeString:
        state = self._state(obj)
        css = {"alive": "successful", "stopped": "cancelled", "gone": "failed"}[state]
        return status_badge(
            css, {"alive": _("Alive"), "stopped": _("Stopped"), "gone": _("Gone")}[state]
        )

    @admin.display(description=_("queues"))
    def queues_display(self, obj: Worker) -> str:
        return ", ".join(obj.queues) or "—"

    @admin.display(description=_("concurrency"))
    def concurrency(self, obj: Worker) -> str:
        return f"{obj.threads} threads, batch {obj.batch}"

    @admin.display(description=_("running now"), ordering="running")
    def running_display(self, obj: Worker) -> SafeString | str:
        if self._state(obj) != "alive":
            return "—"
        return format_html('<a href="{}">{}</a>', _running_url(obj), obj.running)

    @admin.display(description=_("last heartbeat"), ordering="last_heartbeat_at")
    def heartbeat_display(self, obj: Worker) -> SafeString:
        age = (self._now(obj) - obj.last_heartbeat_at).total_seconds()
        return format_html(
            '<span title="{}">{} ago</span>',
            timezone.localtime(obj.last_heartbeat_at),
            humanize_seconds(age),
        )

    @admin.display(description=_("tasks it runs now"))
    def running_tasks(self, obj: Worker) -> SafeString | str:
        tasks = (
            obj.tasks()
            .order_by("pk")
            .only("pk", "task_path", "status", "progress", "progress_message", "last_attempted_at")[
                :100
            ]
        )
        return _task_links(tasks)
