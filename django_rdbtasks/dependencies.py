"""Tasks that wait for others: ``enqueue_after`` and ``Workflow`` (chains, fan-out, fan-in).

A dependant is enqueued WAITING with a count of parents that have not
succeeded. Each parent's success decrements it, in the same transaction that
writes the parent's result, and the last one makes it READY; a parent that
fails for good ends its dependants (and theirs) CANCELLED or FAILED. So no
dependant is lost or started twice.

A workflow whose steps name a ``compensate_with`` task is a saga: it gets a
``models.Workflow`` row, recorded here with its tasks, and ``sagas.py`` moves
it on as they finish (see docs/workflows.md).
"""

from __future__ import annotations

import inspect
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from django.db import connections, transaction
from django.db.models import F
from django.db.models.functions import Coalesce, Greatest

from .backend_interface import TaskBackendInterface
from .compat import TASK_BASE_CLASSES, InvalidTask, Task, TaskResult
from .db import dialect_for
from .db.functions import DbNow
from .enqueueing import Enqueuer
from .exceptions import InvalidTaskPath, RDBTasksError
from .loading import check_loadable
from .models import Task as TaskRow
from .models import TaskDependency, TaskStatus, WorkflowStep
from .models import Workflow as WorkflowRow
from .states import StepRole

