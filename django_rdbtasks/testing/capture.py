"""What a test enqueued: captured in a block, or read from the database, and asserted.

``captured_tasks()`` records every task enqueued while its block runs (by the
framework's ``task_enqueued`` signal, which every enqueue sends once, single or
bulk), whether or not it has run since. ``assert_enqueued`` and
``assert_not_enqueued`` at module level read the database instead: the tasks
waiting to run (READY) now. Arguments are compared as the task receives them
(a tuple is a list: the enqueue normalised it), exactly, args and kwargs each.
A failed assertion lists what was enqueued.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..arguments import encode_arguments
from ..compat import TaskResult, framework_signals
from ..states import TaskStatus
from .runner import rdb_backend


@dataclass(frozen=True)
class Enqueued:
    """One enqueued task as an assertion compares it."""

    id: str
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue_name: str
    priority: int

    def __str__(self) -> str:
        call = ", ".join(
            [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        )
        return f"{self.task_path}({call}) queue={self.queue_name!r} id={self.id}"


def _path(task: Any) -> str:
    return task if isinstance(task, str) else task.module_path


def _matching(
    found: Sequence[Enqueued],
    task: Any,
    args: Sequence[Any] | None,
    kwargs: dict[str, Any] | None,
    queue: str | None,
) -> list[Enqueued]:
    # As the task would receive them: compared with what the enqueue stored.
    wanted_args, wanted_kwargs = None, None
    if args is not None or kwargs is not None:
        _, _, values, keywords = encode_arguments(args or [], kwargs or {})
        wanted_args = values if args is not None else None
        wanted_kwargs = keywords if kwargs is not None else None
    path = _path(task)
    return [
        e
        for e in found
        if e.task_path == path
        and (wanted_args is None or e.args == wanted_args)
        and (wanted_kwargs is None or e.kwargs == wanted_kwargs)
        and (queue is None or e.queue_name == queue)
    ]


def _describe(task: Any, args: Any, kwargs: Any, queue: str | None) -> str:
    parts = [_path(task)]
    if args is not None:
        parts.append(f"args={list(args)!r}")
    if kwargs is not None:
        parts.append(f"kwargs={kwargs!r}")
    if queue is not None:
        parts.append(f"queue={queue!r}")
    return " ".join(parts)


def _listing(found: Sequence[Enqueued], where: str) -> str:
    if not found:
        return f"Nothing was {where}."
    lines = "\n".join(f"  - {e}" for e in found)
    return f"{len(found)} {'task was' if len(found) == 1 else 'tasks were'} {where}:\n{lines}"


def _assert_enqueued(
    found: Sequence[Enqueued],
    where: str,
    task: Any,
    args: Sequence[Any] | None,
    kwargs: dict[str, Any] | None,
    count: int | None,
    queue: str | None,
) -> list[Enqueued]:
    matches = _matching(found, task, args, kwargs, queue)
    if (count is None and not matches) or (count is not None and len(matches) != count):
        expected = "at least once" if count is None else f"{count} time(s)"
        raise AssertionError(
            f"Expected {_describe(task, args, kwargs, queue)} {where} {expected}, "
            f"found {len(matches)}.\n{_listing(found, where)}"
        )
    return matches


def _assert_not_enqueued(
    found: Sequence[Enqueued],
    where: str,
    task: Any,
    args: Sequence[Any] | None,
    kwargs: dict[str, Any] | None,
    queue: str | None,
) -> None:
    matches = _matching(found, task, args, kwargs, queue)
    if matches:
        raise AssertionError(
            f"Expected no {_describe(task, args, kwargs, queue)} {where}, "
            f"found {len(matches)}.\n{_listing(found, where)}"
        )


class CapturedTasks(Sequence[Enqueued]):
    """The tasks enqueued in a ``captured_tasks()`` block, in order."""

    WHERE = "enqueued in the block"

    def __init__(self) -> None:
        self.results: list[TaskResult] = []

    @property
    def tasks(self) -> list[Enqueued]:
        return [
            Enqueued(
                id=r.id,
                task_path=r.task.module_path,
                args=list(r.args),
                kwargs=dict(r.kwargs),
                queue_name=r.task.queue_name,
                priority=r.task.priority,
            )
            for r in self.results
        ]

    def __getitem__(self, index: Any) -> Any:
        return self.tasks[index]

    def __len__(self) -> int:
        return len(self.results)

    def assert_enqueued(
        self,
        task: Any,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        count: int | None = None,
        queue: str | None = None,
    ) -> list[Enqueued]:
        """``task`` (with these args/kwargs/queue, if given) was enqueued in the block:
        at least once, or exactly ``count`` times. The matches."""
        return _assert_enqueued(self.tasks, self.WHERE, task, args, kwargs, count, queue)

    def assert_not_enqueued(
        self,
        task: Any,
        args: Sequence[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        queue: str | None = None,
    ) -> None:
        _assert_not_enqueued(self.tasks, self.WHERE, task, args, kwargs, queue)

    def __repr__(self) -> str:
        return f"<CapturedTasks: {len(self)} enqueued>"


@contextmanager
def captured_tasks() -> Iterator[CapturedTasks]:
    """Record every task enqueued (on any backend) while the block runs."""
    captured = CapturedTasks()

    def receive(sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
        captured.results.append(task_result)

    framework_signals.task_enqueued.connect(receive, weak=False)
    try:
        yield captured
    finally:
        framework_signals.task_enqueued.disconnect(receive)


def enqueued_tasks(task: Any = None, *, backend: str = "default") -> list[Enqueued]:
    """The tasks waiting to run (READY) in the backend's database, oldest first."""
    from ..models import Task as TaskRow

    rows = TaskRow.objects.using(rdb_backend(backend).database).filter(
        status=TaskStatus.READY, backend_name=backend
    )
    if task is not None:
        rows = rows.filter(task_path=_path(task))
    return [
        Enqueued(
            id=str(pk),
            task_path=path,
            args=_json(args),
            kwargs=_json(kwargs),
            queue_name=queue,
            priority=priority,
        )
        for pk, path, args, kwargs, queue, priority in rows.order_by(
            "enqueued_at", "pk"
        ).values_list("pk", "task_path", "args", "kwargs", "queue_name", "priority")
    ]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else value


WAITING = "waiting to run"


def assert_enqueued(
    task: Any,
    args: Sequence[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    count: int | None = None,
    queue: str | None = None,
    backend: str = "default",
) -> list[Enqueued]:
    """``task`` (with these args/kwargs/queue, if given) is waiting to run (READY) in the
    database: at least once, or exactly ``count`` times. The matches."""
    found = enqueued_tasks(backend=backend)
    return _assert_enqueued(found, WAITING, task, args, kwargs, count, queue)


def assert_not_enqueued(
    task: Any,
    args: Sequence[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    queue: str | None = None,
    backend: str = "default",
) -> None:
    """No ``task`` (with these args/kwargs/queue, if given) is waiting to run."""
    _assert_not_enqueued(enqueued_tasks(backend=backend), WAITING, task, args, kwargs, queue)
