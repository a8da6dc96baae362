"""The lease keeper: what a worker process does besides running tasks.

It has two halves, on two threads, so that nothing that watches the clock
ever waits on the network:

- The writer (``run_writer``, a thread of its own with its own connection), a
  tick every few milliseconds: renews the leases of every claim the process
  holds (and learns of cancel requests and lost claims), hands back tasks
  waiting behind a long one and writes them, writes the registry heartbeat.
  Its writes are tried once per tick; what could not be written is kept,
  still renewed, and tried again later. A call can block for as long as the
  connection's TCP bounds allow when the server is cut off silently.
- The watch (``watch``, on the process's main thread, with the signals and
  the supervisor watch): tells running tasks to stop when the worker stops,
  asks tasks past their timeout to stop, says when a renewal does not answer,
  and ends the process (``give_up``, a timed-out task) with its last writes
  bounded by ``LEAVE_WITHIN``: on a thread of their own, waited for at most
  that long, then the process exits whatever they did.

Only the writer takes from the lanes while the process runs (the lanes'
hand-back bookkeeping relies on it); on the way out the watch takes what is
left, under the same lock, after telling the writer to take nothing more.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from django.db import DatabaseError

from ..db.rows import Outcome
from ..observability import tracing
from ..retrying import Backoff, is_lost_race, race_logger
from .execution import Executor, Running
from .exits import EXIT_RECYCLE, EXIT_TIMED_OUT
from .lanes import BUSY_RETRY, HandBack, Lane
from .registry import Registry
from .reporting import Counters, Reporter
from .store import ClaimStore

logger = logging.getLogger("django_rdbtasks.worker")

__all__ = ["EXIT_RECYCLE", "LEAVE_WITHIN", "LeaseKeeper"]

#: How often the writer looks at the lanes while any of them holds a task.
TICK = 0.01
#: How often while none does (nothing to hand back, renew or write for them).
#: At most ``HANDBACK_AFTER``: a lane's first claim is seen this much later at
#: most, so the keeper ticks every ``TICK`` again by the time a task waiting
#: behind it can be due for a hand-back (``HANDBACK_AFTER`` after its runner
#: took the first), and the hand-back's bound holds.
IDLE_TICK = 0.05
#: Longest the last writes of a process that leaves (release the claims,
#: deregister) may take before it exits anyway: the leases free the rest.
LEAVE_WITHIN = 1.0


def renewal_patience(lease: float) -> float:
    """How long a renewal may go unanswered before the watch says so."""
    return max(1.0, min(2.0, lease / 6))


class LeaseKeeper:
    def __init__(
        self,
        *,
        lanes: Sequence[Lane],
        alias: str,
        database: str,
        executor: Executor,
        reporter: Reporter,
        counters: Counters,
        registry: Registry,
        lease: float,
        timeout_grace: float,
        stopping: Callable[[], bool],
        unstarted: Callable[[int], None] = lambda count: None,
    ) -> None:
        self.lanes = lanes
        self._lanes_by_id = {lane.worker_id: lane for lane in lanes}
        #: The writer's connection, made in its thread (``run_writer``).
        self.alias = alias
        self.database = database
        self.store: ClaimStore | None = None
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
        #: Told how many claims it handed back unstarted: they count for
        #: nothing against ``--max-tasks``, which counts what ran.
        self.unstarted = unstarted
        self.next_renewal = time.monotonic() + self.heartbeat_interval
        #: Outcomes taken from lanes that could not be written yet, per worker id.
        self._unwritten: dict[str, list[tuple[Outcome, Running]]] = {}
        #: After a failed write the next try waits, growing and jittered (never
        #: longer than a sixth of the lease): a tick every 10 ms must not
        #: reconnect and log a hundred times a second through an outage.
        self._write_backoff = Backoff(cap=max(0.05, lease / 6))
        self._write_after = 0.0
        #: Guards ``_unwritten`` and taking from the lanes between the writer
        #: and a leaving watch; never held across a database call.
        self._lock = threading.Lock()
        #: Set by the watch when the process leaves: the writer takes nothing more.
        self._leaving = threading.Event()
        #: Ticks the writer completed, so the watch can wait for one that
        #: began after the lanes ended.
        self.ticks = 0
        #: When the renewal in flight began (None: none is), and whether the
        #: watch already said it is late.
        self._renewing_since: float | None = None
        self._renewal_late_said = False
        self.renewal_patience = renewal_patience(lease)
        self._writer: threading.Thread | None = None
        self._writer_done = threading.Event()
        #: What ended the writer, if anything did before it was told to.
        self.crashed: BaseException | None = None

    # -- the writer's thread -----------------------------------------------------------

    def start(self, halt: threading.Event, *, goodbye: Callable[[], tuple[int, int]]) -> None:
        """Start the writer; once ``halt`` is set it writes what is left, deregisters, ends."""
        self._writer = threading.Thread(
            target=self.run_writer, args=(halt, goodbye), name="rdbtasks-keeper", daemon=True
        )
        self._writer.start()

    def run_writer(self, halt: threading.Event, goodbye: Callable[[], tuple[int, int]]) -> None:
        from django.db import connections

        try:
            self.store = ClaimStore(self.alias, self.database)
            while not halt.is_set() and not self._leaving.is_set():
                self.tick(time.monotonic())
                self.ticks += 1
                halt.wait(TICK if self.attending() else IDLE_TICK)
            if not self._leaving.is_set():
                done, failed = goodbye()
                try:
                    self.registry.deregister(done=done, failed=failed)
                except Exception as exc:  # the supervisor marks it on our behalf
                    logger.warning("could not deregister (%s)", exc)
        except BaseException as exc:
            # A defect, not an outage (those are retried): the main thread
            # ends the process rather than run tasks whose leases nobody renews.
            self.crashed = exc
            raise
        finally:
            if self.store is not None:
                self.store.close()
            connections.close_all()
            self._writer_done.set()

    def attending(self) -> bool:
        """Whether the next tick may have work: a lane holds a task, an outcome
        waits to be written, or the process stops."""
        if self.stopping() or self._leaving.is_set() or self.writing():
            return True
        return not all(lane.idle() for lane in self.lanes)

    def join(self, within: float) -> bool:
        """Wait at most ``within`` seconds for the writer to end; True if it did."""
        return self._writer is None or self._writer_done.wait(max(0.0, within))

    def tick(self, now: float) -> None:
        taken: list[tuple[str, HandBack]] = []
        with self._lock:
            if self._leaving.is_set():
                return
            for lane in self.lanes:
                if self.stopping():
                    # Claimed but not started: back to READY at once, for others.
                    taken.append(
                        (lane.worker_id, HandBack(lane.take_unstarted(), lane.take_finished()))
                    )
                    continue
                back = lane.hand_back_if_stuck(now)
                if back is not None:
                    self.unstarted(len(back.unstarted))
                    logger.debug(
                        "lane %s: handing back %d tasks waiting behind a long one",
                        lane.worker_id,
                        len(back.unstarted),
                    )
                    taken.append((lane.worker_id, back))
        for worker_id, back in taken:
            # Outside the lock: releasing a takeover writes its lost attempt.
            released = [(self.executor.release(r), r) for r in back.unstarted]
            with self._lock:
                self._keep(worker_id, back.finished + released)
        # Even when stopping, a failed write waits out its backoff (at most
        # lease / 6): through an outage or a row held locked, not every tick.
        if now >= self._write_after:
            self._write_kept()
        if now >= self.next_renewal:
            self.next_renewal = now + self.heartbeat_interval
            self.renew()

    # -- the watch (main thread: never waits on the network) -------------------------------

    def watch(self, now: float) -> None:
        if self.stopping():
            for lane in self.lanes:
                current = lane.current()
                if current is not None:
                    current.stop_requested = True  # context.should_stop() says True from now on
        self._watch_timeouts(now)
        since = self._renewing_since
        if (
            since is not None
            and not self._renewal_late_said
            and now - since > self.renewal_patience
        ):
            self._renewal_late_said = True
            logger.warning(
                "lease renewal failed: no answer from the database for %.1fs "
                "(server or network down?); still trying, the leases run out in %.0fs",
                now - since,
                self.lease,
            )

    # -- writing on a lane's behalf ------------------------------------------------------

    def _keep(self, worker_id: str, pairs: list[tuple[Outcome, Running]]) -> None:
        # Called with ``_lock`` held.
        if pairs:
            self._unwritten.setdefault(worker_id, []).extend(pairs)

    def _write_kept(self) -> None:
        assert self.store is not None
        with self._lock:
            kept = [(worker_id, list(pairs)) for worker_id, pairs in self._unwritten.items()]
        for worker_id, pairs in kept:
            if not pairs:
                continue
            try:
                # Outcomes the database refuses are failed there, one by one
                # (ClaimStore.finish); what reaches here is an outage.
                result = self.store.finish([outcome for outcome, _ in pairs], worker_id)
            except (DatabaseError, UnicodeError) as exc:
                what = f"writing {len(pairs)} outcomes"
                delay = self._retry_delay(what, exc, self._write_backoff)
                self._write_after = time.monotonic() + delay
                return
            self._write_backoff.reset()
            # Rows another session holds locked: tried again alone, a little
            # later; their leases are still renewed meanwhile (see renew).
            busy = [(o, r) for o, r in pairs if o.id in result.busy]
            with self._lock:
                if self._leaving.is_set():
                    return  # the watch took over what is left
                # What was taken from the lanes while this was written stays.
                later = self._unwritten.get(worker_id, [])[len(pairs) :]
                self._unwritten[worker_id] = busy + later
                if not busy and not later:
                    # Only this thread takes from the lanes: all it took is written now.
                    self._lanes_by_id[worker_id].hand_back_written()
            if busy:
                self._write_after = time.monotonic() + BUSY_RETRY
            done = [(o, r) for o, r in pairs if o.id not in result.busy]
            self.reporter.report(done, result.written)

    def writing(self) -> bool:
        """Outcomes taken from the lanes are still to be written."""
        with self._lock:
            return any(self._unwritten.values())

    # -- leases ------------------------------------------------------------------------

    def renew(self) -> None:
        assert self.store is not None
        for lane in self.lanes:
            with self._lock:
                unwritten = [r for _, r in self._unwritten.get(lane.worker_id, [])]
            held = lane.held() + unwritten
            claims = [(r.row.id, r.row.version) for r in held if not r.lost]
            if not claims:
                continue
            self._renewing_since = time.monotonic()
            try:
                limited = {r.row.id for r in held if r.row.limit_key is not None}
                still, cancel = self.store.renew(claims, lane.worker_id, self.lease, limited)
            except DatabaseError as exc:
                delay = self._retry_delay("lease renewal", exc, self.renewal_backoff)
                self.next_renewal = time.monotonic() + min(delay, self.heartbeat_interval)
                return
            finally:
                self._renewing_since = None
            if self._renewal_late_said:
                self._renewal_late_said = False
                logger.info("lease renewal answered again")
            # Only what is still held now: an outcome the lane wrote while the
            # renewal ran left RUNNING (so was not renewed) but was not lost.
            with self._lock:
                unwritten = [r for _, r in self._unwritten.get(lane.worker_id, [])]
            still_held = {id(r) for r in lane.held() + unwritten}
            for running in held:
                if id(running) not in still_held:
                    continue
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
        running_count = sum(len(lane.held()) for lane in self.lanes)
        self.registry.alive(running=running_count, done=done, failed=failed)

    def _retry_delay(self, what: str, exc: DatabaseError | UnicodeError, backoff: Backoff) -> float:
        """How long until ``what`` is tried again after ``exc``; 0: at the next tick."""
        if is_lost_race(exc):
            # A conflicting write won (on Galera, from another node): rolled
            # back whole, the connection is fine.
            race_logger.debug("%s lost a race (%s)", what, exc)
            return 0.0
        delay = backoff.next_delay()
        level = logging.WARNING if backoff.loud else logging.DEBUG
        logger.log(level, "%s failed (%s); retrying in %.2fs", what, exc, delay)
        if self.store is not None:
            self.store.close()
        return delay

    # -- timeouts and the end of a shutdown ----------------------------------------------

    def _watch_timeouts(self, now: float) -> None:
        """Ask a task past its timeout to stop; if it ignores that, recycle the process."""
        for lane in self.lanes:
            running = lane.current()
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
        self._leave(lambda r: failure if r is stuck else self.executor.release(r), EXIT_TIMED_OUT)

    def give_up(self) -> None:
        """The grace period is over: release every claim and leave at once."""
        logger.warning("grace period over; releasing unfinished tasks and exiting")
        self._leave(self.executor.release, 0)

    def _leave(self, outcome_for: Callable[[Running], Outcome], code: int) -> None:
        """Write what is left on a thread of its own, for at most ``LEAVE_WITHIN``; exit."""
        with self._lock:
            self._leaving.set()
            # Possibly being written by the writer right now as well: every
            # write is fenced, so the second one changes nothing.
            left = [
                (worker_id, HandBack([], list(pairs)))
                for worker_id, pairs in self._unwritten.items()
            ]
            left += [(lane.worker_id, lane.take_everything()) for lane in self.lanes]
        last = threading.Thread(
            target=self._write_before_leaving,
            args=(left, outcome_for),
            name="rdbtasks-leaving",
            daemon=True,
        )
        last.start()
        last.join(LEAVE_WITHIN)
        if last.is_alive():
            logger.warning(
                "the database did not take the last writes within %.1fs; leaving anyway, "
                "the leases free the tasks",
                LEAVE_WITHIN,
            )
        tracing.flush()  # os._exit skips the tracing SDK's own flush
        logging.shutdown()
        os._exit(code)

    def _write_before_leaving(
        self, left: list[tuple[str, HandBack]], outcome_for: Callable[[Running], Outcome]
    ) -> None:
        unwritten = False
        try:
            store = ClaimStore(self.alias, self.database)
            for worker_id, back in left:
                # Computed here: releasing a takeover writes its lost attempt.
                pairs = back.finished + [(outcome_for(r), r) for r in back.unstarted]
                if not pairs:
                    continue
                result = store.finish([outcome for outcome, _ in pairs], worker_id)
                unwritten = unwritten or bool(result.busy)
                self.reporter.report(
                    [(o, r) for o, r in pairs if o.id not in result.busy], result.written
                )
        except Exception as exc:  # leaving now whatever happens; the leases free the rest
            logger.warning("could not write before leaving (%s); leases will expire", exc)
            return
        if unwritten:
            logger.warning("some claims were not released; their leases will expire")
            # The supervisor marks the registration stopped.
            return
        with self.counters.lock:
            done, failed = self.counters.processed, self.counters.failed
        try:
            self.registry.deregister(done=done, failed=failed)
        except Exception as exc:  # the supervisor marks it on our behalf
            logger.debug("could not deregister before leaving (%s)", exc)
