"""Workflows with compensations (sagas): where each stands, and its steps and their undoing.

Read-only: a workflow moves only as its tasks finish (``sagas.py``); an
operator acts on its tasks, from their own pages.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import router
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from ..models import Task, Workflow, WorkflowStep
from ..states import StepRole, WorkflowState
from .changelist import AppPagesMixin
from .display import EMPTY, status_badge
from .permissions import access_for
from .task_display import when_field
from .utils import admin_url

#: The badge colour of each state (the task statuses' CSS names).
STATE_COLOURS = {
    WorkflowState.RUNNING: "running",
    WorkflowState.SUCCEEDED: "successful",
    WorkflowState.COMPENSATING: "waiting",
    WorkflowState.COMPENSATED: "cancelled",
    WorkflowState.FAILED_TO_COMPENSATE: "failed",
}


def state_badge(workflow: Workflow) -> SafeString:
    state = WorkflowState(workflow.state)
    return status_badge(STATE_COLOURS[state], state.label, workflow.reason)


class WorkflowStateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return list(WorkflowState.choices)

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value in WorkflowState.values:
            return queryset.filter(state=value)
        return queryset


class WorkflowAdmin(AppPagesMixin, admin.ModelAdmin):
    list_display = ("name_display", "state_display", "created", "finished", "reason")
    list_display_links = ("name_display",)
    list_filter = (WorkflowStateFilter,)
    search_fields = ("=id", "name")
    sortable_by = ()
    ordering = ("-pk",)
    fields = ("name", "id", "state_display", "reason", "created", "finished", "steps_display")
    readonly_fields = fields
    change_form_template = "django_rdbtasks/admin/change_form.html"

    created = when_field("created_at", _("created"))
    finished = when_field("finished_at", _("finished"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Whoever may see tasks may see the workflows they make up.
        return request.user.has_perm("django_rdbtasks.view_task") or super().has_view_permission(
            request, obj
        )

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        queryset = super().get_queryset(request)
        access = access_for(request.user)
        if access.unrestricted:
            return queryset
        # A workflow is seen by those who may see one of its tasks' queues.
        steps = WorkflowStep.objects.filter(access.q("task__queue_name"))
        return queryset.filter(pk__in=steps.values("workflow_id"))

    @admin.display(description=_("workflow"))
    def name_display(self, obj: Workflow) -> str:
        return obj.name or str(obj.pk)

    @admin.display(description=_("state"))
    def state_display(self, obj: Workflow) -> SafeString:
        return state_badge(obj)

    @admin.display(description=_("steps"))
    def steps_display(self, obj: Workflow) -> SafeString | str:
        steps = sorted(
            obj.steps.select_related("task").only(
                "name", "role", "compensate_with", "task__status", "task__started_at"
            ),
            # The steps, then the compensations, each in the order they ran.
            key=lambda step: (
                step.role != StepRole.STEP,
                step.task.started_at is None,
                step.task.started_at or 0,
                step.name,
            ),
        )
        if not steps:
            return EMPTY
        return format_html_join(
            mark_safe("<br>"),
            '{} {} <a href="{}">{}</a>{}',
            (
                (
                    status_badge(step.task.status),
                    StepRole(step.role).label,
                    admin_url(Task, "change", step.task_id),
                    step.name,
                    format_html(" — undone by {}", step.compensate_with)
                    if step.compensate_with
                    else "",
                )
                for step in steps
            ),
        )


class WorkflowField:
    """The task page's line about the workflow the task belongs to, beside its dependencies."""

    @admin.display(description=_("workflow"))
    def workflow_display(self, obj: Task) -> SafeString | str:
        # From the database the task was read from (a replica, on a page).
        steps = WorkflowStep.objects.using(obj._state.db or router.db_for_read(WorkflowStep))
        step = steps.filter(task_id=obj.pk).select_related("workflow").first()
        if step is None:
            return EMPTY
        workflow = step.workflow
        return format_html(
            '{} <a href="{}">{}</a> · {} {}{}',
            state_badge(workflow),
            admin_url(Workflow, "change", workflow.pk),
            workflow.name or workflow.pk,
            StepRole(step.role).label.lower(),
            step.name,
            format_html(" · undone by {}", step.compensate_with) if step.compensate_with else "",
        )
