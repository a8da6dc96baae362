"""A task's row read back as the framework's result, whatever became of its task."""

from __future__ import annotations

import dataclasses
from typing import Any

from .compat import Task, TaskError, TaskResult, TaskResultStatus
from .exceptions import InvalidTaskPath
from .models import Task as TaskRow
from .models import TaskStatus
from .rdbtask import RDBTask
from .results import RDBTaskResult


def result_from_row(row: TaskRow, task: Task, alias: str) -> TaskResult:
    # The task as it was enqueued, so that the result equals the one
    # enqueue() returned: run_after is what the producer asked for (None
    # when not deferred), not the column the queue orders by, which is
    # the enqueue time then and moves with every retry's backoff. Not
    # validated again: a queue since removed from QUEUES must not make
    # an existing row unreadable.
    task = replace_unvalidated(
        task,
        priority=row.priority,
        queue_name=row.queue_name,
        run_after=row.requested_run_after,
        backend=alias,
    )
    errors = [
        TaskError(
            exception_class_path=entry["exception_class_path"],
            traceback=entry.get("traceback", ""),
        )
        for entry in row.errors
    ]
    # The framework knows four statuses; report ours as the nearest one.
    status = row.status
    if status == TaskStatus.CANCELLED:
        status = TaskResultStatus.FAILED
        if not errors or not errors[-1].exception_class_path.endswith("TaskCancelled"):
            errors.append(
                TaskError(
                    exception_class_path="django_rdbtasks.exceptions.TaskCancelled",
                    traceback="Cancelled before it finished.",
                )
            )
    elif status == TaskStatus.WAITING:
        status = TaskResultStatus.READY
    result = RDBTaskResult(
        progress=row.progress,
        progress_message=row.progress_message,
        task=task,
        id=str(row.id),
        status=TaskResultStatus(status),
        enqueued_at=row.enqueued_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        last_attempted_at=row.last_attempted_at,
        args=row.args,
        kwargs=row.kwargs,
        backend=alias,
        errors=errors,
        worker_ids=row.worker_ids,
    )
    object.__setattr__(result, "_return_value", row.return_value)
    return result


def replace_unvalidated(task: Task, **changes: Any) -> Task:
    """``dataclasses.replace()`` without ``__post_init__``, the framework's validation."""
    copy = object.__new__(type(task))
    for item in dataclasses.fields(task):
        object.__setattr__(copy, item.name, changes.get(item.name, getattr(task, item.name)))
    return copy


_unloadable: dict[tuple[str, str], Task] = {}


def unloadable_task(path: str, alias: str) -> Task:
    """A stand-in for a task this process cannot load, so its rows' results still read.

    Its ``module_path`` is ``path``; calling it raises ``InvalidTaskPath``.
    One per path, so two reads of a result compare equal.
    """
    key = (path, alias)
    known = _unloadable.get(key)
    if known is not None:
        return known
    module_name, _, name = path.rpartition(".")

    def unloadable(*args: Any, **kwargs: Any) -> Any:
        raise InvalidTaskPath(f"{path!r} cannot be loaded in this process.")

    unloadable.__module__ = module_name
    unloadable.__name__ = unloadable.__qualname__ = name
    stand_in = object.__new__(RDBTask)
    for item in dataclasses.fields(RDBTask):
        if item.default is not dataclasses.MISSING:
            object.__setattr__(stand_in, item.name, item.default)
    object.__setattr__(stand_in, "func", unloadable)
    object.__setattr__(stand_in, "backend", alias)
    if len(_unloadable) >= 1024:
        _unloadable.clear()
    _unloadable[key] = stand_in
    return stand_in
