"""Tasks that wait for others: ``enqueue_after`` and ``Workflow`` (chains, fan-out, fan-in).

A dependant is enqueued WAITING with a count of parents that have not
succeeded. Each parent's success decrements it, in the same transaction that
writes the parent's result, and the last one makes it READY; a parent that
fails for good ends its dependants (and theirs) CANCELLED or FAILED. So no
dependant is lost or started twice.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction
from django.db.models import F
from django.db.models.functions import Coalesce, Greatest

from .compat import Task, TaskResult
from .db import dialect_for
from .db.functions import DbNow
from .exceptions import RDBTasksError
from .models import Task as TaskRow
from .models import TaskDependency, TaskStatus

FAILURE_POLICIES = (TaskStatus.CANCELLED, TaskStatus.FAILED)


class CycleError(RDBTasksError, ValueError):
    """The dependencies given form a cycle: nothing would ever run."""


class DependencyFailed(RDBTasksError):
    """Recorded as the error of a task whose parent failed for good."""


def _task_id(parent: TaskResult | str) -> str:
    return parent.id if isinstance(parent, TaskResult) else str(parent)


def enqueue_after(
    parents: Iterable[TaskResult | str],
    task: Task,
    *args: Any,
    on_parent_failure: str = TaskStatus.CANCELLED,
    **kwargs: Any,
) -> TaskResult:
    """Enqueue ``task(*args, **kwargs)`` to run once every parent has succeeded."""
    workflow = Workflow(on_parent_failure=on_parent_failure)
    workflow.add("task", task, *args, depends_on=[_task_id(p) for p in parents], **kwargs)
    return workflow.enqueue()["task"]


@dataclass
class _Node:
    name: str
    task: Task
    args: tuple
    kwargs: dict
    depends_on: list[str]
    on_parent_failure: str


@dataclass
class Workflow:
    """A set of tasks and the order between them, enqueued in one transaction.

    ::

        flow = Workflow()
        flow.add("fetch", fetch, url)
        flow.add("resize", resize, depends_on=["fetch"])      # fan-out...
        flow.add("index", index, depends_on=["fetch"])
        flow.add("publish", publish, depends_on=["resize", "index"])  # ...and fan-in
        results = flow.enqueue()   # {"fetch": TaskResult, ...}

    ``depends_on`` names other nodes of the workflow or ids of tasks already
    enqueued. ``chain(a, b, c)`` adds nodes that run one after the other.
    """

    on_parent_failure: str = TaskStatus.CANCELLED
    _nodes: dict[str, _Node] = field(default_factory=dict)

    def add(
        self,
        name: str,
        task: Task,
        *args: Any,
        depends_on: Sequence[str] = (),
        on_parent_failure: str | None = None,
        **kwargs: Any,
    ) -> str:
        if name in self._nodes:
            raise ValueError(f"The workflow already has a node named {name!r}.")
        policy = on_parent_failure or self.on_parent_failure
        if policy not in FAILURE_POLICIES:
            raise ValueError(f"on_parent_failure must be one of {FAILURE_POLICIES}.")
        self._nodes[name] = _Node(name, task, args, kwargs, list(depends_on), policy)
        return name

    def chain(self, *steps: tuple[str, Task, tuple, dict]) -> list[str]:
        """Add ``(name, task, args, kwargs)`` steps, each depending on the one before."""
        names: list[str] = []
        for name, task, args, kwargs in steps:
            self.add(name, task, *args, depends_on=names[-1:], **kwargs)
            names.append(name)
        return names

    def _ordered(self) -> list[_Node]:
        """Parents before children; refuses cycles."""
        order: list[_Node] = []
        state: dict[str, str] = {}

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == "done":
                return
            if state.get(name) == "visiting":
                raise CycleError(" -> ".join([*path, name]))
            state[name] = "visiting"
            for parent in self._nodes[name].depends_on:
                if parent in self._nodes:
                    visit(parent, [*path, name])
            state[name] = "done"
            order.append(self._nodes[name])

        for name in self._nodes:
            visit(name, [])
        return order

    def enqueue(self) -> dict[str, TaskResult]:
        from .backend import RDBTaskBackend

        order = self._ordered()
        results: dict[str, TaskResult] = {}
        backends = {node.task.get_backend() for node in order}
        backend = next(iter(backends))
        if len(backends) != 1 or not isinstance(backend, RDBTaskBackend):
            raise ValueError("All tasks of a workflow must use one RDBTaskBackend.")
        with transaction.atomic(using=backend.database):
            for node in order:
                parent_ids = [results[p].id if p in self._nodes else p for p in node.depends_on]
                results[node.name] = _enqueue_child(backend, node, parent_ids)
        return results


def _enqueue_child(backend: Any, node: _Node, parent_ids: list[str]) -> TaskResult:
    backend.validate_task(node.task)
    new = backend._new_task(node.task, node.args, node.kwargs)
    new.on_parent_failure = node.on_parent_failure
    if not parent_ids:
        return backend._enqueue_one(node.task, new)
    rows = TaskRow.objects.using(backend.database)
    # Lock the parents (and flag them) before reading their status: a parent
    # finishing now either waits for this transaction or is seen finished.
    locked = rows.filter(pk__in=parent_ids).update(has_children=True)
    if locked != len(set(parent_ids)):
        raise ValueError(f"Unknown parent task among {parent_ids}.")
    statuses = dict(rows.filter(pk__in=parent_ids).values_list("pk", "status"))
    failed = [str(pk) for pk, status in statuses.items() if status in FAILURE_POLICIES]
    new.waiting_on = sum(1 for s in statuses.values() if s != TaskStatus.SUCCESSFUL)
    new.status = TaskStatus.WAITING if new.waiting_on else TaskStatus.READY
    result = backend._enqueue_one(node.task, new)
    TaskDependency.objects.using(backend.database).bulk_create(
        TaskDependency(parent_id=pk, child_id=new.id) for pk in set(parent_ids)
    )
    if failed:
        end_dependants(backend.database, failed)
    return result


def release_dependants(using: str, succeeded: Sequence[Any]) -> None:
    """Count these parents' success in their children; start those with none left."""
    links = list(
        TaskDependency.objects.using(using)
        .filter(parent_id__in=succeeded)
        .values_list("child_id", flat=True)
    )
    if not links:
        return
    rows = TaskRow.objects.using(using)
    by_count: dict[int, list[Any]] = defaultdict(list)
    for child, count in Counter(links).items():
        by_count[count].append(child)
    for count, children in by_count.items():
        rows.among(children, TaskStatus.WAITING).update(waiting_on=F("waiting_on") - count)
    ready = rows.among(set(links), TaskStatus.WAITING).filter(waiting_on=0)
    queues = set(ready.values_list("queue_name", flat=True))
    # A child enqueued with run_after keeps it: released early, it still waits.
    run_after = Coalesce(Greatest(F("requested_run_after"), DbNow()), DbNow())
    if ready.update(status=TaskStatus.READY, run_after=run_after, version=F("version") + 1):
        connection = connections[using]
        with connection.cursor() as cursor:
            dialect_for(connection).notify(cursor, queues)


