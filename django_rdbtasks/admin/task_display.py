"""What the task list and a task's page show of a row: its columns and read-only fields."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin
from django.template.loader import render_to_string
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext_lazy as _

from ..models import Job, JobRecord, Task, TaskStatus
from .display import (
    EMPTY,
    breakable,
    duration_text,
    error_cell,
    error_message,
    parse_when,
    pretty_json,
    short_worker,
    status_badge,
    traceback_html,
    when,
    when_text,
)
from .filters import ListState
from .utils import admin_url, db_now


def when_field(attribute: str, description: Any, ordering: str | None = None) -> Callable:
    """A column or read-only field showing a moment in the admin's one format."""

    @admin.display(description=description, ordering=ordering)
    def show(model_admin: Any, obj: Any) -> SafeString | str:
        return when(getattr(obj, attribute))

    show.__name__ = f"{attribute}_when"
    return show


def task_links(tasks: Iterable[Task]) -> SafeString | str:
    items = list(tasks)
    if not items:
        return EMPTY
    return format_html_join(
        mark_safe("<br>"),
        '{} <a href="{}">{}</a>',
        ((status_badge(t.status), admin_url(Task, "change", t.pk), str(t)) for t in items),
    )


class TaskColumns:
    """The task list's columns: each one line, narrow, and full on hover."""

    @admin.display(description=_("status"))
    def status_display(self, obj: Task) -> SafeString:
        now = db_now(obj)
        if obj.status == TaskStatus.RUNNING and obj.cancel_requested:
            return status_badge(
                obj.status,
                _("Cancelling"),
                _("Cancel requested; the task stops at its next check."),
            )
        if obj.status == TaskStatus.RUNNING and now and obj.lease_expires_at:
            if obj.lease_expires_at <= now:
                return status_badge(
                    ListState.STALLED, _("Stalled"), _("Its worker stopped renewing the lease.")
                )
        if obj.status == TaskStatus.READY and now and obj.run_after and obj.run_after > now:
            title = _("Runs after %(when)s") % {"when": when_text(obj.run_after)}
            return status_badge(ListState.SCHEDULED, _("Scheduled"), title)
        return status_badge(obj.status)

    @admin.display(description=_("task"))
    def task_name(self, obj: Task) -> SafeString:
        module, _dot, name = obj.task_path.rpartition(".")
        return format_html(
            '<span class="rdbtasks-task" title="{}"><strong>{}</strong> '
            '<span class="rdbtasks-muted">{}</span></span>',
            obj.task_path,
            breakable(name),
            breakable(module),
        )

    @admin.display(description=_("queue"), ordering="queue_name")
    def queue_display(self, obj: Task) -> SafeString | str:
        if not obj.priority:
            return obj.queue_name
        return format_html(
            '{} <span class="rdbtasks-muted" title="{}">{}</span>',
            obj.queue_name,
            _("priority"),
            f"{obj.priority:+d}",
        )

    @admin.display(description=_("attempts"))
    def attempts_display(self, obj: Task) -> str:
        """``2/3``: attempts spent of ``max_attempts`` (the list defers the history)."""
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description=_("worker"))
    def worker_display(self, obj: Task) -> SafeString | str:
        if not obj.worker_id:
            return EMPTY
        return format_html(
            '<span class="rdbtasks-worker" title="{}">{}</span>',
            obj.worker_id,
            short_worker(obj.worker_id),
        )

    enqueued = when_field("enqueued_at", _("enqueued"), ordering="pk")
    finished = when_field("finished_at", _("finished"), ordering="finished_at")

    @admin.display(description=_("duration"))
    def duration_display(self, obj: Task) -> str:
        if obj.last_attempted_at is None:
            return EMPTY
        if obj.finished_at is not None:
            return duration_text((obj.finished_at - obj.last_attempted_at).total_seconds())
        now = db_now(obj)
        if obj.status == TaskStatus.RUNNING and now is not None:
            return f"{duration_text((now - obj.last_attempted_at).total_seconds())} …"
        return EMPTY

    @admin.display(description=_("details"))
    def outcome_display(self, obj: Task) -> SafeString | str:
        """A running task's worker and progress; a failed one's error.

        One column for the three, since no task has more than one of them to
        show, keeps the list within a laptop's width.
        """
        summary = getattr(obj, "error_summary", None)
        if summary is not None:
            return error_cell(summary)
        if obj.status != TaskStatus.RUNNING:
            return self.progress_display(obj)
        return format_html("{} {}", self.worker_display(obj), self.progress_display(obj))

    @admin.display(description=_("progress"))
    def progress_display(self, obj: Task) -> SafeString | str:
        if obj.progress is None:
            return obj.progress_message or ""
        fraction = min(1.0, max(0.0, obj.progress))
        return format_html(
            '<span class="rdbtasks-progress" title="{}"><progress max="1" value="{}">{}</progress>'
            " {}</span>",
            obj.progress_message,
            f"{fraction:.4f}",
            f"{fraction:.0%}",
            f"{fraction:.0%}",
        )


