"""The job admin: cron schedules in words, their next runs, run now, pause, retired jobs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db import router
from django.db.models import F, OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..db.functions import DbNow
from ..jobs import database_now, next_tick, upcoming_ticks
from ..models import Job, JobRecord, Task
from .actions import Operation, OperationsMixin, Report
from .changelist import AppPagesMixin
from .display import (
    EMPTY,
    breakable,
    cron_in_words,
    duration_text,
    status_badge,
    when,
    when_text,
)
from .filters import JobLifeFilter
from .permissions import access_for, filter_jobs
from .task_display import when_field
from .utils import admin_url

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise


def is_live_code_job(job: Job | None) -> bool:
    """Declared in code and still declared: the code owns it, the admin may only pause it."""
    return job is not None and job.from_code and job.retired_at is None


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


def recent_runs(job: Job, limit: int = 15) -> SafeString:
    """A job's latest records as a table (JobRecord names its job, so no inline can)."""
    records = JobRecord.objects.using(job._state.db).filter(job_name=job.name)
    records = records.order_by("-created_at")[:limit]
    rows = [
        {
            "record": record,
            "url": admin_url(JobRecord, "change", record.pk),
            "badge": status_badge(record.status),
            "finished": when_text(record.finished_at),
            "duration": duration_text(
                record.duration.total_seconds() if record.duration is not None else None
            ),
            "task_url": admin_url(Task, "change", record.task_id) if record.task_id else "",
            "error": (record.error.strip().splitlines() or [""])[-1][:200],
        }
        for record in records
    ]
    return render_to_string(
        "django_rdbtasks/admin/job/records.html",
        {"records": rows, "all_url": admin_url(JobRecord, "changelist", query={"job": job.name})},
    )


# -- operations -------------------------------------------------------------------------------


def _run_now(model_admin: Any, request: HttpRequest, job: Job) -> str:
    if job.retired_at is not None:
        return "retired"
    # The scheduler fires a due job within a second and writes its JobRecord.
    updated = Job.objects.filter(pk=job.pk, enabled=True, retired_at__isnull=True).update(
        next_run_at=DbNow(), version=F("version") + 1
    )
    if not updated:
        return "paused"
    model_admin.log_change(request, job, "Run now requested.")
    return "started"


def _set_enabled(model_admin: Any, request: HttpRequest, job: Job, enabled: bool) -> str:
    if job.enabled == enabled:
        return "unchanged"
    changes: dict[str, Any] = {"enabled": enabled, "version": F("version") + 1}
    if enabled:
        # Resume from the next tick: the ticks missed while paused are not owed.
        now = database_now(job._state.db or router.db_for_write(Job))
        changes["next_run_at"] = next_tick(job.cron, job.timezone, now)
    if not Job.objects.filter(pk=job.pk, enabled=not enabled).update(**changes):
        return "unchanged"
    model_admin.log_change(request, job, "Enabled." if enabled else "Paused.")
    return "enabled" if enabled else "paused"


RUN = Operation(
    name="run",
    action_name="run_now",
    description=_("Run now"),
    permission="run",
    perform=_run_now,
    applies=lambda job: job.enabled and job.retired_at is None,
    reports={
        "started": Report(
            "%(n)d job will run within seconds.", "%(n)d jobs will run within seconds."
        ),
        "paused": Report(
            "%(n)d job is paused and was not run; enable it first.",
            "%(n)d jobs are paused and were not run; enable them first.",
            messages.WARNING,
        ),
        "retired": Report(
            "%(n)d job is retired (no longer in the code) and was not run.",
            "%(n)d jobs are retired (no longer in the code) and were not run.",
            messages.WARNING,
        ),
    },
)
PAUSE = Operation(
    name="pause",
    action_name="pause_jobs",
    description=_("Pause"),
    permission="pause",
    perform=lambda model_admin, request, job: _set_enabled(model_admin, request, job, False),
    applies=lambda job: job.enabled,
    reports={
        "paused": Report("Paused %(n)d job.", "Paused %(n)d jobs."),
        "unchanged": Report(
            "%(n)d job was already paused.", "%(n)d jobs were already paused.", messages.INFO
        ),
    },
)
ENABLE = Operation(
    name="enable",
    action_name="enable_jobs",
    description=_("Enable"),
    permission="pause",
    perform=lambda model_admin, request, job: _set_enabled(model_admin, request, job, True),
    applies=lambda job: not job.enabled,
    reports={
        "enabled": Report("Enabled %(n)d job.", "Enabled %(n)d jobs."),
        "unchanged": Report(
            "%(n)d job was already enabled.", "%(n)d jobs were already enabled.", messages.INFO
        ),
    },
)


