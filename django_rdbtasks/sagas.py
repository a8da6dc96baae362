"""Sagas: workflows that undo what they did, moved on as their tasks finish.

A ``dependencies.Workflow`` whose steps name ``compensate_with`` has a
``models.Workflow`` row (``WorkflowState``). It is RUNNING, and SUCCEEDED when
every step has succeeded. When a step fails for good (FAILED, abandoned, or
CANCELLED by an operator), in the transaction that writes that outcome:

* the workflow becomes COMPENSATING, and its steps that never started
  (WAITING, or READY and never claimed) are CANCELLED, with their dependants;
* once no step is in flight (RUNNING, or READY between two attempts), at once
  or in the transaction that finishes the last of them, the compensations of
  the steps that succeeded are enqueued as one chain, the step that finished
  last undone first (database clock; ties in a fixed order, by id). Each
  compensation waits for the one before it to succeed, so they run one at a
  time. A compensation is an ordinary task, with its own retries, called as
  ``undo(*step_args, step_result=<the step's return value>, **step_kwargs)``;
* when the last compensation succeeds, the workflow is COMPENSATED (at once
  when no succeeded step named a compensation). A compensation that fails for
  good makes it FAILED_TO_COMPENSATE, and the compensations after it are
  CANCELLED (they are its dependants): what they would undo is left as it is,
  for an operator, and said so.

A failed step an operator requeues, and which then succeeds, is undone too:
its compensation is added at the end of the chain (a Compensated workflow is
Compensating again until it has run).

Every move is made under the workflow row's lock (an UPDATE of it), taken
before any other row of the settlement is touched (an operator's cancel takes
it before the step's row too: ``lock_workflows``), in the same transaction as
the outcome that causes it; that outcome is fenced by its claim. Its reads
need READ COMMITTED (checks.py, W041). A compensation's row is made by the
enqueue engine (``enqueueing.py``), under its limit. So a worker
killed before its commit leaves nothing done (the task is reclaimed and the
settlement made by whoever finishes it), and one killed after leaves it done
once: a chain of compensations is enqueued exactly once.
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.db.models import F

from .backend_interface import TaskBackendInterface
from .compat import task_backends
from .db.functions import DbNow
from .db.rows import NewTask
from .dependencies import STEP_RESULT, end_dependants, release_dependants
from .enqueueing import Enqueuer, insert_compensations
from .models import Task as TaskRow
from .models import TaskDependency, TaskStatus, WorkflowStep
from .models import Workflow as WorkflowRow
from .states import StepRole, WorkflowState

logger = logging.getLogger("django_rdbtasks.sagas")

#: Steps in these states may still succeed, and would then need undoing.
IN_FLIGHT = (TaskStatus.READY, TaskStatus.RUNNING)


class Member(NamedTuple):
    """A task of a workflow, as its ``WorkflowStep`` row says."""

    task_id: Any
    role: str
    name: str
    compensate_with: str
    undoes_id: Any


def settle_finished(using: str, succeeded: Sequence[str], failed: Sequence[str]) -> None:
    """Release or end the dependants of tasks that just finished, and move their workflows.

    ``failed``: ended for good without success (FAILED or CANCELLED). Runs in
    the caller's transaction, the one that wrote these outcomes.
    """
    finished = lock_workflows(using, [*succeeded, *failed])
    if succeeded:
        release_dependants(using, succeeded)
    if failed:
        end_dependants(using, failed)
    failures = {str(task_id) for task_id in failed}
    for workflow_id in sorted(finished):
        _advance(using, workflow_id, finished[workflow_id], failures)


def lock_workflows(using: str, task_ids: Sequence[str]) -> dict[Any, list[tuple[str, str, str]]]:
    """Lock the workflows of these tasks, in id order: ``{workflow: [(task, role, name)]}``.

    Before any other row: two workers settling tasks of one workflow then
    queue on its row, and neither waits for a task row the other has locked.
    Whoever writes a READY or WAITING step's outcome itself (an operator's
    cancel) calls this first, in its transaction, before it touches the step:
    a settlement cancels such steps under the workflow's lock. Taking it
    again in the same transaction (``settle_finished``) waits for nothing.
    """
    if not task_ids:
        return {}
    found: dict[Any, list[tuple[str, str, str]]] = defaultdict(list)
    for workflow_id, task_id, role, name in (
        WorkflowStep.objects.using(using)
        .filter(task_id__in=list(task_ids))
        .values_list("workflow_id", "task_id", "role", "name")
    ):
        found[workflow_id].append((str(task_id), role, name))
    for workflow_id in sorted(found):
        WorkflowRow.objects.using(using).filter(pk=workflow_id).update(version=F("version") + 1)
    return found


def _advance(
    using: str, workflow_id: Any, finished: list[tuple[str, str, str]], failures: set[str]
) -> None:
    workflow = WorkflowRow.objects.using(using).only("state", "reason").get(pk=workflow_id)
    state, reason = WorkflowState(workflow.state), workflow.reason
    for task_id, role, name in finished:
        if task_id not in failures:
            continue
        if role == StepRole.STEP and state == WorkflowState.RUNNING:
            state = WorkflowState.COMPENSATING
            reason = f"Step {name!r} ({task_id}) did not succeed."
        elif role == StepRole.COMPENSATION and state == WorkflowState.COMPENSATING:
            state = WorkflowState.FAILED_TO_COMPENSATE
            reason = (
                f"{reason} Its compensation {name!r} ({task_id}) did not succeed: "
                "it and the compensations after it are not done."
            ).strip()
    members = [
        Member(*row)
        for row in WorkflowStep.objects.using(using)
        .filter(workflow_id=workflow_id)
        .values_list("task_id", "role", "name", "compensate_with", "undoes_id")
    ]
    steps = [m.task_id for m in members if m.role == StepRole.STEP]
    undos = [m.task_id for m in members if m.role == StepRole.COMPENSATION]
    if state == WorkflowState.COMPENSATING:
        _cancel_unstarted(using, steps)
    statuses = dict(
        TaskRow.objects.using(using).filter(pk__in=steps + undos).values_list("pk", "status")
    )
    undone = {m.undoes_id for m in members if m.role == StepRole.COMPENSATION}
    # Steps that succeeded, name a compensation, and have none yet: the
    # compensating workflow's own, or one an operator requeued since.
    to_undo = [
        m.task_id
        for m in members
        if m.role == StepRole.STEP
        and m.compensate_with
        and m.task_id not in undone
        and statuses.get(m.task_id) == TaskStatus.SUCCESSFUL
    ]
    all_undone = not to_undo and all(statuses.get(pk) == TaskStatus.SUCCESSFUL for pk in undos)
    if state == WorkflowState.RUNNING:
        if all(statuses.get(pk) == TaskStatus.SUCCESSFUL for pk in steps):
            state = WorkflowState.SUCCEEDED
    elif state in (WorkflowState.COMPENSATING, WorkflowState.COMPENSATED):
        if any(statuses.get(pk) in IN_FLIGHT for pk in steps):
            pass  # its success would need undoing too: the chain waits for it
        elif to_undo:
            # Compensated, then a step an operator requeued succeeded: undone too.
            state = WorkflowState.COMPENSATING
            tail = _tail(using, undos)
            _enqueue_compensations(using, workflow_id, members, to_undo, tail, statuses)
        elif all_undone:
            state = WorkflowState.COMPENSATED
    elif state == WorkflowState.FAILED_TO_COMPENSATE and undos and all_undone:
        # An operator retried the failed compensation and the ones after it.
        state = WorkflowState.COMPENSATED
    if state != workflow.state or reason != workflow.reason:
        done = state in WorkflowState.finished()
        WorkflowRow.objects.using(using).filter(pk=workflow_id).update(
            state=state, reason=reason, finished_at=DbNow() if done else None
        )
        logger.info("Workflow %s: %s. %s", workflow_id, state.label, reason)


def _cancel_unstarted(using: str, steps: list[Any]) -> None:
    """Cancel the steps that never started, and end their dependants."""
    rows = TaskRow.objects.using(using)
    unstarted = list(rows.unstarted_among(steps).values_list("pk", flat=True))
    if not unstarted:
        return
    # Conditional again: a claim that committed since the read keeps its row.
    rows.unstarted_among(unstarted).update(
        status=TaskStatus.CANCELLED, finished_at=DbNow(), version=F("version") + 1
    )
    end_dependants(using, unstarted)


def _tail(using: str, undos: list[Any]) -> Any:
    """The last compensation of the chain so far (None: no chain yet)."""
    if not undos:
        return None
    parents = set(
        TaskDependency.objects.using(using)
        .filter(parent_id__in=undos, child_id__in=undos)
        .values_list("parent_id", flat=True)
    )
    return next(pk for pk in undos if pk not in parents)


def _enqueue_compensations(
    using: str,
    workflow_id: Any,
    members: list[Member],
    to_undo: list[Any],
    tail: Any,
    statuses: dict[Any, str],
) -> None:
    """Enqueue the compensations of these steps as a chain, after ``tail`` if there is one."""
    compensate_with = {m.task_id: (m.name, m.compensate_with) for m in members}
    done = (
        TaskRow.objects.using(using)
        .filter(pk__in=to_undo)
        .order_by("-finished_at", "-pk")
        .values_list("pk", "args", "kwargs", "return_value", "queue_name", "backend_name")
    )
    chain: list[tuple[Any, str, NewTask]] = []
    enqueuers: dict[str, Enqueuer] = {}
    for pk, args, kwargs, result, queue_name, backend_name in done:
        name, path = compensate_with[pk]
        if backend_name not in enqueuers:
            enqueuers[backend_name] = _enqueuer(backend_name)
        undo_kwargs = {**kwargs, STEP_RESULT: result}
        new = enqueuers[backend_name].compensation(path, args, undo_kwargs, queue_name)
        chain.append((pk, name, new))
    # The tail's success, if it is not committed yet, is settled after this
    # transaction (under the same workflow lock), and then sees the new link.
    after = tail if tail is not None and statuses.get(tail) != TaskStatus.SUCCESSFUL else None
    for position, (_, _, new) in enumerate(chain):
        if position or after is not None:
            new.status, new.waiting_on = TaskStatus.WAITING.value, 1
    insert_compensations(using, [new for _, _, new in chain])
    ids = [new.id for _, _, new in chain]
    TaskDependency.objects.using(using).bulk_create(
        TaskDependency(parent_id=before, child_id=child)
        for before, child in itertools.pairwise([after, *ids] if after is not None else ids)
    )
    WorkflowStep.objects.using(using).bulk_create(
        WorkflowStep(
            task_id=new.id,
            workflow_id=workflow_id,
            name=f"undo {name}",
            role=StepRole.COMPENSATION,
            undoes_id=pk,
        )
        for pk, name, new in chain
    )
    # Each one's outcome settles in a transaction of its own (see dependencies).
    TaskRow.objects.using(using).filter(pk__in=ids).update(has_children=True)


def _enqueuer(backend_name: str) -> Enqueuer:
    """The enqueue engine of the backend a step was enqueued by."""
    backend = task_backends[backend_name]
    if not isinstance(backend, TaskBackendInterface):
        raise TypeError(f"Task backend {backend_name!r} is not an RDBTaskBackend.")
    return Enqueuer(backend)
