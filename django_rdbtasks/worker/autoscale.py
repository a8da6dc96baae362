"""``runworkers --autoscale MIN:MAX``: how many worker processes the backlog calls for.

``AutoscalePolicy`` is the decision alone (numbers in, a process count out, no
database, no clock of its own), so it is tested without either. The supervisor
samples the load (``sample_load``: reads of a bounded number of rows) every ``interval``
seconds, asks the policy, and starts processes or stops one.

Hysteresis: the policy grows as soon as a sample shows a backlog (more
runnable tasks waiting unclaimed than ``backlog_per_process`` per process, or
the oldest of them waiting ``lag_threshold`` seconds), straight to the count
the backlog asks for; it shrinks only after ``idle_after`` seconds in which
every sample found nothing waiting and the tasks held fitting in one process
fewer, and then by one process, starting the idle period over. Between the
two (some backlog, not much) it holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from django.db.models import Count, Min

from ..states import TaskStatus


@dataclass(frozen=True, slots=True)
class Load:
    """What the queues a supervisor serves hold, at one sample."""

    #: READY and due: runnable, not claimed by anyone yet.
    ready: int
    #: RUNNING: claimed (running, or claimed ahead and waiting in a worker).
    running: int
    #: Seconds the oldest ready task has waited since it was due (None: none waits).
    lag: float | None = None


def parse_range(text: str) -> tuple[int, int]:
    """``"MIN:MAX"`` as two integers, 0 <= MIN <= MAX, MAX >= 1; ValueError otherwise."""
    low, sep, high = text.partition(":")
    try:
        minimum, maximum = int(low), int(high)
    except ValueError:
        message = f"--autoscale takes MIN:MAX (two integers, as 1:4), not {text!r}."
        raise ValueError(message) from None
    if not sep or minimum < 0 or maximum < 1 or minimum > maximum:
        raise ValueError(f"--autoscale MIN:MAX needs 0 <= MIN <= MAX and MAX >= 1, not {text!r}.")
    return minimum, maximum


@dataclass
class AutoscalePolicy:
    minimum: int
    maximum: int
    #: Tasks one process runs at once (``--threads``): what "fits in one process fewer" means.
    threads: int = 1
    #: Grow when more runnable tasks than this per process wait unclaimed.
    backlog_per_process: int = 100
    #: Grow when the oldest runnable task has waited this long (seconds).
    lag_threshold: float = 5.0
    #: Shrink by one after this many seconds of samples without backlog.
    idle_after: float = 60.0
    _idle_since: float | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.minimum <= self.maximum or self.maximum < 1:
            raise ValueError("autoscale needs 0 <= minimum <= maximum and maximum >= 1.")
        if self.backlog_per_process < 1 or self.threads < 1:
            raise ValueError("backlog_per_process and threads must be at least 1.")

    def desired(self, load: Load, current: int, now: float) -> int:
        """The process count for this sample; ``now`` is any monotonic clock in seconds."""
        if current < self.minimum or current > self.maximum:
            self._idle_since = None
            return min(max(current, self.minimum), self.maximum)
        if self._backlogged(load, current):
            self._idle_since = None
            # Straight to what the backlog asks for, at least one more.
            needed = math.ceil(load.ready / self.backlog_per_process)
            return min(self.maximum, max(current + 1, needed))
        if not self._quiet(load, current):
            self._idle_since = None  # the dead band: hold, and the idle period starts over
            return current
        if self._idle_since is None:
            self._idle_since = now
            return current
        if current > self.minimum and now - self._idle_since >= self.idle_after:
            self._idle_since = now  # the next one only after another whole idle period
            return current - 1
        return current

    def _backlogged(self, load: Load, current: int) -> bool:
        if current == 0:
            return load.ready + load.running > 0  # scaled to zero: anything wakes one
        if load.ready > self.backlog_per_process * current:
            return True
        return load.ready > 0 and load.lag is not None and load.lag >= self.lag_threshold

    def _quiet(self, load: Load, current: int) -> bool:
        return load.ready == 0 and load.running <= (current - 1) * self.threads


#: Rows a sample reads at most of each kind (ready, running): far more than any
#: ``backlog_per_process x maximum`` asks for, so the decision is the same, and
#: the sample costs the same with a backlog of a thousand or of ten million.
SAMPLE_CAP = 10_000


def sample_load(using: str, queues: list[str], cap: int = SAMPLE_CAP) -> Load:
    """One reading of the served queues: the clock, then reads of at most ``cap`` rows each.

    Each walks one partial index (the READY rows' arms in claim order,
    ``ready_conditions``; RUNNING by lease) and stops at ``cap``: a larger backlog
    reads as ``cap``, and its lag as that of the oldest among the rows read,
    which is the true lag whenever fewer wait.
    """
    from ..jobs import database_now
    from ..models import Task
    from ..models.ready import ready_conditions

    now = database_now(using)
    tasks = Task.objects.using(using).order_by().filter(queue_name__in=queues)
    ready, oldest = 0, None
    for arm in ready_conditions(using):
        found = (
            tasks.filter(arm, run_after__lte=now)
            .values("run_after")[:cap]
            .aggregate(count=Count("run_after"), oldest=Min("run_after"))
        )
        ready += found["count"] or 0
        if found["oldest"] is not None and (oldest is None or found["oldest"] < oldest):
            oldest = found["oldest"]
    running = tasks.filter(status=TaskStatus.RUNNING).values("id")[:cap].count()
    lag = max(0.0, (now - oldest).total_seconds()) if oldest is not None else None
    return Load(ready=min(ready, cap), running=running, lag=lag)
