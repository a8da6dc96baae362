"""Why is this task not running? Every condition the claim applies, evaluated for one task.

A worker claims a row when it is READY and due by the database clock (or
RUNNING with a lease that has lapsed), in a queue it serves that is not
paused, with a free slot of its limit key if it has one; a WAITING row waits
for its parents. ``explain`` asks each of those of one task, reading the same
columns with the same clock (``DbNow``), and says which hold it back, with
what to do: not due until when, its queue paused since when, no live worker
serving its queue, its limit key full (held by which tasks) or its rate window
spent (until when), the parents it waits for, the worker holding it (its last
heartbeat, its lease's end), the workers that handed it back for want of its
code, or that it is finished. Used by ``rdbtasks explain``, the admin's task
page, and from Python.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass, field
from typing import Any

from django.db import router
from django.db.models import Q

from .exceptions import InvalidTaskPath
from .jobs import database_now
from .loading import TaskNotHere, check_loadable
from .models import LimitSlot, Task, TaskDependency, Worker
from .queues import paused_queues
from .states import TaskStatus

#: A worker whose heartbeat is older than this is taken for gone (seconds): three
#: heartbeats of the default lease (30 s, renewed every 10 s).
ALIVE_WITHIN = 90.0


class Hold(enum.StrEnum):
    """What keeps a task from running now (or that nothing does)."""

    FINISHED = "finished"
    NOT_DUE = "not due"
    QUEUE_PAUSED = "queue paused"
    NO_WORKER = "no live worker serves its queue"
    LIMIT_FULL = "limit key full"
    RATE_SPENT = "rate window spent"
    WAITING_FOR_PARENTS = "waiting for parents"
    HELD = "held by a worker"
    LEASE_LAPSED = "lease lapsed"
    CODE_MISSING = "its code is missing"
    RUNNABLE = "runnable now"


@dataclass(frozen=True)
class Finding:
    hold: Hold
    #: One sentence a person can act on.
    message: str
    #: When it stops holding the task, where that is known (database clock).
    until: dt.datetime | None = None
    #: What it is about, for JSON and the admin: ids, names, counts.
    detail: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "hold": self.hold.value,
            "message": self.message,
            "until": self.until.isoformat() if self.until is not None else None,
            **({"detail": self.detail} if self.detail else {}),
        }


@dataclass(frozen=True)
class Explanation:
    task_id: str
    task_path: str
    status: str
    queue_name: str
    #: The database's now when it was asked.
    now: dt.datetime
    findings: list[Finding]

    @property
    def runnable(self) -> bool:
        """Whether a worker serving its queue would claim it now."""
        return [f.hold for f in self.findings] == [Hold.RUNNABLE]

    def holds(self) -> list[Hold]:
        return [f.hold for f in self.findings]

    def __str__(self) -> str:
        head = f"Task {self.task_id} {self.task_path} ({self.status}, queue {self.queue_name!r}):"
        lines = [head]
        lines += [f"- {finding.message}" for finding in self.findings]
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "task_path": self.task_path,
            "status": self.status,
            "queue_name": self.queue_name,
            "now": self.now.isoformat(),
            "runnable": self.runnable,
            "findings": [f.as_json() for f in self.findings],
        }


def explain(task_id: Any, *, using: str | None = None) -> Explanation:
    """Why the task ``task_id`` is not running (``Task.DoesNotExist`` if there is none)."""
    alias = using or router.db_for_write(Task)
    task = Task.objects.using(alias).get(pk=task_id)
    now = database_now(alias)
    findings = _findings(task, now, alias)
    return Explanation(
        task_id=str(task.pk),
        task_path=task.task_path,
        status=task.status,
        queue_name=task.queue_name,
        now=now,
        findings=findings or [_runnable(task, now, alias)],
    )


def _findings(task: Task, now: dt.datetime, alias: str) -> list[Finding]:
    status = task.status
    if status in TaskStatus.finished():
        return [_finished(task)]
    if status == TaskStatus.RUNNING:
        return [_holder(task, now, alias)]
    found: list[Finding] = []
    if status == TaskStatus.WAITING:
        found.append(_parents(task, alias))
    elif task.run_after is not None and task.run_after > now:
        found.append(_not_due(task, now))
    found += _queue(task, alias)
    if status == TaskStatus.READY and task.limit_key:
        found += _limit(task, now, alias)
    missing = _code_missing(task)
    if missing is not None:
        found.append(missing)
    return found


def _in(until: dt.datetime, now: dt.datetime) -> str:
    seconds = max(0.0, (until - now).total_seconds())
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _finished(task: Task) -> Finding:
    when = task.finished_at.isoformat() if task.finished_at is not None else "an unknown time"
    message = f"It is finished: {task.status} at {when}."
    if task.status == TaskStatus.FAILED and task.history:
        last = task.history[-1]
        error = str(last.get("exception_class_path") or "")
        if error:
            message = f"It is finished: FAILED at {when}, last with {error}."
    return Finding(Hold.FINISHED, message + " Requeue it to run it again.")


def _not_due(task: Task, now: dt.datetime) -> Finding:
    assert task.run_after is not None
    if task.attempts and task.started_at is not None:
        why = (
            f"its retry after attempt {task.attempts} of {task.max_attempts} waits out its backoff"
        )
    elif task.requested_run_after is not None:
        why = "it was enqueued to run then (run_after)"
    else:
        why = "it was handed back to run then"
    return Finding(
        Hold.NOT_DUE,
        f"It is not due until {task.run_after.isoformat()} (in {_in(task.run_after, now)}): {why}.",
        until=task.run_after,
    )


def _queue(task: Task, alias: str) -> list[Finding]:
    found = []
    paused = paused_queues(using=alias).get(task.queue_name)
    if paused is not None:
        by = f" by {paused.paused_by}" if paused.paused_by else ""
        found.append(
            Finding(
                Hold.QUEUE_PAUSED,
                f"Its queue {task.queue_name!r} is paused, since {paused.paused_at.isoformat()}"
                f"{by}: no worker claims from it until it is resumed "
                f"(rdbtasks resume {task.queue_name}).",
                detail={"paused_at": paused.paused_at.isoformat(), "paused_by": paused.paused_by},
            )
        )
    serving = [
        worker.name
        for worker in Worker.objects.using(alias).alive(ALIVE_WITHIN).only("name", "queues")
        if task.queue_name in (worker.queues or [])
    ]
    if not serving:
        found.append(
            Finding(
                Hold.NO_WORKER,
                f"No live worker serves its queue {task.queue_name!r} (none with a heartbeat "
                f"in the last {ALIVE_WITHIN:.0f}s lists it): start one "
                f"(manage.py runworkers --queue {task.queue_name}).",
            )
        )
    return found


def _limit(task: Task, now: dt.datetime, alias: str) -> list[Finding]:
    count = task.limit_count or 0
    slots = list(LimitSlot.objects.using(alias).filter(key=task.limit_key, slot_no__lt=count))
    if len(slots) < count or any(slot.is_free(now) for slot in slots):
        return []  # a slot is free (or missing: the next claim makes it)
    frees = min((s.free_at for s in slots if s.free_at is not None), default=None)
    if task.limit_period:
        return [
            Finding(
                Hold.RATE_SPENT,
                f"Its rate limit {task.limit_key!r} ({count} starts per {task.limit_period:g}s) "
                f"is spent for now: the next start is allowed at "
                f"{frees.isoformat() if frees else 'an unknown time'}"
                + (f" (in {_in(frees, now)})." if frees else "."),
                until=frees,
                detail={"key": task.limit_key, "limit": count, "period": task.limit_period},
            )
        ]
    holders = [slot.holder_id for slot in slots if slot.holder_id is not None]
    held_by = dict(Task.objects.using(alias).filter(pk__in=holders).values_list("pk", "worker_id"))
    listing = ", ".join(f"{pk} ({held_by.get(pk) or 'no worker'})" for pk in holders)
    return [
        Finding(
            Hold.LIMIT_FULL,
            f"Its limit key {task.limit_key!r} is full: all {count} slots are held, by "
            f"{listing or 'claims being written'}. It runs when one of them finishes.",
            until=frees,
            detail={"key": task.limit_key, "limit": count, "holders": [str(h) for h in holders]},
        )
    ]


def _parents(task: Task, alias: str) -> Finding:
    parent_ids = TaskDependency.objects.using(alias).filter(child=task).values("parent_id")
    waiting = list(
        Task.objects.using(alias)
        .filter(pk__in=parent_ids)
        .exclude(status=TaskStatus.SUCCESSFUL)
        .values_list("pk", "task_path", "status")
    )
    listing = ", ".join(f"{pk} {path} ({status})" for pk, path, status in waiting)
    return Finding(
        Hold.WAITING_FOR_PARENTS,
        f"It waits for {len(waiting)} parent task(s) to succeed: {listing or 'none found'}.",
        detail={"parents": [str(pk) for pk, _, _ in waiting]},
    )


def _holder(task: Task, now: dt.datetime, alias: str) -> Finding:
    lease = task.lease_expires_at
    name = ":".join(task.worker_id.split(":")[:2])
    worker = Worker.objects.using(alias).filter(name=name).first()
    if worker is not None:
        alive = worker.stopped_at is None and (
            (now - worker.last_heartbeat_at).total_seconds() <= ALIVE_WITHIN
        )
        seen = f"whose last heartbeat was at {worker.last_heartbeat_at.isoformat()}" + (
            "" if alive else ", and which looks gone"
        )
    else:
        seen = "which is not in the worker registry"
    if lease is not None and lease <= now:
        return Finding(
            Hold.LEASE_LAPSED,
            f"It is RUNNING, but the lease of worker {task.worker_id} ({seen}) lapsed at "
            f"{lease.isoformat()}: the next claim of a worker serving {task.queue_name!r} takes "
            "it over, its lost attempt recorded.",
            until=lease,
            detail={"worker_id": task.worker_id},
        )
    return Finding(
        Hold.HELD,
        f"It is running on worker {task.worker_id}, {seen}; its lease ends at "
        f"{lease.isoformat() if lease else 'an unknown time'} unless renewed (another "
        "worker takes it over only once the lease has lapsed).",
        until=lease,
        detail={"worker_id": task.worker_id},
    )


def _code_missing(task: Task) -> Finding | None:
    """This release cannot run the task: its workers hand it back, or fail it.

    Asked of this process's code, the same release as its workers' (the row
    keeps no trace of the workers that handed it back). A task claimed and
    given back unstarted has ``started_at`` set and its attempt unspent.
    """
    try:
        check_loadable(task.task_path)
    except TaskNotHere as exc:
        seen = (
            f"; claimed and handed back unstarted, last at {task.last_attempted_at.isoformat()}"
            if task.started_at is not None and task.last_attempted_at is not None
            else ""
        )
        return Finding(
            Hold.CODE_MISSING,
            f"This release has no code for it ({exc}){seen}: its workers hand it back, "
            "attempt unspent, for a worker of a release that has it, and it fails once "
            "nobody ran it for MISSING_TASK_GRACE. Deploy the release that has it.",
        )
    except InvalidTaskPath as exc:
        return Finding(
            Hold.CODE_MISSING,
            f"No worker will run it: {exc} It fails, unretried, when a worker claims it.",
        )
    return None


def _runnable(task: Task, now: dt.datetime, alias: str) -> Finding:
    """Nothing holds it: how many runnable tasks of its queue come before it."""
    # Rows due at the same instant are claimed in no promised order: counted as ahead.
    earlier = Q(priority__gt=task.priority) | Q(
        priority=task.priority, run_after__lte=task.run_after
    )
    ahead = (
        Task.objects.using(alias)
        .runnable()
        .filter(queue_name=task.queue_name)
        .filter(earlier)
        .exclude(pk=task.pk)
        .count()
    )
    return Finding(
        Hold.RUNNABLE,
        f"Nothing holds it: it is runnable now, with at most {ahead} runnable task(s) of "
        f"{task.queue_name!r} before it in the claim's order; it runs when a worker is free.",
        detail={"ahead": ahead},
    )
