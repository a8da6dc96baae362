"""What makes a job's fields valid: its cron expression, time zone, task, queue and priority.

Below ``models/jobs.py`` (``Job.clean``) and ``jobs.py`` (jobs declared in
code), and asked by the system checks (``checks.py``) and the admin's form.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from django.core.exceptions import ValidationError

from .backend_interface import TaskBackendInterface
from .compat import InvalidTask
from .exceptions import InvalidTaskPath
from .loading import check_loadable, load_task
from .suggest import did_you_mean


def validate_cron(expression: str) -> None:
    try:
        CronSim(expression, dt.datetime.now(dt.UTC))
    except (CronSimError, ValueError, TypeError) as exc:
        raise ValidationError(f"Invalid cron expression {expression!r}: {exc}") from exc


def validate_timezone(name: str) -> None:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValidationError(f"Unknown time zone {name!r}.") from exc


def validate_task_path(path: str) -> None:
    """Refuse a path no worker could load a task from, as ``enqueue()`` would."""
    try:
        check_loadable(path)
    except InvalidTaskPath as exc:
        raise ValidationError(str(exc)) from exc


def validate_job_fields(
    cron: str,
    timezone: str,
    task_path: str,
    queue_name: str = "",
    priority: int | None = None,
) -> None:
    errors: dict[str, list[str]] = {}
    for name, check, value in (
        ("cron", validate_cron, cron),
        ("timezone", validate_timezone, timezone),
        ("task_path", validate_task_path, task_path),
    ):
        try:
            check(value)
        except ValidationError as exc:
            errors[name] = exc.messages
    if "task_path" not in errors:
        try:
            validate_job_target(task_path, queue_name, priority)
        except ValidationError as exc:
            errors.update(exc.message_dict)
    if errors:
        raise ValidationError(errors)


def validate_job_target(task_path: str, queue_name: str, priority: int | None) -> None:
    """The queue and priority a job gives its task are ones the task's backend accepts.

    A job with a queue its backend's QUEUES lacks fails every tick; refused
    here by field (``queue_name``, ``priority``), for the admin's form and the
    system check. A task path that loads no task is ``validate_task_path``'s.
    """
    if not queue_name and priority is None:
        return
    try:
        task = load_task(task_path)
    except InvalidTaskPath:
        return
    backend = task.get_backend()
    errors: dict[str, list[str]] = {}
    if queue_name and isinstance(backend, TaskBackendInterface) and backend.queues:
        if queue_name not in backend.queues:
            errors["queue_name"] = [
                f"Queue {queue_name!r} is not in TASKS[{backend.alias!r}]['QUEUES'] "
                f"({', '.join(sorted(backend.queues))}), so every tick would fail to enqueue."
                + did_you_mean(queue_name, backend.queues)
            ]
    if priority is not None:
        try:
            backend.validate_task(task.using(priority=priority))
        except (InvalidTask, ValueError, TypeError) as exc:
            errors["priority"] = [str(exc)]
    if errors:
        raise ValidationError(errors)
