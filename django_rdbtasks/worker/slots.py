"""A slot: one thread's claimed tasks, from claim to written outcome.

A slot claims a few tasks ahead of the one it runs, so that short tasks cost
one round trip per batch instead of three per task. The claimed-ahead tasks
must never wait behind a long one: the lease keeper hands them back (released,
attempt unspent) once the task ahead of them has run for ``HANDBACK_AFTER``.
Everything here is guarded by the slot's lock, because the slot's thread and
the lease keeper both take from it; each task is taken by exactly one.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from ..db.rows import ClaimedRow, Outcome
from .execution import Running

#: Longest the tasks claimed behind a running one wait before they are handed back.
HANDBACK_AFTER = 0.05
#: Longest a finished outcome waits for the rest of its batch before it is written.
FLUSH_AFTER = 0.05
#: How soon an outcome is tried again when another session held its row locked.
BUSY_RETRY = 0.1


class ClaimAhead:
    """How many tasks to claim at once: as many as fit in ``budget`` at the recent pace.

    A fixed ``--batch`` overrides it. Otherwise it starts at one, grows while
    tasks are short and falls back to one as soon as one is long, so a slot
    running long tasks claims them one at a time.
    """

    def __init__(self, fixed: int | None = None, *, budget: float = 0.05, most: int = 100) -> None:
        self.fixed = fixed
        self.budget = budget
        self.most = most
        #: Exponentially weighted mean of recent run times, in seconds.
        self.pace = budget

    def want(self) -> int:
        if self.fixed is not None:
            return self.fixed
        return max(1, min(self.most, int(self.budget / max(self.pace, 1e-6))))

    def observe(self, duration: float) -> None:
        if duration > self.pace:
            self.pace = duration  # slow down at once
        else:
            self.pace = 0.8 * self.pace + 0.2 * duration


@dataclass(slots=True)
class HandBack:
    """What the keeper took from a slot to write on its behalf."""

    unstarted: list[Running]
    finished: list[tuple[Outcome, Running]]


class Slot:
    def __init__(self, index: int, worker_id: str) -> None:
        self.index = index
        self.worker_id = worker_id
        self.lock = threading.Lock()
        self._queue: deque[Running] = deque()
        self._current: Running | None = None
        self._current_since = 0.0
        self._finished: list[tuple[Outcome, Running]] = []
        self._first_finished_at = 0.0
        #: The keeper took claims from this slot and has not yet written them
        #: back: until it does they are RUNNING under this slot's id, and a
        #: claim cannot see them (burst mode must not take that for drained).
        self._handed_back_unwritten = False

    # -- the slot's own thread ---------------------------------------------------------

    def add(self, rows: list[ClaimedRow]) -> None:
        """Queue claimed rows in claim order (a claim's answer comes in no order)."""
        ordered = sorted(rows, key=lambda r: (r.lost_from is None, -r.priority, r.run_after))
        with self.lock:
            self._queue.extend(Running(row, self.worker_id) for row in ordered)

    def take_next(self) -> Running | None:
        """The next claimed task to run (None when there is none)."""
        with self.lock:
            while self._queue:
                running = self._queue.popleft()
                if running.lost:
                    continue  # reclaimed by someone else while it waited
                self._current = running
                self._current_since = time.monotonic()
                return running
            return None

    def finish(self, outcome: Outcome, running: Running) -> None:
        with self.lock:
            self._current = None
            if not self._finished:
                self._first_finished_at = time.monotonic()
            self._finished.append((outcome, running))

    def take_finished(self) -> list[tuple[Outcome, Running]]:
        with self.lock:
            finished, self._finished = self._finished, []
            return finished

    def put_back_finished(self, finished: list[tuple[Outcome, Running]]) -> None:
        """Outcomes a round could not write: first in line for the next one."""
        if not finished:
            return
        with self.lock:
            if not self._finished:
                self._first_finished_at = time.monotonic()
            self._finished = finished + self._finished

    def should_flush(self) -> bool:
        """Outcomes have waited long enough for the rest of their batch."""
        with self.lock:
            return bool(self._finished) and (
                time.monotonic() - self._first_finished_at >= FLUSH_AFTER
            )

    def take_unstarted(self) -> list[Running]:
        with self.lock:
            unstarted = list(self._queue)
            self._queue.clear()
            return unstarted

    # -- the lease keeper --------------------------------------------------------------

    def hand_back_if_stuck(self, now: float, after: float = HANDBACK_AFTER) -> HandBack | None:
        """Take what waits behind a task that has run for ``after`` seconds."""
        with self.lock:
            if self._current is None or now - self._current_since < after:
                return None
            if not self._queue and not self._finished:
                return None
            taken = HandBack(list(self._queue), self._finished)
            self._queue.clear()
            self._finished = []
            self._handed_back_unwritten = True
            return taken

    def hand_back_written(self) -> None:
        """The keeper has committed everything it took from this slot."""
        with self.lock:
            self._handed_back_unwritten = False

    def handing_back(self) -> bool:
        """Claims taken from this slot are not yet back in the database."""
        with self.lock:
            return self._handed_back_unwritten

    def take_everything(self) -> HandBack:
        """All but the running task, which is returned in ``unstarted`` too (shutdown)."""
        with self.lock:
            held = list(self._queue)
            if self._current is not None:
                held.append(self._current)
            taken = HandBack(held, self._finished)
            self._queue.clear()
            self._finished = []
            return taken

    def current(self) -> Running | None:
        with self.lock:
            return self._current

    def held(self) -> list[Running]:
        """Every claim this slot holds: waiting, running, finished but not yet written."""
        with self.lock:
            held = list(self._queue) + [running for _, running in self._finished]
            if self._current is not None:
                held.append(self._current)
            return held
