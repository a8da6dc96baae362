"""The task admin: read-only rows, fast lists, and the operator actions on tasks.

Rows are never edited: every change goes through an operator API (requeue,
cancel, discard) guarded by its own permission and logged in the admin log.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import ChangeList
from django.db import connections, transaction
from django.db.models import BooleanField, F, Func, Q, QuerySet, Value
from django.http import HttpRequest
from django.urls import path
from django.utils.translation import gettext_lazy as _

from .. import bulk_requeue, snapshots
from ..db.functions import DbNow
from ..explain import explain
from ..models import Task, TaskStatus, task_path_in
from .actions import Operation, OperationsMixin, Report
from .changelist import FastListMixin, NoCountChangeList
from .display import count_text, last_error
from .filters import EnqueuedFilter, FinishedFilter, QueueFilter, StatusFilter, TaskPathFilter
from .permissions import access_for
from .queues import pause_view
from .reading import admin_database
from .retry_failed import retry_failed_view
from .task_display import TaskFields
from .workflows import WorkflowField

#: Big JSON columns a list does not show.
HEAVY_COLUMNS = ("args", "kwargs", "return_value", "history", "checkpoint")
#: Finished without success: what an operator may discard.
DISCARDABLE = (TaskStatus.FAILED, TaskStatus.CANCELLED)
#: What can be cancelled (a running task is asked to stop).
ACTIVE = (TaskStatus.READY, TaskStatus.WAITING, TaskStatus.RUNNING)
#: Rows whose last error the list shows.
WITH_ERRORS = (TaskStatus.FAILED, TaskStatus.CANCELLED)


class ILike(Func):
    """``column ILIKE pattern`` (PostgreSQL), the form a trigram index serves."""

    arg_joiner = " ILIKE "
    template = "(%(expressions)s)"
    output_field = BooleanField()
    conditional = True


def escape_like(term: str) -> str:
    return term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


class TaskChangeList(NoCountChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet:
        return super().get_queryset(request, exclude_parameters).defer(*HEAVY_COLUMNS)

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        # The list defers ``history``; the error of the failed rows of this
        # page alone is read by primary key.
        failed = {task.pk: task for task in self.result_list if task.status in WITH_ERRORS}
        if failed:
            rows = Task.objects.using(self.queryset.db).filter(pk__in=list(failed))
            for pk, history in rows.values_list("pk", "history"):
                failed[pk].error_summary = last_error(history)


# -- operations: each does one task and says what happened ----------------------------------


def _retry(model_admin: Any, request: HttpRequest, task: Task) -> str:
    was = task.status
    if snapshots.backend_for_database(task._state.db or snapshots.default_database()).requeue(
        str(task.pk)
    ):
        model_admin.log_change(request, task, f"Requeued (was {was}).")
        return "requeued"
    return "skipped"


def _cancel(model_admin: Any, request: HttpRequest, task: Task) -> str:
    was = task.status
    now = snapshots.backend_for_database(task._state.db or snapshots.default_database()).cancel(
        str(task.pk)
    )
    if now == TaskStatus.CANCELLED and was != TaskStatus.CANCELLED:
        model_admin.log_change(request, task, f"Cancelled (was {was}).")
        return "cancelled"
    if now == TaskStatus.RUNNING:
        model_admin.log_change(request, task, "Asked to stop (cancel requested while running).")
        return "stopping"
    return "finished"


def _discard(model_admin: Any, request: HttpRequest, task: Task) -> str:
    using = task._state.db or snapshots.default_database()
    with transaction.atomic(using=using):
        # Conditional: a task requeued since the page was drawn is not deleted.
        _count, deleted = (
            Task.objects.using(using).filter(pk=task.pk, status__in=DISCARDABLE).delete()
        )
        if not deleted.get(Task._meta.label):
            return "kept"
        model_admin.log_deletions(request, [task])
    return "discarded"


RETRY = Operation(
    name="retry",
    action_name="retry_tasks",
    description=_("Retry / requeue now"),
    permission="retry",
    perform=_retry,
    applies=lambda task: task.status in bulk_requeue.REQUEUEABLE,
    fields=("pk", "task_path", "status", "queue_name"),
    reports={
        "requeued": Report(
            "Requeued %(n)d task; it runs again shortly.",
            "Requeued %(n)d tasks; they run again shortly.",
        ),
        "skipped": Report(
            "%(n)d task was not requeued: only failed, cancelled or ready tasks can be.",
            "%(n)d tasks were not requeued: only failed, cancelled or ready tasks can be.",
            messages.WARNING,
        ),
    },
)
CANCEL = Operation(
    name="cancel",
    action_name="cancel_tasks",
    description=_("Cancel"),
    permission="cancel",
    perform=_cancel,
    applies=lambda task: task.status in ACTIVE and not task.cancel_requested,
    fields=("pk", "task_path", "status", "queue_name"),
    reports={
        "cancelled": Report("Cancelled %(n)d task.", "Cancelled %(n)d tasks."),
        "stopping": Report(
            "Asked %(n)d running task to stop; it ends cancelled when it does.",
            "Asked %(n)d running tasks to stop; they end cancelled when they do.",
        ),
        "finished": Report(
            "%(n)d task had already finished and was left as it was.",
            "%(n)d tasks had already finished and were left as they were.",
            messages.WARNING,
        ),
    },
)
DISCARD = Operation(
    name="discard",
    action_name="discard_tasks",
    description=_("Discard"),
    permission="discard",
    perform=_discard,
    applies=lambda task: task.status in DISCARDABLE,
    fields=("pk", "task_path", "status", "queue_name"),
    as_action=False,
    leaves_object=True,
    reports={
        "discarded": Report("Discarded %(n)d task.", "Discarded %(n)d tasks."),
        "kept": Report(
            "%(n)d task was kept: only failed or cancelled tasks can be discarded.",
            "%(n)d tasks were kept: only failed or cancelled tasks can be discarded.",
            messages.WARNING,
        ),
    },
)


class TaskAdmin(OperationsMixin, FastListMixin, TaskFields, WorkflowField, admin.ModelAdmin):
    list_display = (
        "status_display",
        "task_name",
        "queue_display",
        "attempts_display",
        "enqueued",
        "finished",
        "duration_display",
        "outcome_display",
    )
    list_display_links = ("task_name",)
    list_filter = (StatusFilter, QueueFilter, TaskPathFilter, EnqueuedFilter, FinishedFilter)
    # Sorting by anything unindexed would sort the whole (filtered) table.
    sortable_by = ("enqueued", "finished")
    ordering = ("-pk",)
    search_fields = ("task_path",)  # searched by get_search_results below
    actions = ()
    operations = (RETRY, CANCEL, DISCARD)
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
                    "attempts_detail",
                    "worker_id",
                    "lease_expires",
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
                    "enqueued_when",
                    "run_after_when",
                    "started_when",
                    "last_attempted_when",
                    "finished_when",
                    "duration_display",
                )
            },
        ),
        (
            _("Related"),
            {
                "fields": (
                    "parents_display",
                    "children_display",
                    "workflow_display",
                    "job_display",
                    "dedup_key",
                )
            },
        ),
    )
    # Every field is shown read-only: nobody edits raw rows.
    readonly_fields = tuple(flatten_fieldsets(fieldsets))

    @property
    def search_help_text(self) -> Any:  # type: ignore[override]
        if connections[snapshots.default_database()].vendor == "postgresql":
            return _(
                "A task id, a worker (host:pid) running it, or part of a task path, "
                "a job name or a dedup key."
            )
        return _(
            "A task id, a worker (host:pid) running it, part of a task path, "
            "or the beginning of a job name or a dedup key."
        )

    # -- permissions: read-only rows, one permission per operator action --

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Django's delete pages would offer it for any task; "discard" is the
        # guarded way, for failed and cancelled tasks only.
        return False

    def has_retry_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        return request.user.has_perm("django_rdbtasks.retry_task")

    def has_cancel_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        return request.user.has_perm("django_rdbtasks.cancel_task")

    def has_discard_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        # The model's delete permission, which Django's own delete pages never use here.
        return request.user.has_perm("django_rdbtasks.delete_task")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return TaskChangeList

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Each row carries the database clock, so ages and "stalled" need no
        # extra query and no state on this shared ModelAdmin instance.
        queryset = super().get_queryset(request).annotate(db_now=DbNow())
        return access_for(request.user).filter(queryset)

    # -- search: every arm an indexed lookup, so that no match costs no scan --

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
        if connections[queryset.db].vendor == "postgresql":
            # Trigram indexes serve ILIKE on the column itself (Django's
            # icontains compares UPPER(column), which no index holds).
            pattern = Value(f"%{escape_like(term)}%")

            def matches(field: str) -> Q:
                return Q(ILike(F(field), pattern))

        else:
            # B-trees (see models.SearchIndex) serve a search by the beginning.
            def matches(field: str) -> Q:
                return Q(**{f"{field}__istartswith": term})

        condition = (
            # The conditions of the partial indexes, spelled out for the planner.
            (matches("job_name") & ~Q(job_name=""))
            | (matches("dedup_key") & Q(dedup_key__isnull=False))
            # Running tasks: the few rows of the lease index.
            | Q(status=TaskStatus.RUNNING, worker_id__startswith=term)
        )
        # Any part of a task path, on every database: the few distinct paths
        # that contain the term, then their rows, both from the B-tree.
        folded = term.casefold()
        paths = [
            path
            for path in Task.objects.using(queryset.db).task_paths()
            if folded in path.casefold()
        ]
        if paths:
            condition |= task_path_in(paths)
        return queryset.filter(condition), False

    # -- views --

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> Any:
        rows = snapshots.estimated_task_rows(admin_database(request, Task))
        extra = {
            "rows": rows,
            "rows_text": count_text(
                "%(n)s task in the table", "%(n)s tasks in the table", rows.value
            ),
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
            # From where the page read the task (the replica when READ_DATABASE
            # names one, like every admin page): a box that contradicts the row
            # above it would mislead more than one a replica's lag behind.
            # `rdbtasks explain` asks the primary.
            extra["explanation"] = explain(task.pk, using=task._state.db)
            extra.update(self.buttons_allowed(request, task))
            extra["discard_question"] = _(
                "Discard this task? Its row and its history are deleted; this cannot be undone."
            )
            extra["stop_label"] = (
                _("Ask to stop") if task.status == TaskStatus.RUNNING else _("Cancel task")
            )
        return super().change_view(request, object_id, form_url, extra)

    def get_urls(self) -> list:
        from .dashboard import dashboard_view

        wrap = self.admin_site.admin_view
        info = f"{self.opts.app_label}_{self.opts.model_name}"

        def own(view: Any) -> Any:
            return wrap(lambda request: view(self, request))

        return [
            path("dashboard/", own(dashboard_view), name=f"{info}_dashboard"),
            path("retry-failed/", own(retry_failed_view), name=f"{info}_retry_failed"),
            path(
                "queues/<str:queue>/<str:verb>/",
                wrap(lambda request, queue, verb: pause_view(self, request, queue, verb)),
                name=f"{info}_queue",
            ),
            *super().get_urls(),
        ]
