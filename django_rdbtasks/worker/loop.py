"""One worker process: lanes that claim and run tasks, and the lease keeper.

Each lane (``lanes.py``) has a worker id of its own and two threads: its
round thread repeats one round (write the outcomes of the tasks it finished
and claim the next ones, in one statement on PostgreSQL, one transaction
elsewhere) while its runner runs what it claimed.
The lease keeper (``keeper.py``) writes from a thread of its own. The main
thread never waits on the network: signal handlers only record the signal, and
the main thread acts on it, on the supervisor's death and on the end of the
grace period within a tick, whatever the database does.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DatabaseError, connections
from django.utils.crypto import get_random_string

from ..backend import RDBTaskBackend
from ..compat import task_backends
from ..db import dialect_for
from ..db.frontier import ReadFrontier
from ..db.rows import ClaimRequest, Exchange
from ..retrying import retry_database
from ..schema import Reminder, tables_missing
from ..states import ClaimMode
from .beside import BesideWriter
from .budget import TaskBudget
from .connection import bound_user_connections, close_in_thread, open_in_thread, worker_alias
from .execution import Executor
from .exits import EXIT_AT_ONCE, EXIT_RECYCLE
from .keeper import LEAVE_WITHIN, LeaseKeeper
from .lanes import BUSY_RETRY, ClaimAhead, Lane, UnlimitedWaiting, Wake
from .processtree import ORPHAN_GRACE, ParentWatch
from .registry import Registry
from .reporting import Counters, Reporter
from .store import ClaimStore
from .task_connections import reconnect_task_connections, task_connection_broke

logger = logging.getLogger("django_rdbtasks.worker")

__all__ = ["EXIT_RECYCLE", "Worker"]

#: How often the main thread looks at signals, deadlines and the keeper while
#: the process starts or ends.
TICK = 0.01
#: How often it looks in between: a signal, a task's timeout or an orphaned
#: process is seen this much later at most. Ticking every 10 ms throughout was
#: about a tenth of an idle worker's CPU (docs/scaling.md, "An idle worker").
WATCH_EVERY = 0.05
#: How often a round thread waiting for its busy runner looks again on its own
#: (a wake-up pokes its lane: this is only the safety net).
BUSY_POLL = 0.01
#: How long past the database's ``wait`` a round thread held back by full keys
#: looks again: the slot comes free by the database's clock, a little later
#: than ours may say.
SLOT_CLOCK_MARGIN = 0.005
#: A signal this long after the first is a second one (exit at once); sooner,
#: it is the same request arriving twice (a process group and its supervisor).
SECOND_SIGNAL_AFTER = 0.2


class Worker:
    """Claims and runs tasks of some queues until stopped (or drained in burst mode)."""

    def __init__(
        self,
        *,
        backend: str = "default",
        queues: Sequence[str] | None = None,
        mode: str = ClaimMode.OPTIMISTIC,
        batch: int | None = None,
        threads: int = 1,
        lease: float = 30.0,
        poll_interval: float = 1.0,
        burst: bool = False,
        max_tasks: int | None = None,
        grace: float = 30.0,
        listen: bool = True,
        processors: bool = False,
        supervisor_pid: int | None = None,
    ) -> None:
        instance = task_backends[backend]
        if not isinstance(instance, RDBTaskBackend):
            raise ValueError(
                f"Task backend {backend!r} is {type(instance).__name__}, not RDBTaskBackend."
            )
        try:
            self.mode = ClaimMode(mode)
        except ValueError:
            raise ValueError("mode must be 'optimistic' or 'skip-locked'.") from None
        self.backend = instance
        self.database = instance.database
        vendor = connections[self.database].vendor
        #: Whether the database still has to be asked if it allows ``mode``
        #: (it could not be reached yet: asked again once it answers).
        self.mode_unchecked = False
        try:
            refusal = dialect_for(connections[self.database]).refuses_claim_mode(self.mode)
        except DatabaseError:
            refusal, self.mode_unchecked = None, True
        if refusal:
            raise ValueError(refusal)
        self.queues = sorted(queues or instance.queues)
        unknown = set(self.queues) - set(instance.queues)
        if unknown:
            raise ValueError(
                f"Queues {sorted(unknown)} are not among backend {backend!r}'s QUEUES "
                f"{sorted(instance.queues)}."
            )
        self.threads = max(1, threads)
        self.batch = batch  # None: claim ahead adaptively
        self.lease = lease
        self.progress_interval = instance.config.progress_interval
        self.timeout_grace = instance.config.timeout_grace
        self.poll_interval = poll_interval
        self.burst = burst
        self.max_tasks = max_tasks
        self.grace = grace
        #: Behind a transaction pooler (PgBouncer pool_mode=transaction).
        self.pooled = instance.config.transaction_pooling
        #: The alias LISTEN connects through: straight to the server, since a
        #: transaction pooler cannot keep a LISTEN between transactions.
        self.listen_database: str | None = instance.config.listen_database or (
            None if self.pooled else self.database
        )
        self.listen = listen and vendor == "postgresql" and instance.notify
        #: Said once, when the process runs (the supervisor also builds a Worker).
        self.polls_behind_pooler = self.listen and self.listen_database is None
        if self.polls_behind_pooler:
            self.listen = False
        self.processors = processors
        self.parent = ParentWatch(supervisor_pid)
        self.name = f"{socket.gethostname()}:{os.getpid()}"

        self.stopping = threading.Event()  # stop claiming, finish what runs
        self.halt = threading.Event()  # background threads end
        self.wake = Wake()
        self.unlimited_waiting = UnlimitedWaiting()
        self.stop_deadline = float("inf")
        self.counters = Counters()
        self.recycle = False
        self.budget = TaskBudget(max_tasks)
        self._signal_at: float | None = None
        self._signal_name = ""

    # -- lifecycle ---------------------------------------------------------------------

    def run(self, *, install_signals: bool = True) -> int:
        """Run until stopped; return the process exit code."""
        if install_signals and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        bound_user_connections(self.lease)
        alias = worker_alias(self.database, self.lease, pooled=self.pooled)
        store = ClaimStore(alias, self.database)
        registry = Registry(alias, self.name)
        reporter = Reporter(self.backend, self.counters, store.public_id)
        logger.info(
            "worker %s started: queues=%s mode=%s threads=%d batch=%s lease=%.1fs",
            self.name,
            ",".join(self.queues),
            self.mode,
            self.threads,
            self.batch or "auto",
            self.lease,
        )
        if self.polls_behind_pooler:
            logger.warning(
                "LISTEN cannot go through a transaction pooler and OPTIONS has no "
                "LISTEN_DATABASE: polling every %.1fs for new tasks instead",
                self.poll_interval,
            )
        reminder = Reminder()

        def register() -> bool:
            try:
                return registry.register(
                    queues=list(self.queues),
                    mode=str(self.mode),
                    threads=self.threads,
                    batch=self.batch or 0,
                )
            except DatabaseError as exc:
                # The supervisor waits for migrate before it starts us, but
                # not while the database did not answer: say it here too.
                if tables_missing(exc) and reminder.due(time.monotonic()):
                    logger.warning("the task tables are missing: run manage.py migrate")
                raise

        registered = self._off_the_main_thread(
            alias,
            lambda: retry_database(
                register,
                "register worker",
                alias=alias,
                stop=self.halt,
                give_up=self._signalled,
                log=logger,
            ),
        )
        if registered is None:  # signalled before the database ever answered
            return 0
        if self.mode_unchecked:
            refusal = dialect_for(store.connection).refuses_claim_mode(self.mode)
            if refusal:
                logger.error("%s", refusal)
                registry.deregister(done=0, failed=0)
                return 2
        # A lane's claims read from its frontier only where notifications
        # announce the rows committed behind it (db/frontier.py).
        lanes = [
            Lane(
                i,
                f"{self.name}:{i}:{get_random_string(6)}",
                ReadFrontier() if self.listen else None,
            )
            for i in range(self.threads)
        ]
        self.wake.watch(lanes)
        background = self._background_threads()
        keeper = LeaseKeeper(
            lanes=lanes,
            alias=alias,
            database=self.database,
            executor=self._executor(store),
            reporter=reporter,
            counters=self.counters,
            registry=registry,
            lease=self.lease,
            timeout_grace=self.timeout_grace,
            stopping=self.stopping.is_set,
            unstarted=self.budget.give_back,
        )
        threads = [
            threading.Thread(
                target=self._lane_main, args=(lane, alias), name=f"rdbtasks-lane-{lane.index}"
            )
            for lane in lanes
        ]
        for thread in background + threads:
            thread.start()
        keeper.start(self.halt, goodbye=self._totals)
        lanes_ended_at_tick: int | None = None
        try:
            while True:
                now = time.monotonic()
                self._watch_signals_and_parent(now)
                if now > self.stop_deadline:
                    keeper.give_up()
                keeper.watch(now)
                if keeper.crashed is not None:
                    raise RuntimeError("the lease keeper failed") from keeper.crashed
                if lanes_ended_at_tick is None:
                    if not any(thread.is_alive() for thread in threads):
                        lanes_ended_at_tick = keeper.ticks
                # Done once a tick that began after the lanes ended took what
                # they left, and the keeper wrote it all: a row another session
                # holds locked is waited for, within the grace once a stop is
                # asked for.
                elif keeper.ticks > lanes_ended_at_tick + 1 and not keeper.writing():
                    break
                ending = lanes_ended_at_tick is not None or self.stopping.is_set()
                time.sleep(TICK if ending else WATCH_EVERY)
        finally:
            self.stop()
            for thread in background:
                if thread.name.startswith("rdbtasks-processor-"):
                    thread.join(max(0.0, self.stop_deadline - time.monotonic()))
            self.halt.set()
            self.wake.set()
            # The keeper deregisters; a database that does not answer is
            # waited for no longer than what is left of the grace (the
            # supervisor marks the registration stopped instead).
            if not keeper.join(max(LEAVE_WITHIN, self.stop_deadline - time.monotonic())):
                logger.warning("could not deregister (the database does not answer)")
            store.close()
            connections.close_all()
        processed = self.counters.processed
        logger.info(
            "worker %s stopped after %d %s (%d claimed in %d claim statements), "
            "%d by a slot's hand-over",
            self.name,
            processed,
            "task" if processed == 1 else "tasks",
            self.counters.claimed,
            self.counters.claim_statements,
            self.counters.handed_over,
        )
        return EXIT_RECYCLE if self.recycle else 0

    def _off_the_main_thread(self, alias: str, call: Callable[[], bool | None]) -> bool | None:
        """``call`` on a thread of its own (with the worker connection ``alias``), watched.

        None as soon as a signal comes or the supervisor is gone: a call
        blocked on a server cut off silently is left to end on its own.
        """
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            open_in_thread(alias)
            try:
                outcome["value"] = call()
            except BaseException as exc:  # raised again on the main thread
                outcome["error"] = exc
            finally:
                close_in_thread(alias)
                done.set()

        threading.Thread(target=target, name="rdbtasks-register", daemon=True).start()
        while not done.wait(TICK):
            if self._signalled() or self.parent.orphaned():
                return None
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    def _totals(self) -> tuple[int, int]:
        with self.counters.lock:
            return self.counters.processed, self.counters.failed

    def stop(self, grace: float | None = None) -> None:
        """Stop claiming; running tasks get ``grace`` seconds before their claims are released."""
        deadline = time.monotonic() + (self.grace if grace is None else grace)
        self.stop_deadline = min(self.stop_deadline, deadline)
        if not self.stopping.is_set():
            self.stopping.set()
            self.wake.set()

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only record it: a handler runs between two bytecodes of whatever the
        # main thread was doing, possibly holding a lock it would need.
        now = time.monotonic()
        if self._signal_at is None:
            self._signal_name = signal.Signals(signum).name
            self._signal_at = now
        elif now - self._signal_at >= SECOND_SIGNAL_AFTER:
            os.write(2, b"second signal: exiting now; leases will expire and free the tasks\n")
            # The supervisor marks this process's registration stopped.
            os._exit(EXIT_AT_ONCE)

    def _signalled(self) -> bool:
        return self._signal_at is not None

    def _watch_signals_and_parent(self, now: float) -> None:
        if self._signal_at is not None and not self.stopping.is_set():
            logger.info(
                "signal %s: finishing running tasks (grace %.0fs), claiming no more",
                self._signal_name,
                self.grace,
            )
            self.stop()
        if self.parent.orphaned() and self.stop_deadline - now > ORPHAN_GRACE:
            logger.warning("supervisor is gone; stopping within %.0fs", ORPHAN_GRACE)
            self.stop(min(self.grace, ORPHAN_GRACE))

    # -- a lane ------------------------------------------------------------------------

    def _executor(self, store: ClaimStore) -> Executor:
        return Executor(
            self.backend,
            store,
            lease=self.lease,
            poll_interval=self.poll_interval,
            progress_interval=self.progress_interval,
            stopping=self.stopping,
        )

    def _lane_main(self, lane: Lane, alias: str) -> None:
        """The lane's round thread: writes outcomes and claims while its runner runs tasks."""
        store = ClaimStore(alias, self.database)
        executor = self._executor(store)
        reporter = Reporter(self.backend, self.counters, store.public_id)
        reporter.tell_in_background(f"rdbtasks-report-{lane.index}")
        ahead = ClaimAhead(self.batch)
        runner = threading.Thread(
            target=self._run_lane,
            args=(lane, alias, executor, ahead),
            name=f"rdbtasks-run-{lane.index}",
        )
        runner.start()
        writer = BesideWriter(alias, self.database, lane.worker_id, f"rdbtasks-beside-{lane.index}")
        try:
            self._rounds(lane, store, reporter, ahead, runner, writer)
        finally:
            writer.close()
            lane.close()
            # Its running task ends first (or the grace period ends the process).
            runner.join()
            self._finish_lane(lane, store, reporter, executor)
            reporter.close()
            store.close()
            connections.close_all()

    def _run_lane(self, lane: Lane, alias: str, executor: Executor, ahead: ClaimAhead) -> None:
        """The runner: the lane's tasks, one at a time, until the lane closes or a stop.

        Its own worker connection (made on first use) carries what a running task
        writes of itself: progress, checkpoints, a lost attempt's record."""
        own = open_in_thread(alias)
        dialect = dialect_for(own)
        limits = self.backend.storage_limits
        try:
            while True:
                running = lane.next_task(self.stopping)
                if running is None:
                    return
                # The round thread reconnected (an outage, a failover), or a task's
                # connection broke: connect again first, not at the cost of an attempt.
                if lane.connections_lost or task_connection_broke():
                    lost, lane.connections_lost = lane.connections_lost, False
                    reconnected = reconnect_task_connections(
                        lost,
                        self.database,
                        dialect.accepts_writes,
                        own=own,
                        stop=self.halt,
                        give_up=self.stopping.is_set,
                    )
                    if not reconnected or running.lost:
                        # Stopped first, or its lease lost meanwhile: given back unrun.
                        lane.finish(executor.release(running), running)
                        continue
                if running.row.start_by is not None and time.monotonic() > running.row.start_by:
                    # Too late for its rate limit's window: given back unstarted,
                    # its attempt unspent, its start spent (docs/limits.md).
                    lane.finish(executor.release(running), running)
                    continue
                outcome = executor.run(running)
                ahead.observe(outcome.duration, running.row.limit_key is not None)
                # Encoded here, not in the round thread; made storable first.
                dialect.encode_outcome(outcome, limits)
                lane.finish(outcome, running)
        finally:
            # Its own worker connection too: close_all() knows only DATABASES' aliases.
            close_in_thread(alias)
            connections.close_all()

    def _rounds(
        self,
        lane: Lane,
        store: ClaimStore,
        reporter: Reporter,
        ahead: ClaimAhead,
        runner: threading.Thread,
        writer: BesideWriter | None = None,
    ) -> None:
        while not self.stopping.is_set() and runner.is_alive():
            generation = lane.generation
            # With nothing in flight a claim is in order, unless rows without a
            # limit wait (they go first), or the last one in order found the keys
            # full and none can have freed a slot since (ClaimAhead.ahead_when_dry).
            ahead_only = lane.in_flight() == 0 and self._ahead_only(lane, ahead, store)
            want = self._refill(lane, ahead, ahead_only)
            if want:
                want = self.budget.take(want)  # 0 once --max-tasks is spent
                if want == 0 and lane.idle():
                    self.recycle = True
                    self.stop()
                    break
            if want == 0:
                if lane.should_flush():
                    self._round(lane, store, reporter, 0)
                else:
                    # Claimed enough ahead, or behind a long task: until the runner needs more.
                    lane.wait_changed(generation, min(lane.flush_in(), self.poll_interval))
                continue
            self.wake.clear()
            # Asked before the round: what a hand-back commits meanwhile, its claim missed.
            handing_back = lane.handing_back()
            behind = ahead_only or lane.in_flight() > 0
            hand_over = ahead.may_hand_over(time.monotonic())
            freed = self.wake.freed_count
            exchange = self._round(lane, store, reporter, want, behind, writer, hand_over)
            now = time.monotonic()
            ahead.claimed(behind, exchange.passed_limited, now, exchange.handed_over)
            self.unlimited_waiting.saw(exchange.claimed, want, behind, now, exchange.contended)
            if (
                not behind
                and exchange.held
                and exchange.claimed
                and all(row.limit_key is None for row in exchange.claimed)
            ):
                ahead.found_keys_full(now, exchange.wait, freed)
            self.budget.give_back(want - len(exchange.claimed))
            if ahead_only and not exchange.claimed:
                # No row without a limit left: in order at once, which waits for
                # a slot (``held``) where this one would only poll.
                ahead.found_keys_free()
                continue
            if exchange.claimed:
                lane.add(exchange.claimed)
                if len(exchange.claimed) < want and not exchange.contended:
                    # The queue had no more for now: a round at once would find nothing
                    # and take the server from the task just claimed. Until needed, or woken.
                    self._wait_busy(lane, lane.generation)
            elif not lane.idle():
                # Nothing to claim while the runner still has work: wait for
                # it to end (or for new tasks), not a round per finished task.
                self._wait_busy(lane, lane.generation)
            elif exchange.written:
                # What it just finished may have made more runnable (a
                # dependant released after the claim): look again at once.
                continue
            elif exchange.busy or handing_back or lane.handing_back():
                # Outcomes wait for a row another session holds locked, or the keeper
                # writes back (or wrote during the round) tasks it took from this
                # lane: a burst must not end before it can claim them again.
                self.wake.wait(BUSY_RETRY)
            elif exchange.contended:
                # Runnable rows were there but others won them, or hold
                # them locked: look again soon, not at once.
                self.wake.wait(random.uniform(0.005, 0.05))
            elif exchange.held:
                # Every runnable row waits for a limit's slot: until one comes
                # free (an outcome, told here or by NOTIFY), or a rate window
                # ends or a lease lapses (the database's ``wait``), not a poll
                # sooner. Burst mode does not end while they wait.
                self.wake.wait_for_slot(self._slot_wait(exchange.wait))
            elif (
                self.burst
                and not self._retries_pending(store)
                and not self._held_back_by_limits(store)
            ):
                if lane.frontier is not None and not lane.frontier.last_read_full:
                    # Found nothing from its frontier: a burst ends on a claim
                    # that read from the head (a notification may be on its way).
                    lane.frontier.reread()
                    continue
                break
            else:
                self.wake.wait(self.poll_interval)

    def _slot_wait(self, wait: float | None) -> float:
        """How long a round thread held back by full keys waits, at most, for a limit's slot."""
        if wait is None:
            return self.poll_interval
        # A little past the database's time: its clock, not ours, frees the slot.
        return min(self.poll_interval, wait + SLOT_CLOCK_MARGIN)

    def _refill(self, lane: Lane, ahead: ClaimAhead, ahead_only: bool) -> int:
        """How many to claim now (``ClaimAhead.to_claim``)."""
        now = time.monotonic()
        return ahead.to_claim(
            lane.in_flight(), lane.running_for(now), lane.holds_limited(), now, ahead_only
        )

    def _ahead_only(self, lane: Lane, ahead: ClaimAhead, store: ClaimStore) -> bool:
        """Whether the lane's claim, with nothing in flight, is still a claim ahead
        (``ClaimAhead.ahead_when_dry``). A round that ends a limited task reads
        whether rows without a limit wait first, where nothing said so lately
        (``UnlimitedWaiting.probe_due``)."""
        now = time.monotonic()
        unlimited = self.unlimited_waiting
        ends_limited = lane.ends_limited()
        if ends_limited and unlimited.probe_due(now):
            try:
                found = store.unlimited_waiting(self.queues)
            except DatabaseError:
                found = False  # the round's own retries deal with the database
            unlimited.probed(found, now)
        return ahead.ahead_when_dry(
            now, self.wake.freed_count, ends_limited, unlimited.waiting(now)
        )

    def _wait_busy(self, lane: Lane, generation: int) -> None:
        """The runner is busy and the queue had nothing more: until it is idle, or a wake-up."""
        deadline = time.monotonic() + self.poll_interval
        while not self.stopping.is_set() and not self.wake.is_set() and not lane.idle():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            lane.wait_changed(generation, min(left, lane.flush_in(), BUSY_POLL))
            if lane.should_flush():
                return
            generation = lane.generation

    def _round(
        self,
        lane: Lane,
        store: ClaimStore,
        reporter: Reporter,
        want: int,
        behind: bool = False,
        writer: BesideWriter | None = None,
        hand_over: bool = False,
    ) -> Exchange:
        """Write what the lane finished and claim ``want`` more; retried through outages.
        ``behind``: claimed behind a task the lane holds (``ClaimRequest.ahead``);
        ``writer``: the lane's second connection, for outcomes written beside the claim;
        ``hand_over``: the slots of the limited tasks it ends may go to their keys'
        next tasks first (``ClaimRequest.hand_over``)."""
        finished = lane.take_finished()
        outcomes = [outcome for outcome, _ in finished]
        allowance = lane.start_allowance
        request = (
            ClaimRequest(
                self.queues,
                want,
                lane.worker_id,
                self.lease,
                self.mode,
                allowance.seconds(),
                lane.frontier,
                ahead=behind,
                hand_over=hand_over,
            )
            if want > 0 and not self.stopping.is_set()
            else None
        )

        def reconnect() -> None:
            store.close()
            lane.connections_lost = True  # the runner's too (_run_lane)
            if lane.frontier is not None:
                lane.frontier.forget()

        sent = 0.0
        # With many outcomes and a claim, the outcomes go on the lane's second
        # connection, side by side with the claim (beside.py); once written
        # there, a retry of the claim does not write them again.
        beside = writer is not None and writer.takes(store, outcomes, request)
        own = [] if beside else outcomes
        written_beside: list[Exchange | None] = []

        def exchange_once() -> Exchange:
            nonlocal sent
            sent = time.monotonic()  # before the claim's database time
            pending = writer.write(outcomes) if writer and beside and not written_beside else None
            try:
                return store.exchange(own, lane.worker_id, request)
            finally:
                if pending is not None:
                    written_beside.append(pending.result())

        exchange = retry_database(
            exchange_once,
            "claim" if request is not None else "write results",
            alias=None,
            on_error=reconnect,
            stop=self.halt,
            # Claiming may give up on a shutdown; results are retried until
            # the grace period ends (the keeper then leaves with what it has).
            give_up=lambda: request is not None and self.stopping.is_set(),
            log=logger,
        )
        if beside:
            wrote = written_beside[0] if written_beside else None
            if wrote is None:
                # Not written beside (it failed, or never began): by the next round.
                lane.put_back_finished(finished)
                finished = []
            elif exchange is None:
                # The claim gave up (a stop); what was written beside is told now.
                lane.put_back_finished([pair for pair in finished if pair[0].id in wrote.busy])
                reporter.report(
                    [pair for pair in finished if pair[0].id not in wrote.busy], wrote.written
                )
                finished = []
            else:
                exchange.written.update(wrote.written)
                exchange.busy |= wrote.busy
        if exchange is None:
            # Stopped before the database answered: what finished is written
            # by the lane's last round (or released by the keeper's deadline).
            lane.put_back_finished(finished)
            return Exchange()
        allowance.observe(time.monotonic() - sent)
        if request is not None:
            with self.counters.lock:
                self.counters.claim_statements += exchange.statements
                self.counters.claimed += len(exchange.claimed)
                if exchange.handed_over:
                    self.counters.handed_over += len(exchange.claimed)
            for row in exchange.claimed:
                if row.limit_period:
                    # A rate limit holds on the bodies' starts: this one starts
                    # within its allowance of the claim (its slot comes free a
                    # period and that after the claim), or is given back.
                    row.start_by = sent + request.start_within
        if exchange.freed and not self.listen:
            # Slots its outcomes freed that tasks wait for: this process's
            # waiting round threads (PostgreSQL's NOTIFY tells every process).
            self.wake.slot_freed(exchange.freed)
        if exchange.busy:
            # Rows another session holds locked: written by a later round,
            # while the claims stay ours and the others went through.
            lane.put_back_finished([pair for pair in finished if pair[0].id in exchange.busy])
            finished = [pair for pair in finished if pair[0].id not in exchange.busy]
        reporter.report(finished, exchange.written)
        return exchange

    def _finish_lane(
        self, lane: Lane, store: ClaimStore, reporter: Reporter, executor: Executor
    ) -> None:
        """Write what is finished and give back what never started, attempts unspent."""
        for running in lane.take_unstarted():
            lane.finish(executor.release(running), running)
        while lane.held():
            exchange = self._round(lane, store, reporter, 0)
            # A row held locked by another session: wait for it, within the grace.
            if not exchange.busy or self.halt.wait(BUSY_RETRY):
                break

    # -- burst ----------------------------------------------------------------------

    def _held_back_by_limits(self, store: ClaimStore) -> bool:
        """Burst mode: due tasks wait for a limit's slot, to come free (limits.py)."""
        return bool(
            retry_database(
                lambda: store.held_back_by_limits(self.queues),
                "burst check",
                alias=None,
                on_error=store.close,
                stop=self.halt,
            )
        )

    def _retries_pending(self, store: ClaimStore) -> bool:
        """Burst mode: tasks this process failed are waiting out their backoff."""
        with self.counters.lock:
            retrying = set(self.counters.retrying)
        if not retrying:
            return False
        still = retry_database(
            lambda: store.ready_among(retrying),
            "burst check",
            alias=None,
            on_error=store.close,
            stop=self.halt,
        )
        with self.counters.lock:
            self.counters.retrying &= still or set()
        return bool(still)

    # -- background threads ------------------------------------------------------------

    def _background_threads(self) -> list[threading.Thread]:
        threads: list[threading.Thread] = []
        if self.listen:
            from .listener import Listener

            assert self.listen_database is not None
            threads.append(
                Listener(self.listen_database, self.queues, self.wake, self.halt, lease=self.lease)
            )
        if self.processors:
            threads += self._processor_threads()
        return threads

    def _processor_threads(self) -> list[threading.Thread]:
        from ..record_processing import registered_processors, run_processor

        return [
            threading.Thread(
                target=run_processor,
                args=(
                    processor,
                    f"{self.name}:{processor.name}:{get_random_string(6)}",
                    self.stopping,
                ),
                kwargs={"poll_interval": self.poll_interval, "mode": str(self.mode)},
                name=f"rdbtasks-processor-{processor.name}",
                daemon=True,
            )
            for processor in registered_processors()
        ]
