"""Task states and the kinds of outcome a worker writes: defined once, here.

This module imports no models, so the SQL builders, the worker and the admin can
all use it. A ``TaskStatus`` is a ``str``: ``f"'{TaskStatus.READY}'"`` is the SQL
literal ``'READY'``. No other module spells a status out.
"""

from __future__ import annotations

import enum

from django.db.models import TextChoices
from django.utils.translation import gettext_lazy as _


class TaskStatus(TextChoices):
    """The framework's four statuses, plus two of this backend's own.

    A result read through the framework reports CANCELLED as FAILED (with a
    ``TaskCancelled`` error) and WAITING as READY, the nearest it knows.
    """

    READY = "READY", _("Ready")
    RUNNING = "RUNNING", _("Running")
    SUCCESSFUL = "SUCCESSFUL", _("Successful")
    FAILED = "FAILED", _("Failed")
    CANCELLED = "CANCELLED", _("Cancelled")
    #: Enqueued with ``depends_on``: becomes READY when every parent succeeded.
    WAITING = "WAITING", _("Waiting for dependencies")

    @classmethod
    def finished(cls) -> tuple[TaskStatus, ...]:
        return (cls.SUCCESSFUL, cls.FAILED, cls.CANCELLED)

    @classmethod
    def active(cls) -> tuple[TaskStatus, ...]:
        """The states a ``dedup_key`` is held in."""
        return (cls.READY, cls.RUNNING)


class WorkflowState(TextChoices):
    """Where a workflow (a set of dependent tasks with compensations) stands.

    See ``sagas.py``: RUNNING until every step succeeded (SUCCEEDED) or one
    failed for good (COMPENSATING, then COMPENSATED, or FAILED_TO_COMPENSATE
    when a compensation itself failed for good).
    """

    RUNNING = "RUNNING", _("Running")
    SUCCEEDED = "SUCCEEDED", _("Succeeded")
    #: A step failed for good: the steps that succeeded are being undone.
    COMPENSATING = "COMPENSATING", _("Compensating")
    #: Every step that succeeded (and named a compensation) was undone.
    COMPENSATED = "COMPENSATED", _("Compensated")
    #: A compensation failed for good: what it should have undone is not undone.
    FAILED_TO_COMPENSATE = "FAILED_TO_COMPENSATE", _("Failed to compensate")

    @classmethod
    def finished(cls) -> tuple[WorkflowState, ...]:
        return (cls.SUCCEEDED, cls.COMPENSATED, cls.FAILED_TO_COMPENSATE)


class StepRole(TextChoices):
    """What a task of a workflow is there for."""

    #: One of the steps the workflow was enqueued with.
    STEP = "STEP", _("Step")
    #: Undoes a step that succeeded, after another step failed for good.
    COMPENSATION = "COMPENSATION", _("Compensation")


class OutcomeKind(enum.StrEnum):
    """What a worker writes about a row it claimed, when it is done with it.

    Each database's dialect has one table saying what each kind writes; the
    properties below say what the kind means for the task.
    """

    #: The task returned; its value is stored.
    SUCCESS = "success"
    #: It raised, and no attempt is left (or retrying cannot help).
    FAILURE = "failure"
    #: It raised; it runs again after its backoff.
    RETRY = "retry"
    #: Given back unstarted, or unfinished on shutdown: the attempt is not spent.
    RELEASE = "release"
    #: Could not start now (a singleton already runs elsewhere): later, attempt unspent.
    POSTPONE = "postpone"
    #: The task gave itself back (or stopped early for a shutdown): checkpoint
    #: kept, attempt unspent, resumable after its delay.
    HANDOVER = "handover"
    #: Taken over from a lost worker with no attempt left: failed without running.
    ABANDON = "abandon"
    #: An operator cancelled it while it ran, and it stopped.
    CANCELLED = "cancelled"
    #: The lost attempt of a takeover recorded in the history; the claim is kept.
    NOTE = "note"

    @property
    def status(self) -> TaskStatus | None:
        """The state the row is left in (None: unchanged, still RUNNING)."""
        return _STATUS_AFTER[self]

    @property
    def spends_attempt(self) -> bool:
        """Whether the attempt the claim counted stays counted."""
        return self not in _UNSPENT

    @property
    def ends_task(self) -> bool:
        return self.status in TaskStatus.finished()

    @property
    def counts_as_failure(self) -> bool:
        return self in (OutcomeKind.FAILURE, OutcomeKind.ABANDON)

    @property
    def log_word(self) -> str:
        return _LOG_WORDS[self]


_STATUS_AFTER: dict[OutcomeKind, TaskStatus | None] = {
    OutcomeKind.SUCCESS: TaskStatus.SUCCESSFUL,
    OutcomeKind.FAILURE: TaskStatus.FAILED,
    OutcomeKind.RETRY: TaskStatus.READY,
    OutcomeKind.RELEASE: TaskStatus.READY,
    OutcomeKind.POSTPONE: TaskStatus.READY,
    OutcomeKind.HANDOVER: TaskStatus.READY,
    OutcomeKind.ABANDON: TaskStatus.FAILED,
    OutcomeKind.CANCELLED: TaskStatus.CANCELLED,
    OutcomeKind.NOTE: None,
}
_UNSPENT = frozenset(
    {OutcomeKind.RELEASE, OutcomeKind.POSTPONE, OutcomeKind.HANDOVER, OutcomeKind.ABANDON}
)
_LOG_WORDS: dict[OutcomeKind, str] = {
    OutcomeKind.SUCCESS: "succeeded",
    OutcomeKind.FAILURE: "failed",
    OutcomeKind.RETRY: "failed, will retry",
    OutcomeKind.RELEASE: "released unstarted",
    OutcomeKind.POSTPONE: "postponed",
    OutcomeKind.HANDOVER: "handed over",
    OutcomeKind.ABANDON: "failed (worker lost, no attempts left)",
    OutcomeKind.CANCELLED: "cancelled",
    OutcomeKind.NOTE: "noted",
}


class AttemptOutcome(enum.StrEnum):
    """The ``outcome`` of one entry of a task's history (one per attempt)."""

    SUCCESSFUL = "SUCCESSFUL"
    ALREADY_DONE = "ALREADY_DONE"
    RETRY = "RETRY"
    FAILED = "FAILED"
    HANDED_OVER = "HANDED_OVER"
    CANCELLED = "CANCELLED"
    LOST = "LOST"


class ClaimMode(enum.StrEnum):
    """How a worker claims: a version compare-and-set, or locking reads."""

    OPTIMISTIC = "optimistic"
    SKIP_LOCKED = "skip-locked"


class LimitKind(enum.StrEnum):
    """The kind of a cluster-wide limit, and the prefix of its keys (``rate:provider``)."""

    CONCURRENCY = "concurrency"
    RATE = "rate"