class TaskFields(TaskColumns):
    """A task's page: the summary, its attempts, its JSON, its relations."""

    lease_expires = when_field("lease_expires_at", _("lease expires"))
    enqueued_when = when_field("enqueued_at", _("enqueued"))
    run_after_when = when_field("run_after", _("run after"))
    started_when = when_field("started_at", _("started"))
    last_attempted_when = when_field("last_attempted_at", _("last attempted"))
    finished_when = when_field("finished_at", _("finished"))

    @admin.display(description=_("attempts"))
    def attempts_detail(self, obj: Task) -> SafeString | str:
        """``3/3 (6 in all)``: the counter against ``max_attempts``, and every attempt.

        Requeueing (an operator's retry) gives a task fresh attempts, and an
        attempt handed back unspent is in its history too: the counter then
        says less than the history. ``get_result().attempts`` counts the
        history (the framework's ``len(worker_ids)``), so the page says both.
        """
        spent = f"{obj.attempts}/{obj.max_attempts}"
        in_all = attempts_in_all(obj)
        if in_all == obj.attempts:
            return spent
        return format_html(
            '{} <span class="rdbtasks-muted" title="{}">({})</span>',
            spent,
            _(
                "%(spent)s of its %(max)s attempts spent since it was last requeued; "
                "%(all)s attempts in all, as get_result().attempts counts them."
            )
            % {"spent": obj.attempts, "max": obj.max_attempts, "all": in_all},
            _("%(all)s in all") % {"all": in_all},
        )

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

    @admin.display(description=_("waits for"))
    def parents_display(self, obj: Task) -> SafeString | str:
        return task_links(obj.parents.order_by("pk").only("pk", "task_path", "status")[:50])

    @admin.display(description=_("then runs"))
    def children_display(self, obj: Task) -> SafeString | str:
        return task_links(obj.children.order_by("pk").only("pk", "task_path", "status")[:50])

    @admin.display(description=_("job"))
    def job_display(self, obj: Task) -> SafeString | str:
        if not obj.job_name:
            return EMPTY
        job = Job.objects.using(obj._state.db).filter(name=obj.job_name).only("pk").first()
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

    def history_table(self, obj: Task) -> SafeString:
        """Every attempt: shown after the summary, as wide as the page (see change_form).

        ``#`` numbers them all, as ``get_result().attempts`` counts them;
        ``attempt`` is the counter against ``max_attempts``, which a requeue
        starts again.
        """
        current = None
        if obj.status == TaskStatus.RUNNING:
            current = {
                "number": len(obj.history) + 1,
                "attempt": obj.attempts,
                "worker_id": obj.worker_id,
                "started": when_text(obj.last_attempted_at),
                "lease_expires": when_text(obj.lease_expires_at),
            }
        return render_to_string(
            "django_rdbtasks/admin/task/history.html",
            {
                "entries": [
                    {**history_row(entry), "number": number}
                    for number, entry in enumerate(obj.history, start=1)
                ],
                "current": current,
                "task": obj,
            },
        )


def attempts_in_all(obj: Task) -> int:
    """Every attempt of the task's history, a running one included: ``get_result().attempts``."""
    return len(obj.worker_ids)


def history_row(entry: dict[str, Any]) -> dict[str, Any]:
    started = parse_when(entry.get("started_at"))
    finished = parse_when(entry.get("finished_at"))
    duration = (finished - started).total_seconds() if started and finished else None
    class_path = str(entry.get("exception_class_path") or "")
    traceback = str(entry.get("traceback") or "")
    outcome = str(entry.get("outcome", ""))
    return {
        "attempt": entry.get("attempt"),
        "worker_id": entry.get("worker_id", ""),
        "outcome": outcome,
        "outcome_class": outcome.lower(),
        "started": when_text(started),
        "finished": when_text(finished),
        "duration": duration_text(duration),
        "exception_class_path": class_path,
        "message": error_message(class_path, traceback)[:300] if class_path else "",
        "traceback": traceback_html(traceback) if class_path else "",
        "detail": entry.get("detail", ""),
    }
