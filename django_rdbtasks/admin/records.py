"""Job records: the execution history of jobs and the idempotency ledger of ``once()``."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import Job, JobRecord, Task
from .changelist import FastListMixin
from .display import EMPTY, duration_text, status_badge
from .filters import JobNameFilter, RecordStatusFilter
from .permissions import access_for, filter_jobs
from .task_display import when_field
from .utils import admin_url


class JobRecordAdmin(FastListMixin, admin.ModelAdmin):
    list_display = (
        "job_display",
        "key",
        "status_display",
        "created",
        "duration_display",
        "task_display",
        "error_display",
    )
    list_display_links = ("key",)
    list_filter = (JobNameFilter, RecordStatusFilter, ("created_at", admin.DateFieldListFilter))
    search_fields = ("=job_name", "=key", "=worker_id")
    sortable_by = ("created",)
    ordering = ("-created_at", "-pk")
    readonly_fields = (
        "job_display",
        "key",
        "status_display",
        "scheduled",
        "created",
        "started",
        "finished",
        "duration_display",
        "worker_id",
        "task_display",
        "error_display",
    )
    fields = readonly_fields
    change_form_template = "django_rdbtasks/admin/change_form.html"

    scheduled = when_field("scheduled_for", _("scheduled for"))
    created = when_field("created_at", _("created"), ordering="created_at")
    started = when_field("started_at", _("started"))
    finished = when_field("finished_at", _("finished"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The idempotency ledger: deleting a record would let its key run again.
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        job = Job.objects.filter(name=OuterRef("job_name")).values("pk")[:1]
        queryset = super().get_queryset(request).annotate(job_pk=Subquery(job))
        access = access_for(request.user)
        if access.unrestricted:
            return queryset
        # A job's records go with the job; a once() key's with its task's queue.
        jobs = Job.objects.using(queryset.db)
        visible = filter_jobs(jobs, access).values_list("name", flat=True)
        of_no_job = ~Q(job_name__in=jobs.values_list("name", flat=True))
        return queryset.filter(
            Q(job_name__in=list(visible)) | (of_no_job & access.q("task__queue_name"))
        )

    @admin.display(description=_("job"), ordering="job_name")
    def job_display(self, obj: JobRecord) -> SafeString:
        job_pk = getattr(obj, "job_pk", None)
        if job_pk is None:  # a once() key, or a job deleted since
            return format_html("{}", obj.job_name)
        return format_html('<a href="{}">{}</a>', admin_url(Job, "change", job_pk), obj.job_name)

    @admin.display(description=_("status"), ordering="status")
    def status_display(self, obj: JobRecord) -> SafeString:
        return status_badge(obj.status)

    @admin.display(description=_("duration"))
    def duration_display(self, obj: JobRecord) -> str:
        return duration_text(obj.duration.total_seconds() if obj.duration is not None else None)

    @admin.display(description=_("task"))
    def task_display(self, obj: JobRecord) -> SafeString | str:
        if obj.task_id is None:
            return EMPTY
        return format_html(
            '<a href="{}">{}</a>',
            admin_url(Task, "change", obj.task_id),
            str(obj.task_id)[:13] + "…",
        )

    @admin.display(description=_("error"))
    def error_display(self, obj: JobRecord) -> SafeString | str:
        if not obj.error.strip():
            return ""
        last = obj.error.strip().splitlines()[-1]
        return format_html('<span class="rdbtasks-error" title="{}">{}</span>', obj.error, last)