def end_dependants(using: str, failed: Sequence[Any]) -> None:
    """End the WAITING dependants of failed parents, and theirs, by their policy."""
    connection = connections[using]
    dialect = dialect_for(connection)
    frontier = list(failed)
    while frontier:
        # The children's status is read, not filtered on: the join then goes
        # by primary key, never through every WAITING row (see TaskQuerySet.among).
        links = [
            (parent, child, policy)
            for parent, child, policy, status in TaskDependency.objects.using(using)
            .filter(parent_id__in=frontier)
            .values_list("parent_id", "child_id", "child__on_parent_failure", "child__status")
            if status == TaskStatus.WAITING
        ]
        if not links:
            return
        ended: list[Any] = []
        for policy in FAILURE_POLICIES:
            children = {child for _, child, p in links if p == policy}
            if not children:
                continue
            parents = sorted({str(parent) for parent, child, _ in links if child in children})
            entry = {
                "outcome": str(policy),
                "exception_class_path": "django_rdbtasks.dependencies.DependencyFailed",
                "traceback": f"A task it depends on did not succeed: {', '.join(parents)}",
            }
            ids = [dialect.encode_id(child) for child in children]
            with connection.cursor() as cursor:
                dialect.end_waiting(cursor, ids, str(policy), json.dumps(entry))
            ended += children
        frontier = ended
