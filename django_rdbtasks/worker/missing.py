"""Tasks this worker's code does not have: hand them back for a worker that does.

During a rolling deploy, workers of two releases serve the same queues. A
worker of the older one that claims a task new in the newer one cannot import
it (``loading.TaskNotHere``): it hands the task back, attempt unspent, to run
again after a delay that grows per path in this process (so it does not claim
the same task again and again), and a worker of the newer release runs it.
Only when the task has waited ``MISSING_TASK_GRACE`` (a backend option) since
it was first claimed, or since its last attempt, with nobody running it, does
it fail, saying so. Both ends are the database's clock, read from the claim.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass
from typing import Any

from ..conf import BackendOptions
from ..db.rows import ClaimedRow
from ..exceptions import InvalidTaskPath
from ..loading import TaskNotHere

#: How long a task this process cannot run may wait for one that can (seconds).
DEFAULT_GRACE = BackendOptions.missing_task_grace
#: The first hand-back's delay, doubled per hand-back of the same path, up to the cap.
FIRST_DELAY = 1.0
MAX_DELAY = 10.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """Hand the task back after ``delay`` seconds, or fail it with ``error``."""

    delay: float | None = None
    error: InvalidTaskPath | None = None


class MissingTasks:
    """The paths this process cannot import, shared by its lanes."""

    def __init__(self, grace: float = DEFAULT_GRACE) -> None:
        self.grace = grace
        self._lock = threading.Lock()
        self._handed_back: dict[str, int] = {}

    def decide(self, row: ClaimedRow, exc: TaskNotHere) -> Verdict:
        waited = (row.claimed_at - waiting_since(row)).total_seconds()
        if waited >= self.grace:
            error = InvalidTaskPath(
                f"{row.task_path!r}: no worker ran it for {waited:.0f}s "
                f"(MISSING_TASK_GRACE is {self.grace:g}s): every worker that claimed it "
                f"handed it back, and {exc}. Deploy the code that has it, then requeue "
                "the task."
            )
            error.__cause__ = exc
            return Verdict(error=error)
        with self._lock:
            count = self._handed_back.get(row.task_path, 0)
            self._handed_back[row.task_path] = count + 1
        return Verdict(delay=min(MAX_DELAY, FIRST_DELAY * 2**count))


def waiting_since(row: ClaimedRow) -> dt.datetime:
    """Since when nobody has run the task: its first claim, or the end of its last attempt."""
    since = row.started_at
    for entry in reversed(row.history):
        finished = _parse(entry.get("finished_at"))
        if finished is not None and finished.tzinfo is not None and since.tzinfo is not None:
            since = max(since, finished)
            break
    return since


def _parse(value: Any) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        return None


_by_backend: dict[str, MissingTasks] = {}
_by_backend_lock = threading.Lock()


def missing_tasks(backend: Any) -> MissingTasks:
    """This process's record for ``backend`` (one per backend alias, shared by the lanes)."""
    with _by_backend_lock:
        found = _by_backend.get(backend.alias)
        if found is None:
            found = _by_backend[backend.alias] = MissingTasks(backend.config.missing_task_grace)
        return found
