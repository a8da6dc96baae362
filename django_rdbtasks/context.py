"""What a running task can tell its worker, and ask it, through its context."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

from .compat import TaskContext
from .exceptions import HandOver
from .storable import StorageLimits, encode_storable

#: The longest a task may hand itself over for: a date past it is beyond what
#: every database's date arithmetic takes (MySQL's ends in 9999).
MAX_HAND_OVER_DELAY = 10 * 366 * 24 * 3600.0

#: "Not given": progress and checkpoint may be None, which a task can mean.
UNSET: Any = object()


class TaskControl(Protocol):
    checkpoint: Any
    limits: StorageLimits

    def should_stop(self) -> bool: ...

    def update(
        self, progress: float | None, message: str, checkpoint: Any, force: bool
    ) -> None: ...


# TaskContext is frozen in Django and in the backport; django-stubs declares it non-frozen.
@dataclass(frozen=True, slots=True, kw_only=True)
class RDBTaskContext(TaskContext):  # type: ignore[misc]
    """The framework's ``TaskContext`` plus progress, checkpoints and cooperative stop.

    ::

        @task(takes_context=True, timeout=3600)
        def reindex(context, table):
            start = (context.checkpoint or {}).get("offset", 0)
            for offset in range(start, total, 1000):
                if context.should_stop():
                    context.hand_over()          # another worker resumes at this offset
                index_rows(table, offset)
                context.report_progress(done=offset + 1000, total=total,
                                        checkpoint={"offset": offset + 1000})

    Progress and checkpoint writes are fenced by the task's claim (a worker
    that lost the task writes nothing) and throttled to one write per
    ``PROGRESS_INTERVAL`` seconds (backend option, default 1); the latest
    values are always written when the task stops.

    A checkpoint must be JSON that every database stores (``storable.py``: no
    NUL, no lone surrogate, at most ``OPTIONS["MAX_CHECKPOINT_BYTES"]``):
    anything else raises ``ValueNotStorable`` (or the ``TypeError`` of what is
    not JSON) here, in the task, and fails it unretried if it propagates. A
    progress message is text for people: kept to its 200 characters, with a
    NUL written ``\\x00``.
    """

    control: TaskControl = field(repr=False, compare=False)

    @property
    def checkpoint(self) -> Any:
        """The last checkpoint saved, by this attempt or an earlier one (None if none)."""
        return self.control.checkpoint

    def should_stop(self) -> bool:
        """True once the task should wrap up: shutdown, cancel, timeout or a lost lease.

        A task that sees True during a graceful shutdown and returns is released
        for another worker to resume from its checkpoint, attempt unspent.
        """
        return self.control.should_stop()

    def report_progress(
        self,
        fraction: float | None = None,
        *,
        done: int | None = None,
        total: int | None = None,
        message: str = "",
        checkpoint: Any = UNSET,
        force: bool = False,
    ) -> None:
        """Report how far the task is (a fraction, or done/total) and optionally a checkpoint."""
        if fraction is None and done is not None and total:
            fraction = done / total
        if fraction is not None:
            fraction = min(1.0, max(0.0, float(fraction)))
        if checkpoint is not UNSET:
            self._check(checkpoint)  # refuse what cannot be stored, here
        self.control.update(fraction, str(message), checkpoint, force)

    def save_checkpoint(self, checkpoint: Any, *, force: bool = False) -> None:
        """Save where to resume; the next attempt gets it as ``context.checkpoint``."""
        self._check(checkpoint)
        self.control.update(UNSET, "", checkpoint, force)

    def _check(self, checkpoint: Any) -> None:
        encode_storable(checkpoint, "the checkpoint", self.control.limits.checkpoint, "checkpoint")

    def hand_over(self, *, delay: float = 0.0) -> NoReturn:
        """Stop now and let any worker continue from the checkpoint, after ``delay`` seconds.

        The attempt is not spent. Raises; do not catch ``HandOver``.
        """
        if not 0 <= delay <= MAX_HAND_OVER_DELAY:  # NaN too
            raise ValueError(
                f"hand_over(delay=...) takes 0 to {MAX_HAND_OVER_DELAY:.0f} seconds, not {delay!r}."
            )
        raise HandOver(delay)
