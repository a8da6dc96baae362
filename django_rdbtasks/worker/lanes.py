"""A lane: one runner's claimed tasks, from claim to written outcome.

A worker process runs ``--threads`` lanes side by side, each under a worker
id of its own (not to be confused with a limit's slots, which a claim takes
in the database). A lane claims a few tasks ahead of the one it runs, so that
short tasks cost one round trip per batch instead of three per task. Two
threads share it: the runner runs the tasks one at a time, and the lane's
round thread writes their outcomes and claims the next ones while the runner
works, so neither waits for the other while tasks are short. The claimed-ahead
tasks must never wait behind a long one: the lease keeper hands them back
(released, attempt unspent) once the task ahead of them has run for
``HANDBACK_AFTER``, and the round thread claims nothing more behind it.
Everything here is guarded by the lane's lock, because the runner, the round
thread and the lease keeper all take from it; each task is taken by exactly
one.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ..db.frontier import ReadFrontier
from ..db.rows import RATE_START_WITHIN, ClaimedRow, Outcome
from .execution import Running

#: Longest the tasks claimed behind a running one wait before they are handed back.
HANDBACK_AFTER = 0.05
#: The same for a dead holder's task taken over (``Lane.hand_back_if_stuck``).
TAKEOVER_HANDBACK_AFTER = 1.0
#: Longest a finished outcome waits for the rest of its batch before it is written.
FLUSH_AFTER = 0.05
#: How soon an outcome is tried again when another session held its row locked.
BUSY_RETRY = 0.1
#: A lane claims more once what it holds is down to this share of what it wants.
#: A round of no-op tasks costs the server about as long as the runner takes
#: to run twice as many (31 µs a task against 15), so a lane that waited for
#: half to be left ran dry during every round: with one process, topping up
#: at three quarters drained 15 to 20 % more a second (docs/benchmarks.md,
#: 2026-11-27 18:54). Long tasks are unaffected: one at a time either way.
REFILL_AT = 0.75
#: How long a lane may go on claiming ahead past limited rows (rows without a
#: limit only, ``ClaimRequest.ahead``) before it lets its runner go dry and
#: claims in order again: the bound on how long a limited row whose key has a
#: free slot waits for a busy lane to come round (docs/limits.md).
IN_ORDER_WITHIN = 0.2
#: How long after its last claim in order a lane that ends limited tasks may
#: go on handing their slots to their keys' next tasks alone, reading nothing
#: else (``ClaimAhead.may_hand_over``): the bound on how long a row that comes
#: first in the claim's order waits for a lane busy with a key's chain.
HAND_OVER_WITHIN = 1.0
#: How long after a round claimed as many rows without a limit as it wanted (or
#: a read found one) such rows are taken to be waiting still, and how often at
#: most a process reads the database for them (``UnlimitedWaiting``): a few rounds.
UNLIMITED_WAITING_FOR = 0.05


class ClaimAhead:
    """How many tasks to claim at once: as many as fit in ``budget`` at the recent pace.

    A fixed ``--batch`` overrides it. Otherwise it starts at one, grows while
    tasks are short and falls back to one as soon as one is long, so a lane
    running long tasks claims them one at a time. At most ``most``: the round
    thread tops the queue up once a quarter of it has run (``REFILL_AT``), so
    the rest keeps the runner busy while the round is at the database.
    The budget, not ``most``, is what bounds a lane's claims ahead (50 ms of
    work); ``most`` is high so that no-op tasks come in rounds of hundreds: a
    round's planning and its fixed reads cost the server the same whatever
    its size (docs/benchmarks.md, 2026-11-27).
    """

    def __init__(self, fixed: int | None = None, *, budget: float = 0.05, most: int = 800) -> None:
        self.fixed = fixed
        self.budget = budget
        self.most = most
        #: Exponentially weighted mean of recent run times, in seconds (the
        #: first run sets it).
        self.pace: float | None = None
        #: The same of the tasks without a limit only: what a claim ahead may take.
        self.pace_unlimited: float | None = None
        #: When the lane last claimed in order (with nothing in flight), and
        #: whether its claims ahead since passed limited rows over.
        self.in_order_at = 0.0
        self.passing_limited = False
        #: Until when a claim in order would find what a claim ahead finds
        #: (``keys_full``), and the process's count of freed slots then.
        self.full_until = 0.0
        self.freed_then = 0

    def want(self) -> int:
        return self._fits(self.pace)

    def want_ahead(self) -> int:
        """How many to hold when claiming behind a running task: rows without a limit only.

        The running task and as many as wait behind it within the budget: with
        tasks of 30 ms, one waiting (where ``want()`` says one in all, so that a
        limited row claimed in order does not hold its slot idle while it
        waits). A lane running such tasks beside full keys' chains (issue 42)
        otherwise ran dry after each, its runner idle through every round
        (about 12 ms of each 33 ms a task where measured, 5 ms with one held
        ahead: docs/limits.md). A task that takes the budget or more has none
        claimed behind it."""
        pace = self.pace_unlimited
        if self.fixed is None and pace is not None and pace < self.budget:
            return min(self.most, 1 + int(self.budget / max(pace, 1e-6)))
        return self._fits(pace)

    def _fits(self, pace: float | None) -> int:
        if self.fixed is not None:
            return self.fixed
        if pace is None:
            return 1
        return max(1, min(self.most, int(self.budget / max(pace, 1e-6))))

    def to_claim(
        self,
        in_flight: int,
        running_for: float,
        holds_limited: bool = False,
        now: float = 0.0,
        ahead_only: bool = False,
    ) -> int:
        """How many to claim now: topped up to ``want()`` once down to ``REFILL_AT`` of it.

        ``in_flight``: the lane's tasks claimed and not finished; ``running_for``:
        how long its running task has run (0 when none runs). Nothing while that
        task has run for ``HANDBACK_AFTER``: the keeper hands back what waits
        behind it, and a claim would only be handed back too. And with one
        wanted at a time (tasks of the budget or longer), only once the runner
        is free: a task claimed behind a long one just waits.

        A claim behind a running task (``in_flight``) is a claim *ahead*: it
        takes rows without a limit only (``ClaimRequest.ahead``), sized by the
        pace of those alone, and none while the lane holds a limited task
        (its slot's next task is claimed by the round that ends it, the
        hand-over). Where that passed limited rows over, the lane claims in
        order again once ``IN_ORDER_WITHIN`` has gone by (``holds_limited``:
        a task it holds has a limit; ``now``: the monotonic clock).

        With ``ahead_only`` (``ClaimAhead.keys_full``, or rows without a limit
        waiting: ``UnlimitedWaiting``), a lane with nothing in flight claims
        ahead too, as many as the tasks without a limit fit.
        """
        if not in_flight:
            return self.want_ahead() if ahead_only else self.want()
        if holds_limited or running_for >= HANDBACK_AFTER:
            return 0
        if self.passing_limited and now - self.in_order_at > IN_ORDER_WITHIN:
            return 0
        target = self.want_ahead()
        if target == 1 or in_flight > target * REFILL_AT:
            return 0
        return target - in_flight

    def ahead_when_dry(
        self, now: float, freed: int, ends_limited: bool, unlimited_waiting: bool
    ) -> bool:
        """Whether the lane's claim, with nothing in flight, is still a claim ahead
        (rows without a limit only) rather than in order.

        While rows without a limit wait (``UnlimitedWaiting``): yes, they go
        first, unless the lane's claims ahead have passed limited rows over for
        ``IN_ORDER_WITHIN`` (so a limited row with a free slot waits that long at
        most, as behind a busy lane). A round that ends a limited task then
        frees its slot instead of handing it to its key's next task. Otherwise
        such a round is in order (the hand-over), and any other while a claim in
        order would find the keys full (``keys_full``; ``freed``: the process's
        count of freed slots)."""
        owes_in_order = self.passing_limited and now - self.in_order_at > IN_ORDER_WITHIN
        if unlimited_waiting and not owes_in_order:
            return True
        return not ends_limited and self.keys_full(now, freed)

    def found_keys_full(self, now: float, wait: float | None, freed: int) -> None:
        """A claim in order took rows without a limit only while keys with no free
        slot held limited rows back: every limited row before them in the claim's
        order waits for a slot. Until one comes free (``freed``, the process's
        count of slots freed, moves: an outcome told here or by NOTIFY), or by
        time (``wait``, the database's seconds until one does), and for
        ``IN_ORDER_WITHIN`` at most, a claim in order would take what a claim
        ahead takes: ``keys_full``."""
        within = IN_ORDER_WITHIN if wait is None else min(IN_ORDER_WITHIN, wait)
        self.full_until, self.freed_then = now + within, freed

    def found_keys_free(self) -> None:
        """A claim ahead of a dry lane found nothing: its next claim is in order."""
        self.full_until = 0.0

    def keys_full(self, now: float, freed: int) -> bool:
        """Whether the lane's next claim, though nothing is in flight, may be a claim
        ahead (rows without a limit only): a claim in order found keys full
        (``found_keys_full``) and nothing since can have freed one of their slots.

        A lane running short tasks without a limit beside full keys' chains
        (issue 42) otherwise claimed in order each time its runner ran dry,
        a round of the window or walk form for every task or two, each
        reading the keys it had just found full; ahead, it claims as many as
        fit its budget in the lean form's reads."""
        return now < self.full_until and freed == self.freed_then

    def may_hand_over(self, now: float) -> bool:
        """Whether a round that ends limited tasks may hand their slots to their keys'
        next tasks and read nothing else (``ClaimRequest.hand_over``): within
        ``HAND_OVER_WITHIN`` of the lane's last claim in order. So a row that
        comes first in the claim's order (an expired lease, a higher priority,
        another key's task with a free slot) waits that long at most for a lane
        busy with a key's chain to come round, as for one claiming ahead."""
        return now - self.in_order_at <= HAND_OVER_WITHIN

    def claimed(
        self, ahead: bool, passed_limited: bool, now: float, handed_over: bool = False
    ) -> None:
        """A claim was made: ``ahead`` of a running task or in order; ``passed_limited``:
        it took rows without a limit only where limited rows are; ``handed_over``: it
        was the hand-over alone, not a claim in order either."""
        if handed_over:
            return
        if not ahead:
            self.in_order_at, self.passing_limited = now, False
            self.found_keys_free()
        elif passed_limited:
            self.passing_limited = True

    def observe(self, duration: float, limited: bool = False) -> None:
        self.pace = self._paced(self.pace, duration)
        if not limited:
            self.pace_unlimited = self._paced(self.pace_unlimited, duration)

    @staticmethod
    def _paced(pace: float | None, duration: float) -> float:
        if pace is None or duration > pace:
            return duration  # slow down at once
        return 0.8 * pace + 0.2 * duration


class UnlimitedWaiting:
    """Whether rows without a limit wait in this process's queues: a round of any of
    its lanes claimed as many of them as it wanted, or a read of the database found
    one (``probed``), within ``UNLIMITED_WAITING_FOR``.

    While they do, a lane with nothing in flight claims ahead, rows without a
    limit only, and a lane that ends a limited task frees its slot instead of
    handing it to its key's next task (``ClaimAhead.ahead_when_dry``), so that
    those start as if the keys' backlog were not there (issue 42). Handed over,
    every slot of a full key was a chain of bodies on one lane, and the rows
    behind the keys' backlog had the lanes left over (0.57 to 0.65 of their
    rate alone where measured: docs/limits.md). The process's own rounds say
    nothing where every lane of it is in a key's chain, so a round that would
    hand a slot over reads the database first when nothing said so for that
    long (``probe_due``): one row of the claim ahead's read, at most once per
    ``UNLIMITED_WAITING_FOR`` a process. Wrong, it costs a round (the claim
    ahead finds nothing and the next claims in order) or one hand-over.
    """

    def __init__(self) -> None:
        self.seen_at = float("-inf")
        self.probed_at = float("-inf")

    def saw(
        self,
        claimed: Sequence[ClaimedRow],
        wanted: int,
        ahead: bool,
        now: float,
        contended: bool = False,
    ) -> None:
        """A round claimed ``claimed`` of the ``wanted`` it asked for (``ahead``: rows
        without a limit only, where limited rows are; ``contended``: others won rows
        it read, so it may have got fewer while more wait)."""
        if (
            claimed
            and (len(claimed) >= wanted or contended)
            and all(r.limit_key is None for r in claimed)
        ):
            self.seen_at = now
        elif ahead and not claimed and not contended:
            self.seen_at = float("-inf")  # none left

    def waiting(self, now: float) -> bool:
        return now - self.seen_at < UNLIMITED_WAITING_FOR

    def probe_due(self, now: float) -> bool:
        """Whether a round about to hand a slot over reads the database first: nothing
        said rows without a limit wait, and none read it, for ``UNLIMITED_WAITING_FOR``."""
        return now - max(self.seen_at, self.probed_at) >= UNLIMITED_WAITING_FOR

    def probed(self, found: bool, now: float) -> None:
        self.probed_at = now
        if found:
            self.seen_at = now


class StartAllowance:
    """How long after its claim a rate-limited task's body may still start
    (``ClaimRequest.start_within``): its rate slot comes free that much later.

    At least ``RATE_START_WITHIN``, and twice the slowest recent round: a
    body starts only once its claim has come back, so an allowance shorter
    than a round would give back every rate-limited task the lane claims,
    for as long as the database is that slow. The slowest round decays by a
    tenth at each round.
    """

    def __init__(self, least: float = RATE_START_WITHIN) -> None:
        self.least = least
        self.slowest = 0.0

    def observe(self, seconds: float) -> None:
        self.slowest = max(seconds, 0.9 * self.slowest)

    def seconds(self) -> float:
        return max(self.least, 2 * self.slowest)


@dataclass(slots=True)
class HandBack:
    """What the keeper took from a lane to write on its behalf."""

    unstarted: list[Running]
    finished: list[tuple[Outcome, Running]]


class Wake(threading.Event):
    """The process's wake-up (a task enqueued, a stop), which reaches busy round threads too.

    A round thread whose runner is busy waits on its lane's condition, not on
    this event: setting it also pokes every watched lane, so an enqueue
    notified while outcomes wait for their batch is claimed at once, not at
    the next poll.

    Round threads whose runnable rows all wait for a limit's slot wait in
    ``wait_for_slot``: a slot that comes free (``slot_freed``) wakes one of
    them per slot, not all, since one claim takes it. A slot freed while none
    waits is kept for the next to wait (at most one per round thread), so a
    thread that saw the keys full just before the slot came free does not
    sleep through it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lanes: tuple[Lane, ...] = ()
        self._slot_freed = threading.Condition()
        #: Slots freed and not yet taken up by a waiting round thread.
        self._freed = 0
        #: Slots freed since the process began: a lane that found keys full
        #: compares it with what it was then (``ClaimAhead.keys_full``).
        self.freed_count = 0

    def watch(self, lanes: list[Lane]) -> None:
        self._lanes = tuple(lanes)

    def set(self) -> None:
        super().set()
        with self._slot_freed:
            self._slot_freed.notify_all()
        for lane in self._lanes:
            lane.poke()

    def slot_freed(self, count: int = 1) -> None:
        """``count`` limit slots came free: wake as many round threads waiting for one."""
        with self._slot_freed:
            self._freed = min(self._freed + count, max(1, len(self._lanes)))
            self.freed_count += count
            self._slot_freed.notify(count)

    def _frontiers(self) -> list[ReadFrontier]:
        return [lane.frontier for lane in self._lanes if lane.frontier is not None]

    def lower(self, queue: str, priority: int, start: dt.datetime) -> None:
        """Rows of ``queue`` committed by a transaction begun at ``start``: every
        lane's next read of them starts there at the latest (db/frontier.py)."""
        for frontier in self._frontiers():
            frontier.lower(queue, priority, start)

    def reread(self) -> None:
        """Rows may have been made that no notification announced: every lane's
        next claim reads from the head (db/frontier.py)."""
        for frontier in self._frontiers():
            frontier.reread()

    def listening(self, connected: bool) -> None:
        """The listener's connection is up, or down (notifications are lost meanwhile)."""
        for frontier in self._frontiers():
            frontier.listening(connected)

    def wait_for_slot(self, timeout: float) -> None:
        """Until a limit's slot comes free, the wake-up is set, or ``timeout``."""
        with self._slot_freed:
            if not self._freed and not self.is_set():
                self._slot_freed.wait(timeout)
            if self._freed:
                self._freed -= 1


class Lane:
    def __init__(self, index: int, worker_id: str, frontier: ReadFrontier | None = None) -> None:
        self.index = index
        self.worker_id = worker_id
        #: Where the round thread's claims read from (a worker that listens; db/frontier.py).
        self.frontier = frontier
        self.lock = threading.Lock()
        #: Notified whenever tasks are queued, taken or finished.
        self._changed = threading.Condition(self.lock)
        #: Counts those changes: a waiter that read it before deciding to wait
        #: misses none.
        self.generation = 0
        #: Threads waiting for a change (nobody to notify: no notify).
        self._waiting = 0
        #: No more tasks will be queued: the runner ends once the queue is empty.
        self._closed = False
        #: The round thread lost its connection: the runner drops its own
        #: (the tasks') before it runs the next task. A plain flag.
        self.connections_lost = False
        self._queue: deque[Running] = deque()
        #: A task with a limit was claimed since the lane last held nothing (``holds_limited``).
        self._holds_limited = False
        self._current: Running | None = None
        self._current_since = 0.0
        self._finished: list[tuple[Outcome, Running]] = []
        self._first_finished_at = 0.0
        #: The keeper took claims from this lane and has not yet written them
        #: back: until it does they are RUNNING under this lane's id, and a
        #: claim cannot see them (burst mode must not take that for drained).
        self._handed_back_unwritten = False
        #: The round thread's: how long its rate-limited bodies may start after their claim.
        self.start_allowance = StartAllowance()

    def _touch(self) -> None:
        # Called with the lock held.
        self.generation += 1
        if self._waiting:
            self._changed.notify_all()

    def _wait(self, timeout: float) -> None:
        # Called with the lock held.
        self._waiting += 1
        try:
            self._changed.wait(timeout)
        finally:
            self._waiting -= 1

    def poke(self) -> None:
        """Wake whoever waits on the lane, to look again at what it waits for."""
        with self.lock:
            self._touch()

    # -- the round thread --------------------------------------------------------------

    def add(self, rows: list[ClaimedRow]) -> None:
        """Queue claimed rows in claim order (a claim's answer comes in no order).

        Those already waiting are ordered with them: a task of a higher
        priority claimed later still runs first.
        """
        with self.lock:
            if not self._holds_limited:
                self._holds_limited = any(row.limit_key is not None for row in rows)
            waiting = [*self._queue, *(Running(row, self.worker_id) for row in rows)]
            waiting.sort(key=_claim_order)
            self._queue = deque(waiting)
            self._touch()

    def in_flight(self) -> int:
        """Tasks queued or running: claimed, outcome not known yet."""
        with self.lock:
            return len(self._queue) + (self._current is not None)

    def running_for(self, now: float) -> float:
        """How long the running task has run (0 when none runs)."""
        with self.lock:
            return now - self._current_since if self._current is not None else 0.0

    def holds_limited(self) -> bool:
        """Whether it may hold a task with a limit's slot: one was claimed since the
        lane last held nothing (kept so, not counted, as tasks leave the queue
        by several ways; the lane runs dry before it claims ahead again)."""
        with self.lock:
            if self._holds_limited and not self._queue and self._current is None:
                self._holds_limited = False
            return self._holds_limited

    def idle(self) -> bool:
        """Nothing queued, nothing running, nothing finished to write."""
        with self.lock:
            return not self._queue and self._current is None and not self._finished

    def wait_changed(self, generation: int, timeout: float) -> None:
        """Wait until something changed since ``generation`` was read, or ``timeout``."""
        with self.lock:
            if self.generation == generation:
                self._wait(timeout)

    def close(self) -> None:
        """No more tasks will be queued: the runner ends once it has run what is queued."""
        with self.lock:
            self._closed = True
            self._touch()

    # -- the runner --------------------------------------------------------------------

    def next_task(self, stop: threading.Event, poll: float = 1.0) -> Running | None:
        """The next claimed task to run, waiting for one; None once closed or ``stop`` is set.

        ``stop`` is an event of its own, not this condition: whoever sets it pokes
        the lane (``Worker.stop`` sets the wake-up, which pokes every lane), so
        ``poll`` only bounds a wait that a missed poke would leave open."""
        with self.lock:
            while not stop.is_set():
                running = self._take_next()
                if running is not None:
                    return running
                if self._closed:
                    return None
                self._wait(poll)
            return None

    def take_next(self) -> Running | None:
        """The next claimed task to run (None when there is none), without waiting."""
        with self.lock:
            return self._take_next()

    def _take_next(self) -> Running | None:
        while self._queue:
            running = self._queue.popleft()
            if running.lost:
                continue  # reclaimed by someone else while it waited
            self._current = running
            self._current_since = time.monotonic()
            # Counted, not notified: a task taken changes nothing the round
            # thread waits for (what is in flight, whether the lane is idle,
            # when its outcomes flush), and waking it for each task cost a
            # thread switch a task, with the GIL held (docs/limits.md).
            self.generation += 1
            return running
        return None

    def finish(self, outcome: Outcome, running: Running) -> None:
        with self.lock:
            self._current = None
            if not self._finished:
                self._first_finished_at = time.monotonic()
            self._finished.append((outcome, running))
            self._touch()

    def ends_limited(self) -> bool:
        """Whether a task it finished, outcome not yet written, had a limit: the round
        that writes it may hand its slot to its key's next task."""
        with self.lock:
            return any(running.row.limit_key is not None for _, running in self._finished)

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
        return self.flush_in() <= 0

    def flush_in(self) -> float:
        """Seconds until the finished outcomes have waited long enough (inf: none waits).

        None longer once the runner has nothing left: no later outcome would
        join them, and the next round should be a claim alone.
        """
        with self.lock:
            if not self._finished:
                return float("inf")
            if not self._queue and self._current is None:
                return 0.0
            return self._first_finished_at + FLUSH_AFTER - time.monotonic()

    def has_finished(self) -> bool:
        with self.lock:
            return bool(self._finished)

    def take_unstarted(self) -> list[Running]:
        with self.lock:
            unstarted = list(self._queue)
            self._queue.clear()
            self._touch()
            return unstarted

    # -- the lease keeper --------------------------------------------------------------

    def hand_back_if_stuck(self, now: float, after: float = HANDBACK_AFTER) -> HandBack | None:
        """Take what waits behind a task that has run for ``after`` seconds.

        A dead holder's task taken over waits longer (``TAKEOVER_HANDBACK_AFTER``):
        handed back it is an ordinary READY row, behind every task of a higher
        priority, where its claim had taken it ahead of all of them.
        """
        with self.lock:
            if self._current is None or now - self._current_since < after:
                return None
            kept: deque[Running] = deque()
            if now - self._current_since < TAKEOVER_HANDBACK_AFTER:
                kept = deque(r for r in self._queue if r.row.lost_from is not None)
            unstarted = [r for r in self._queue if r.row.lost_from is None or not kept]
            if not unstarted and not self._finished:
                return None
            taken = HandBack(unstarted, self._finished)
            self._queue = kept
            self._finished = []
            self._handed_back_unwritten = True
            self._touch()
            return taken

    def hand_back_written(self) -> None:
        """The keeper has committed everything it took from this lane."""
        with self.lock:
            self._handed_back_unwritten = False
            self._touch()

    def handing_back(self) -> bool:
        """Claims taken from this lane are not yet back in the database."""
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
            self._touch()
            return taken

    def current(self) -> Running | None:
        with self.lock:
            return self._current

    def held(self) -> list[Running]:
        """Every claim this lane holds: waiting, running, finished but not yet written."""
        with self.lock:
            held = list(self._queue) + [running for _, running in self._finished]
            if self._current is not None:
                held.append(self._current)
            return held


def _claim_order(running: Running) -> tuple:
    """Takeovers of dead holders first, then rate-limited claims (whose bodies must
    start in time: ``ClaimedRow.start_by``), then by priority, oldest due first."""
    row = running.row
    return (row.lost_from is None, row.start_by is None, -row.priority, row.run_after)
