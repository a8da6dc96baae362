"""Pausing and resuming a queue from the dashboard: its own permission, logged."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.models import ADDITION, DELETION, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseNotAllowed, HttpResponseRedirect
from django.utils.translation import gettext as _

from .. import queues
from ..models import PausedQueue, Task
from .utils import admin_url

#: The permission that pausing and resuming need (``PausedQueue.Meta.permissions``).
PERMISSION = "django_rdbtasks.pause_queue"


def can_pause(request: HttpRequest) -> bool:
    return request.user.has_perm(PERMISSION)


def pause_view(model_admin: Any, request: HttpRequest, queue: str, verb: str) -> Any:
    """POST: pause or resume ``queue``, record it in the admin's log, back to the dashboard."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not can_pause(request):
        raise PermissionDenied
    by = request.user.get_username()
    try:
        if verb == "pause":
            reason = request.POST.get("reason", "")
            changed = queues.pause(queue, by=by, reason=reason)
        else:
            row = PausedQueue.objects.filter(queue_name=queue).first()
            changed = queues.resume(queue, by=by)
    except queues.UnknownQueue as exc:
        messages.error(request, str(exc))
        return HttpResponseRedirect(admin_url(Task, "dashboard"))
    if changed:
        if verb == "pause":
            row = PausedQueue.objects.get(queue_name=queue)
        _log(request, row, ADDITION if verb == "pause" else DELETION, verb)
        text = _("Queue %(queue)s paused.") if verb == "pause" else _("Queue %(queue)s resumed.")
        messages.success(request, text % {"queue": queue})
    else:
        text = (
            _("Queue %(queue)s was paused already.")
            if verb == "pause"
            else _("Queue %(queue)s was not paused.")
        )
        messages.info(request, text % {"queue": queue})
    return HttpResponseRedirect(admin_url(Task, "dashboard"))


def _log(request: HttpRequest, row: PausedQueue | None, flag: int, verb: str) -> None:
    """One entry of the admin's log: the pause added, or deleted by the resume."""
    user_id = request.user.pk
    if row is None or user_id is None:
        return
    done = "paused" if verb == "pause" else "resumed"
    LogEntry.objects.log_actions(user_id, [row], flag, f"Queue {row.queue_name} {done}.")
