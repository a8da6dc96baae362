"""*Retry all failed…*: requeue every failed task of a queue and a time window, after asking."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from django import forms
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import bulk_requeue, snapshots
from ..models import Task, TaskStatus
from .filters import AGE_LABELS, AGES, visible_queues
from .utils import admin_url, page_context, request_now

#: How many of the newest failures "the tasks that fail most" looks at.
SAMPLE = 10_000


class RetryFailedForm(forms.Form):
    queue = forms.ChoiceField(label=_("Queue"), required=False)
    window = forms.ChoiceField(
        label=_("Failed in"),
        required=False,
        choices=[("", _("Any time")), *AGE_LABELS.items()],
    )
    confirm = forms.BooleanField(required=False, widget=forms.HiddenInput)


def failed_tasks(model_admin: Any, request: HttpRequest, options: dict) -> QuerySet:
    """The FAILED tasks this user may see, of the chosen queue and window."""
    failed = model_admin.get_queryset(request).filter(status=TaskStatus.FAILED)
    if options.get("queue"):
        failed = failed.filter(queue_name=options["queue"])
    if options.get("window") in AGES:
        now = request_now(request, failed.db)
        failed = failed.filter(finished_at__gte=now - AGES[options["window"]])
    return failed


def failing_most(failed: QuerySet, limit: int = 20) -> list[dict[str, Any]]:
    """The most frequent failing tasks among the newest failures."""
    sample = failed.order_by("-pk").values_list("task_path", "queue_name")[:SAMPLE]
    ranked = Counter(sample).most_common(limit)
    return [{"task_path": t, "queue": q, "count": n} for (t, q), n in ranked]


def log_requeued(request: HttpRequest, batch: Sequence[bulk_requeue.Requeued]) -> None:
    """One admin log entry per requeued task, written in bulk."""
    by_message: dict[str, list[Task]] = {}
    for item in batch:
        by_message.setdefault(f"Requeued (was {item.was}).", []).append(
            Task(pk=item.id, task_path=item.task_path)
        )
    user_id = request.user.pk
    assert user_id is not None  # the admin's views are for logged-in users only
    for message, tasks in by_message.items():
        LogEntry.objects.log_actions(user_id, tasks, CHANGE, message)


def retry_failed_view(model_admin: Any, request: HttpRequest) -> HttpResponse:
    if not model_admin.has_retry_permission(request):
        raise PermissionDenied
    form = RetryFailedForm(request.POST or request.GET or None)
    queue_field = form.fields["queue"]
    assert isinstance(queue_field, forms.ChoiceField)
    queue_field.choices = [("", _("All queues"))] + [(q, q) for q in visible_queues(request)]
    selected = form.is_valid()
    failed = failed_tasks(model_admin, request, form.cleaned_data if selected else {})
    if request.method == "POST" and selected and form.cleaned_data.get("confirm"):
        requeued = bulk_requeue.requeue_tasks(
            failed, on_batch=lambda batch: log_requeued(request, batch)
        )
        model_admin.message_user(
            request,
            ngettext("Requeued %d failed task.", "Requeued %d failed tasks.", requeued) % requeued,
        )
        return HttpResponseRedirect(
            admin_url(Task, "changelist", query={"status": TaskStatus.READY})
        )
    crumbs = [
        (admin_url(Task, "changelist"), str(Task._meta.verbose_name_plural).capitalize()),
        ("", _("Retry all failed")),
    ]
    context = {
        **page_context(model_admin, request, _("Retry all failed tasks"), crumbs),
        "form": form,
        "count": snapshots.capped_count(failed),
        "by_task": failing_most(failed),
        "back_url": admin_url(Task, "changelist", query={"status": TaskStatus.FAILED}),
    }
    return TemplateResponse(
        request, "django_rdbtasks/admin/task/retry_failed_confirmation.html", context
    )
