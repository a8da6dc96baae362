"""The lease keeper: what a worker process does besides running tasks.

It runs on the process's main thread, a tick every few milliseconds, while
slot threads run tasks: it renews the leases of every claim the process holds
(and learns of cancel requests and lost claims), hands back tasks waiting
behind a long one, asks tasks past their timeout to stop and recycles the
process if they do not, acts on signals (whose handlers only set a flag) and
on the death of the supervisor, and ends the grace period of a shutdown.

Its writes are tried once per tick; what could not be written is kept, still
renewed, and tried again on the next tick, so a database outage never stops
the keeper from noticing a signal or a deadline.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence

from django.db import DatabaseError

from ..db.rows import Outcome
from ..observability import tracing
from ..retrying import Backoff, is_lost_race, race_logger
from .execution import Executor, Running
from .exits import EXIT_RECYCLE, EXIT_TIMED_OUT
from .registry import Registry
from .reporting import Counters, Reporter
from .slots import BUSY_RETRY, Slot
from .store import ClaimStore

logger = logging.getLogger("django_rdbtasks.worker")

__all__ = ["EXIT_RECYCLE", "LeaseKeeper"]


class LeaseKeeper:
    def __init__(
        self,
        *,
        slots: Sequence[Slot],
        store: ClaimStore,
        executor: Executor,
        reporter: Reporter,
        counters: Counters,
        registry: Registry,
        lease: float,
        timeout_grace: float,
        stopping: Callable[[], bool],
    ) -> None:
        self.slots = slots
        self._slots_by_id = {slot.worker_id: slot for slot in slots}
        self.store = store
        self.executor = executor
        self.reporter = reporter
        self.counters = counters
        self.registry = registry
        self.lease = lease
        self.heartbeat_interval = max(0.05, lease / 3)
        #: A failed renewal is tried again soon, not a heartbeat later: two
        #: failures a heartbeat apart would come close to losing the lease.
        self.renewal_backoff = Backoff()
        self.timeout_grace = timeout_grace
        self.stopping = stopping
        self.next_renewal = time.monotonic() + self.heartbeat_interval
        #: Outcomes taken from slots that could not be written yet, per worker id.
        self._unwritten: dict[str, list[tuple[Outcome, Running]]] = {}
        #: After a failed write the next try waits, growing and jittered (never
        #: longer than a sixth of the lease): a tick every 10 ms must not
        #: reconnect and log a hundred times a second through an outage.
        self._write_backoff = Backoff(cap=max(0.05, lease / 6))
        self._write_after = 0.0

    def tick(self, now: float) -> None:
        for slot in self.slots:
            if self.stopping():
                current = slot.current()
                if current is not None:
                    current.stop_requested = True  # context.should_stop() says True from now on
                # Claimed but not started: back to READY at once, for others.
                self._release(slot.worker_id, slot.take_unstarted())
                self._keep(slot.worker_id, slot.take_finished())
                continue
            taken = slot.hand_back_if_stuck(now)
            if taken is not None:
                logger.debug(
                    "slot %s: handing back %d tasks waiting behind a long one",
                    slot.worker_id,
                    len(taken.unstarted),
                )
                self._keep(slot.worker_id, taken.finished)
                self._release(slot.worker_id, taken.unstarted)
        # Even when stopping, a failed write waits out its backoff (at most
        # lease / 6): through an outage or a row held locked, not every tick.
        if now >= self._write_after:
            self._write_kept()
        self._watch_timeouts(now)
        if now >= self.next_renewal:
            self.next_renewal = now + self.heartbeat_interval
            self.renew()

    # -- writing on a slot's behalf ------------------------------------------------------

    def _keep(self, worker_id: str, pairs: list[tuple[Outcome, Running]]) -> None:
        if pairs:
            self._unwritten.setdefault(worker_id, []).extend(pairs)

    def _release(self, worker_id: str, unstarted: list[Running]) -> None:
        self._keep(worker_id, [(self.executor.release(r), r) for r in unstarted])

    def _write_kept(self) -> None:
        for worker_id, pairs in list(self._unwritten.items()):
            if not pairs:
                continue
            try:
                result = self.store.finish([outcome for outcome, _ in pairs], worker_id)
            except DatabaseError as exc:
                what = f"writing {len(pairs)} outcomes"
                delay = self._retry_delay(what, exc, self._write_backoff)
                self._write_after = time.monotonic() + delay
                return
            self._write_backoff.reset()
            # Rows another session holds locked: tried again alone, a little
            # later; their leases are still renewed meanwhile (see renew).
            busy = [(o, r) for o, r in pairs if o.id in result.busy]
            self._unwritten[worker_id] = busy
            if busy:
                self._write_after = time.monotonic() + BUSY_RETRY
            else:
                # Only this thread takes from the slots: all it took is written now.
                self._slots_by_id[worker_id].hand_back_written()
            done = [(o, r) for o, r in pairs if o.id not in result.busy]
            self.reporter.report(done, result.written)

    def writing(self) -> bool:
        """Outcomes taken from the slots are still to be written."""
        return any(self._unwritten.values())

    # -- leases ------------------------------------------------------------------------

    def renew(self) -> None:
        for slot in self.slots:
            held = slot.held() + [r for _, r in self._unwritten.get(slot.worker_id, [])]
            claims = [(r.row.id, r.row.version) for r in held if not r.lost]
            if not claims:
                continue
            try:
                still, cancel = self.store.renew(claims, slot.worker_id, self.lease)
            except DatabaseError as exc:
                delay = self._retry_delay("lease renewal", exc, self.renewal_backoff)
                self.next_renewal = time.monotonic() + min(delay, self.heartbeat_interval)
                return
            for running in held:
                task_id = running.row.id
                if task_id in cancel and not running.cancel:
                    running.cancel = True
                    running.stop_requested = True
                    logger.info("task %s: cancel requested; asking it to stop", task_id)
                if task_id not in still and not running.lost:
                    running.lost = True
                    running.stop_requested = True
                    logger.warning(
                        "task %s: lease lost (reclaimed or changed by someone else); "
                        "its result will not be written",
                        task_id,
                    )
        self.renewal_backoff.reset()
        with self.counters.lock:
            done, failed = self.counters.processed, self.counters.failed
        running_count = sum(len(slot.held()) for slot in self.slots)
        self.registry.alive(running=running_count, done=done, failed=failed)

    def _retry_delay(self, what: str, exc: DatabaseError, backoff: Backoff) -> float:
        """How long until ``what`` is tried again after ``exc``; 0: at the next tick."""
        if is_lost_race(exc):
            # A conflicting write won (on Galera, from another node): rolled
            # back whole, the connection is fine.
            race_logger.debug("%s lost a race (%s)", what, exc)
            return 0.0
        delay = backoff.next_delay()
        level = logging.WARNING if backoff.loud else logging.DEBUG
        logger.log(level, "%s failed (%s); retrying in %.2fs", what, exc, delay)
        self.store.close()
        return delay

    # -- timeouts and the end of a shutdown ----------------------------------------------

    def _watch_timeouts(self, now: float) -> None:
        """Ask a task past its timeout to stop; if it ignores that, recycle the process."""
        for slot in self.slots:
            running = slot.current()
            if running is None or running.timeout is None or running.started is None:
                continue
            elapsed = now - running.started
            if not running.timed_out and elapsed > running.timeout:
                running.timed_out = True
                running.stop_requested = True
                logger.warning(
                    "task %s ran past its timeout of %gs; asking it to stop",
                    running.row.id,
                    running.timeout,
                )
            elif running.timed_out and elapsed > running.timeout + self.timeout_grace:
                self._recycle_for(running)

    def _recycle_for(self, stuck: Running) -> None:
        """Fail the stuck task (retried if attempts remain), give the rest back, exit.

        A thread cannot be killed safely mid-write; a process can. The
        supervisor starts a fresh one.
        """
        failure = self.executor.timed_out(stuck, self.timeout_grace)
        logger.error("task %s %s", stuck.row.id, failure.error)
        self._abandon_everything(lambda r: failure if r is stuck else self.executor.release(r))
        tracing.flush()  # os._exit skips the tracing SDK's own flush
        logging.shutdown()
        os._exit(EXIT_TIMED_OUT)

    def give_up(self) -> None:
        """The grace period is over: release every claim and leave at once."""
        logger.warning("grace period over; releasing unfinished tasks and exiting")
        self._abandon_everything(self.executor.release)
        tracing.flush()  # os._exit skips the tracing SDK's own flush
        logging.shutdown()
        os._exit(0)

    def _abandon_everything(self, outcome_for: Callable[[Running], Outcome]) -> None:
        for slot in self.slots:
            taken = slot.take_everything()
            self._keep(slot.worker_id, taken.finished)
            self._keep(slot.worker_id, [(outcome_for(r), r) for r in taken.unstarted])
        try:
            self._write_kept()
        except Exception as exc:  # leaving now whatever happens; the leases free the rest
            logger.warning("could not write before leaving (%s); leases will expire", exc)
        if any(self._unwritten.values()):
            logger.warning("some claims were not released; their leases will expire")
            # The database did not take a write just now: no second one on
            # the way out. The supervisor marks the registration stopped.
            return
        with self.counters.lock:
            done, failed = self.counters.processed, self.counters.failed
        try:
            self.registry.deregister(done=done, failed=failed)
        except Exception as exc:  # the supervisor marks it on our behalf
            logger.debug("could not deregister before leaving (%s)", exc)
