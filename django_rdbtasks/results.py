"""The backend's results: the framework's TaskResult with progress, made cheaply at enqueue."""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .compat import TASK_REFRESH_ATTRS, Task, TaskResult, TaskResultStatus


# django-stubs declare TaskResult a plain dataclass; at run time it is frozen.
@dataclass(frozen=True, slots=True, kw_only=True)
class RDBTaskResult(TaskResult):  # type: ignore[misc]
    """The framework's ``TaskResult`` plus the progress a running task reported."""

    progress: float | None = None
    progress_message: str = ""

    def __post_init__(self) -> None:
        # The framework's normalises args and kwargs to JSON values here. Ours
        # are so already: normalised and checked at enqueue, or read back
        # from a JSON column; doing it again costs every enqueue.
        pass

    def refresh(self) -> None:
        self._refresh_from(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        self._refresh_from(await self.task.get_backend().aget_result(self.id))

    def _refresh_from(self, fresh: TaskResult) -> None:
        # What the framework refreshes, plus the progress; one read, not two.
        for attr in TASK_REFRESH_ATTRS:
            object.__setattr__(self, attr, getattr(fresh, attr))
        object.__setattr__(self, "progress", getattr(fresh, "progress", None))
        object.__setattr__(self, "progress_message", getattr(fresh, "progress_message", ""))


ReadyResult = Callable[[Task, str, datetime | None, list[Any], dict[str, Any], str], RDBTaskResult]

#: The fields ``ready_result`` sets, in the dataclass's order (Django 5.2's
#: backport and Django 6.1 alike).
READY_FIELDS = (
    "task",
    "id",
    "status",
    "enqueued_at",
    "started_at",
    "finished_at",
    "last_attempted_at",
    "args",
    "kwargs",
    "backend",
    "errors",
    "worker_ids",
    "_return_value",
    "progress",
    "progress_message",
)


def constructed_ready_result(
    task: Task,
    result_id: str,
    enqueued_at: datetime | None,
    args: list[Any],
    kwargs: dict[str, Any],
    backend: str,
) -> RDBTaskResult:
    return RDBTaskResult(
        task=task,
        id=result_id,
        status=TaskResultStatus.READY,
        enqueued_at=enqueued_at,
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=[],
        worker_ids=[],
    )


def _ready_result() -> ReadyResult:
    """What ``constructed_ready_result`` makes, a fifth of its cost: each slot set once, directly.

    A frozen dataclass's ``__init__`` sets each of its 15 fields through
    ``object.__setattr__``, and a bulk enqueue makes one result per task; the
    slots' own descriptors do the same for far less. Should the framework's
    ``TaskResult`` gain or lose a field, the constructor serves instead.
    """
    names = tuple(field.name for field in dataclasses.fields(RDBTaskResult))
    slots = [getattr(RDBTaskResult, name, None) for name in names]
    if names != READY_FIELDS or not all(
        isinstance(slot, types.MemberDescriptorType) for slot in slots
    ):
        return constructed_ready_result
    (
        set_task,
        set_id,
        set_status,
        set_enqueued_at,
        set_started_at,
        set_finished_at,
        set_last_attempted_at,
        set_args,
        set_kwargs,
        set_backend,
        set_errors,
        set_worker_ids,
        set_return_value,
        set_progress,
        set_progress_message,
    ) = (slot.__set__ for slot in slots)  # type: ignore[union-attr]
    new, cls, ready = object.__new__, RDBTaskResult, TaskResultStatus.READY

    def ready_result(
        task: Task,
        result_id: str,
        enqueued_at: datetime | None,
        args: list[Any],
        kwargs: dict[str, Any],
        backend: str,
    ) -> RDBTaskResult:
        result = new(cls)
        set_task(result, task)
        set_id(result, result_id)
        set_status(result, ready)
        set_enqueued_at(result, enqueued_at)
        set_started_at(result, None)
        set_finished_at(result, None)
        set_last_attempted_at(result, None)
        set_args(result, args)
        set_kwargs(result, kwargs)
        set_backend(result, backend)
        set_errors(result, [])
        set_worker_ids(result, [])
        set_return_value(result, None)
        set_progress(result, None)
        set_progress_message(result, "")
        return result

    return ready_result


#: ``ready_result(task, id, enqueued_at, args, kwargs, backend)``: the READY
#: result of a task just enqueued, equal to the one the constructor makes.
ready_result: ReadyResult = _ready_result()

RunningResult = Callable[
    [Task, str, datetime, datetime, datetime, list[Any], dict[str, Any], str, list[str]],
    RDBTaskResult,
]


def constructed_running_result(
    task: Task,
    result_id: str,
    enqueued_at: datetime,
    started_at: datetime,
    last_attempted_at: datetime,
    args: list[Any],
    kwargs: dict[str, Any],
    backend: str,
    worker_ids: list[str],
) -> RDBTaskResult:
    return RDBTaskResult(
        task=task,
        id=result_id,
        status=TaskResultStatus.RUNNING,
        enqueued_at=enqueued_at,
        started_at=started_at,
        finished_at=None,
        last_attempted_at=last_attempted_at,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=[],
        worker_ids=worker_ids,
    )


def _running_result() -> RunningResult:
    """What ``constructed_running_result`` makes, the cheap way ``ready_result`` is made:
    the result a worker hands to ``task_started`` and to the task, one per run."""
    if ready_result is constructed_ready_result:
        return constructed_running_result
    slots = [getattr(RDBTaskResult, name) for name in READY_FIELDS]
    (
        set_task,
        set_id,
        set_status,
        set_enqueued_at,
        set_started_at,
        set_finished_at,
        set_last_attempted_at,
        set_args,
        set_kwargs,
        set_backend,
        set_errors,
        set_worker_ids,
        set_return_value,
        set_progress,
        set_progress_message,
    ) = (slot.__set__ for slot in slots)
    new, cls, running = object.__new__, RDBTaskResult, TaskResultStatus.RUNNING

    def running_result(
        task: Task,
        result_id: str,
        enqueued_at: datetime,
        started_at: datetime,
        last_attempted_at: datetime,
        args: list[Any],
        kwargs: dict[str, Any],
        backend: str,
        worker_ids: list[str],
    ) -> RDBTaskResult:
        result = new(cls)
        set_task(result, task)
        set_id(result, result_id)
        set_status(result, running)
        set_enqueued_at(result, enqueued_at)
        set_started_at(result, started_at)
        set_finished_at(result, None)
        set_last_attempted_at(result, last_attempted_at)
        set_args(result, args)
        set_kwargs(result, kwargs)
        set_backend(result, backend)
        set_errors(result, [])
        set_worker_ids(result, worker_ids)
        set_return_value(result, None)
        set_progress(result, None)
        set_progress_message(result, "")
        return result

    return running_result


#: ``running_result(task, id, enqueued_at, started_at, last_attempted_at, args,
#: kwargs, backend, worker_ids)``: a claimed task's RUNNING result.
running_result: RunningResult = _running_result()

_enqueued_at_slot = getattr(RDBTaskResult, "enqueued_at", None)
#: Sets a result's ``enqueued_at``, frozen as it is (its slot's own setter).
_set_enqueued_at: Callable[[Any, Any], None] = (
    _enqueued_at_slot.__set__
    if isinstance(_enqueued_at_slot, types.MemberDescriptorType)
    else lambda result, value: object.__setattr__(result, "enqueued_at", value)
)


def stamp_enqueued_at(results: Iterable[TaskResult], enqueued_at: datetime) -> None:
    """Give results made before their rows were written the time the database wrote them.

    Only for results nobody has seen yet: a bulk enqueue makes them while the
    database writes the rows, and stamps them before it returns any.
    """
    for result in results:
        _set_enqueued_at(result, enqueued_at)
