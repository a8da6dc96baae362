"""The worker registry: which processes are alive, what they run, and which are gone."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from .. import snapshots
from ..db.functions import DbNow
from ..jobs import database_now
from ..models import Worker
from .changelist import AppPagesMixin
from .dashboard import running_url
from .display import EMPTY, concurrency_text, duration_text, status_badge, when_text
from .filters import WorkerState, WorkerStateFilter
from .task_display import task_links, when_field
from .utils import db_now

STATE_BADGES = {
    WorkerState.ALIVE: ("successful", _("Alive")),
    WorkerState.STOPPED: ("cancelled", _("Stopped")),
    WorkerState.GONE: ("failed", _("Gone")),
}


class WorkerAdmin(AppPagesMixin, admin.ModelAdmin):
    list_display = (
        "name",
        "state_display",
        "queues_display",
        "concurrency",
        "running_display",
        "done",
        "failed",
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
        "concurrency",
        "started",
        "heartbeat_display",
        "stopped",
        "done",
        "failed",
        "running_display",
        "running_tasks",
    )
    readonly_fields = fields
    change_list_template = "django_rdbtasks/admin/small_change_list.html"
    change_form_template = "django_rdbtasks/admin/change_form.html"

    started = when_field("started_at", _("started"), ordering="started_at")
    stopped = when_field("stopped_at", _("stopped"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Worker | None = None) -> bool:
        # Rows of live workers are theirs; rows of gone ones may be cleaned up.
        if obj is not None and self._state(obj) == WorkerState.ALIVE:
            return False
        return super().has_delete_permission(request, obj)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).annotate(db_now=DbNow())

    def _now(self, obj: Worker) -> dt.datetime:
        return db_now(obj) or database_now(obj._state.db or snapshots.default_database())

    def _state(self, obj: Worker) -> WorkerState:
        return WorkerState(snapshots.worker_state(obj, self._now(obj)))

    @admin.display(description=_("state"))
    def state_display(self, obj: Worker) -> SafeString:
        css, label = STATE_BADGES[self._state(obj)]
        return status_badge(css, label)

    @admin.display(description=_("queues"))
    def queues_display(self, obj: Worker) -> str:
        return ", ".join(obj.queues) or EMPTY

    @admin.display(description=_("mode"))
    def concurrency(self, obj: Worker) -> str:
        return concurrency_text(obj.mode, obj.threads, obj.batch)

    @admin.display(description=_("running now"), ordering="running")
    def running_display(self, obj: Worker) -> SafeString | str:
        if self._state(obj) != WorkerState.ALIVE:
            return EMPTY
        return format_html('<a href="{}">{}</a>', running_url(obj), obj.running)

    @admin.display(description=_("last heartbeat"), ordering="last_heartbeat_at")
    def heartbeat_display(self, obj: Worker) -> SafeString:
        age = (self._now(obj) - obj.last_heartbeat_at).total_seconds()
        return format_html(
            '<span title="{}">{} ago</span>', when_text(obj.last_heartbeat_at), duration_text(age)
        )

    @admin.display(description=_("tasks it runs now"))
    def running_tasks(self, obj: Worker) -> SafeString | str:
        fields = ("pk", "task_path", "status")
        return task_links(obj.tasks().order_by("pk").only(*fields)[:100])