class JobColumns:
    @admin.display(description=_("task"), ordering="task_path")
    def task_display(self, obj: Job) -> SafeString:
        module, _dot, name = obj.task_path.rpartition(".")
        return format_html(
            '<span class="rdbtasks-task" title="{}">{} <span class="rdbtasks-muted">{}</span>'
            "</span>",
            obj.task_path,
            breakable(name),
            breakable(module),
        )

    @admin.display(description=_("name"), ordering="name")
    def name_display(self, obj: Job) -> SafeString:
        if not obj.from_code:
            return format_html("{}", obj.name)
        return format_html(
            '{} <span class="rdbtasks-muted" title="{}">{}</span>',
            obj.name,
            _("Declared in code"),
            _("code"),
        )

    @admin.display(description=_("schedule"), ordering="cron")
    def schedule(self, obj: Job) -> SafeString:
        words = cron_in_words(obj.cron)
        return format_html(
            '<span class="rdbtasks-schedule" title="{} ({})"><code>{}</code> {} '
            '<span class="rdbtasks-muted">{}</span></span>',
            words,
            obj.timezone,
            obj.cron,
            words,
            obj.timezone,
        )

    @admin.display(description=_("in words"))
    def cron_words(self, obj: Job) -> str:
        return cron_in_words(obj.cron) if obj.cron else EMPTY

    @admin.display(description=_("state"), ordering="enabled")
    def state(self, obj: Job) -> SafeString:
        if obj.retired_at is not None:
            title = _("No live scheduler declares it since %(when)s; it does not run.") % {
                "when": when_text(obj.retired_at)
            }
            return status_badge("retired", _("Retired"), title)
        if obj.enabled:
            return status_badge("successful", _("Active"))
        return status_badge("cancelled", _("Paused"))

    @admin.display(description=_("next run"), ordering="next_run_at")
    def next_run(self, obj: Job) -> SafeString | str:
        if not obj.enabled or obj.retired_at is not None:
            return EMPTY
        return when(obj.next_run_at)

    last_run = when_field("last_run_at", _("last run"), ordering="last_run_at")

    @admin.display(description=_("outcome"))
    def last_outcome(self, obj: Job) -> SafeString | str:
        status = getattr(obj, "last_status", None)
        if not status:
            return EMPTY
        return status_badge(status, title=getattr(obj, "last_error", "") or "")

    @admin.display(description=_("declared"), ordering="from_code")
    def declared(self, obj: Job) -> StrOrPromise:
        return _("in code") if obj.from_code else _("in the admin")


class JobFields(JobColumns):
    last_declared = when_field("last_declared_at", _("last declared by code"))
    retired = when_field("retired_at", _("retired"))
    created = when_field("created_at", _("created"))
    updated = when_field("updated_at", _("updated"))

    @admin.display(description=_("next five runs"))
    def upcoming(self, obj: Job) -> SafeString | StrOrPromise:
        if not obj.pk or not obj.cron:
            return EMPTY
        if obj.retired_at is not None:
            return _("None: the job is retired (no live scheduler declares it).")
        if not obj.enabled:
            return _("None while the job is paused; enabling it resumes from the next tick.")
        try:
            now = database_now(obj._state.db or router.db_for_read(Job))
            ticks = upcoming_ticks(obj.cron, obj.timezone, now, 5)
            zone = ZoneInfo(obj.timezone)
        except Exception:  # an invalid schedule shows nothing here
            return EMPTY
        return format_html(
            '<ol class="rdbtasks-ticks">{}</ol>',
            format_html_join(
                "",
                "<li>{} {} <span class='rdbtasks-muted'>({})</span></li>",
                (
                    (
                        tick.astimezone(zone).strftime("%a"),
                        when(tick, zone),
                        when_text(tick, ZoneInfo("UTC")),
                    )
                    for tick in ticks
                ),
            ),
        )

    @admin.display(description=_("records"))
    def recent_records(self, obj: Job) -> SafeString | str:
        return recent_runs(obj) if obj.pk else EMPTY


class JobAdmin(OperationsMixin, AppPagesMixin, JobFields, admin.ModelAdmin):
    form = JobForm
    list_display = (
        "name_display",
        "task_display",
        "schedule",
        "state",
        "next_run",
        "last_run",
        "last_outcome",
    )
    list_filter = (JobLifeFilter, "enabled", "misfire_policy")
    list_display_links = ("name_display",)
    search_fields = ("name", "task_path")
    ordering = ("name",)
    actions = ()
    operations = (RUN, PAUSE, ENABLE)
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
                    "next_run",
                    "last_run",
                )
            },
        ),
        (_("Recent runs"), {"fields": ("recent_records",)}),
        (
            _("Bookkeeping"),
            {
                "fields": (
                    "declared",
                    "last_declared",
                    "retired",
                    "version",
                    "created",
                    "updated",
                )
            },
        ),
    )
    base_readonly = (
        "cron_words",
        "upcoming",
        "next_run",
        "last_run",
        "recent_records",
        "declared",
        "last_declared",
        "retired",
        "version",
        "created",
        "updated",
    )

    def has_run_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_rdbtasks.run_job")

    def has_pause_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_rdbtasks.pause_job")

    def has_change_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        # A job declared in code is redefined from the code at every worker
        # start: an edit here would not last. It is paused with its button.
        if obj is not None and obj.from_code:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        # The code would declare a live one again; a retired one is gone from the code.
        if is_live_code_job(obj):
            return False
        return super().has_delete_permission(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> list[str]:
        fields = list(self.base_readonly)
        if not self.has_pause_permission(request):
            fields.append("enabled")  # pausing has its own permission
        return fields

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        latest = JobRecord.objects.filter(job_name=OuterRef("name")).order_by("-created_at")
        queryset = (
            super()
            .get_queryset(request)
            .annotate(
                last_status=Subquery(latest.values("status")[:1]),
                last_error=Subquery(latest.values("error")[:1]),
            )
        )
        return filter_jobs(queryset, access_for(request.user))

    def save_model(
        self, request: HttpRequest, obj: Job, form: forms.ModelForm, change: bool
    ) -> None:
        # A changed schedule takes effect from its next tick.
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

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict | None = None,
    ) -> Any:
        extra = dict(extra_context or {})
        job = self.get_object(request, object_id)
        if job is not None:
            extra.update(self.buttons_allowed(request, job))
            extra["live_code_job"] = is_live_code_job(job)
        return super().change_view(request, object_id, form_url, extra)