#: The keyword a compensation receives the result of the step it undoes by.
STEP_RESULT = "step_result"

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
    compensate_with: Task | None = None


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

    ``compensate_with=undo`` makes the workflow a saga (``sagas.py``): if a
    step fails for good, ``undo(*args, step_result=..., **kwargs)`` undoes
    this step, had it succeeded. ``name`` labels the workflow in the admin.
    """

    on_parent_failure: str = TaskStatus.CANCELLED
    name: str = ""
    _nodes: dict[str, _Node] = field(default_factory=dict)

    def add(
        self,
        name: str,
        task: Task,
        *args: Any,
        depends_on: Sequence[str] = (),
        on_parent_failure: str | None = None,
        compensate_with: Task | None = None,
        **kwargs: Any,
    ) -> str:
        if name in self._nodes:
            raise ValueError(f"The workflow already has a node named {name!r}.")
        policy = on_parent_failure or self.on_parent_failure
        if policy not in FAILURE_POLICIES:
            raise ValueError(f"on_parent_failure must be one of {FAILURE_POLICIES}.")
        if compensate_with is not None:
            check_compensation(task, compensate_with, args, kwargs)
        node = _Node(name, task, args, kwargs, list(depends_on), policy, compensate_with)
        self._nodes[name] = node
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
        order = self._ordered()
        saga = any(node.compensate_with is not None for node in order)
        if saga:
            self._check_saga(order)
        results: dict[str, TaskResult] = {}
        backends = {node.task.get_backend() for node in order}
        backend = next(iter(backends))
        if len(backends) != 1 or not isinstance(backend, TaskBackendInterface):
            raise ValueError("All tasks of a workflow must use one RDBTaskBackend.")
        enqueuer = Enqueuer(backend)
        with transaction.atomic(using=backend.database):
            for node in order:
                parent_ids = [results[p].id if p in self._nodes else p for p in node.depends_on]
                results[node.name] = _enqueue_child(enqueuer, node, parent_ids)
            if saga:
                _record_saga(backend.database, self.name, order, results)
        return results

    def _check_saga(self, order: list[_Node]) -> None:
        for node in order:
            outside = [p for p in node.depends_on if p not in self._nodes]
            if outside:
                # A step ended at enqueue by a parent outside the saga would
                # need compensating before the saga exists: refused instead.
                raise ValueError(
                    f"Step {node.name!r} of a workflow with compensations depends on "
                    f"{outside}, which are not steps of the workflow."
                )
            if getattr(node.task, "dedup_key", None) is not None:
                raise InvalidTask(
                    f"Step {node.name!r} has a dedup_key: in a workflow with compensations "
                    "every step must be a task of its own, not another workflow's."
                )
            if node.compensate_with is not None:
                try:
                    check_loadable(node.compensate_with.module_path)
                except InvalidTaskPath as exc:
                    raise InvalidTask(f"compensate_with of step {node.name!r}: {exc}") from exc


def check_compensation(step: Task, undo: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    """Refuse a ``compensate_with`` that a worker could not enqueue or run for this step."""
    if not isinstance(undo, TASK_BASE_CLASSES):
        raise InvalidTask(
            f"compensate_with must be a task (made with @task), not {type(undo).__name__}."
        )
    undo = cast(Task, undo)  # the framework's Task or the backport's: one interface
    if undo.backend != step.backend:
        raise InvalidTask(
            f"compensate_with {undo.module_path!r} uses the task backend {undo.backend!r}; "
            f"the step uses {step.backend!r}: they must be the same."
        )
    if getattr(undo, "dedup_key", None) is not None:
        raise InvalidTask(
            f"compensate_with {undo.module_path!r} has a dedup_key: a compensation must "
            "always be enqueued (use once_key to make its effect happen once)."
        )
    if STEP_RESULT in kwargs:
        raise InvalidTask(
            f"A step with compensate_with cannot take a keyword named {STEP_RESULT!r}: "
            "its compensation receives the step's result by that name."
        )
    undo.get_backend().validate_task(undo)
    signature = inspect.signature(undo.func)
    if undo.takes_context:
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    try:
        signature.bind(*args, **kwargs, **{STEP_RESULT: None})
    except TypeError as exc:
        raise InvalidTask(
            f"compensate_with {undo.module_path!r} cannot be called as "
            f"undo(*step_args, {STEP_RESULT}=..., **step_kwargs): {exc}."
        ) from exc


def _record_saga(using: str, name: str, order: list[_Node], results: dict[str, TaskResult]) -> None:
    """The workflow row and its steps, in the transaction that enqueued them."""
    workflow = WorkflowRow.objects.using(using).create(name=name)
    WorkflowStep.objects.using(using).bulk_create(
        WorkflowStep(
            task_id=results[node.name].id,
            workflow=workflow,
            name=node.name,
            role=StepRole.STEP,
            compensate_with=node.compensate_with.module_path if node.compensate_with else "",
        )
        for node in order
    )
    # The flag sends each step's outcome through the transaction that also
    # settles dependants (db/postgresql/dialect.py): there its workflow moves on.
    ids = [results[node.name].id for node in order]
    TaskRow.objects.using(using).filter(pk__in=ids).update(has_children=True)


def _enqueue_child(enqueuer: Enqueuer, node: _Node, parent_ids: list[str]) -> TaskResult:
    backend = enqueuer.backend
    backend.validate_task(node.task)
    new = enqueuer.new_task(node.task, node.args, node.kwargs)
    new.on_parent_failure = node.on_parent_failure
    if not parent_ids:
        return enqueuer.enqueue(node.task, new)
    rows = TaskRow.objects.using(backend.database)
    # Lock the parents (and flag them) before reading their status: a parent
    # finishing now either waits for this transaction or is seen finished.
    locked = rows.filter(pk__in=parent_ids).update(has_children=True)
    if locked != len(set(parent_ids)):
        # A parent that finished while this statement waited for its row has
        # moved to the table of finished rows (PostgreSQL: db/postgresql/finished.py),
        # where the statement, begun before, does not see it. A new one does.
        locked = rows.filter(pk__in=parent_ids).update(has_children=True)
    if locked != len(set(parent_ids)):
        raise ValueError(f"Unknown parent task among {parent_ids}.")
    statuses = dict(rows.filter(pk__in=parent_ids).values_list("pk", "status"))
    failed = [str(pk) for pk, status in statuses.items() if status in FAILURE_POLICIES]
    new.waiting_on = sum(1 for s in statuses.values() if s != TaskStatus.SUCCESSFUL)
    new.status = TaskStatus.WAITING if new.waiting_on else TaskStatus.READY
    result = enqueuer.enqueue(node.task, new)
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
    pairs = set(ready.values_list("queue_name", "priority"))
    # A child enqueued with run_after keeps it: released early, it still waits.
    # Either way its run_after is this statement's clock or later (notify_ready).
    run_after = Coalesce(Greatest(F("requested_run_after"), DbNow()), DbNow())
    if ready.update(status=TaskStatus.READY, run_after=run_after, version=F("version") + 1):
        connection = connections[using]
        with connection.cursor() as cursor:
            dialect_for(connection).notify_ready(cursor, pairs)


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
