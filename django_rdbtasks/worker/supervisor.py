"""Start worker processes, restart the ones that die, pass signals on; scale, serve metrics."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Any

from django.db import Error as DatabaseError
from django.db import connections

from ..compat import task_backends
from ..jobs import fire_due_jobs, sync_declared_jobs
from ..observability import tracing
from ..observability.metrics import MetricsServer
from ..reads import read_database
from ..retrying import Backoff, close_quietly, retry_database
from ..schema import APP_LABEL, Reminder, unapplied_migrations, what_to_do
from .autoscale import AutoscalePolicy, sample_load
from .connection import (
    bound_user_connections,
    close_in_thread,
    leave_inherited_connections,
    open_in_thread,
    worker_alias,
)
from .exits import RECYCLED, exit_reason
from .loop import Worker
from .processtree import die_with_parent
from .registry import mark_gone
from .scheduler import Scheduler

logger = logging.getLogger("django_rdbtasks.worker")


SCHEDULER = "scheduler"
#: While the task tables are missing: how often to look again.
TABLES_POLL = 1.0
#: Allocations between collections of the youngest generation in a worker
#: process (CPython's default: 700). A short task allocates a few hundred
#: objects, nearly none of them in a cycle, so at 700 the collector ran every
#: few tasks and took a tenth of the worker's CPU (py-spy, 2026-11-27). The
#: older generations keep their thresholds; a higher one set by the project
#: is kept.
YOUNG_GC_THRESHOLD = 10_000


def _child_main(
    worker_options: dict[str, Any],
    kind: str,
    supervisor_pid: int,
    metrics: MetricsServer | None = None,
) -> None:
    leave_inherited_connections()
    if metrics is not None:
        metrics.in_child()
    # The child stays in the supervisor's process group, so a kill of the
    # group reaches it. Ctrl+C at a terminal sends SIGINT to the whole group:
    # children ignore it and the supervisor passes one SIGTERM on, so the
    # first Ctrl+C is graceful.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent(supervisor_pid)
    if kind == SCHEDULER:
        code = Scheduler(
            database=_database(worker_options),
            interval=worker_options["poll_interval"],
            supervisor_pid=supervisor_pid,
        ).run()
    else:
        young, *older = gc.get_threshold()
        gc.set_threshold(max(young, YOUNG_GC_THRESHOLD), *older)
        code = Worker(**worker_options, supervisor_pid=supervisor_pid).run()
    # os._exit skips the tracing SDK's flush at exit: export the last spans first.
    tracing.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Supervisor:
    """Keeps ``processes`` workers running (or as many as ``autoscale`` decides).

    A child that crashes (or is killed) is restarted, with a growing pause if
    it keeps dying; one that exits after ``--max-tasks`` is replaced at once.
    In burst mode children that exit cleanly are done; the supervisor exits 0
    when all are. With ``autoscale`` it samples the backlog every
    ``autoscale_interval`` seconds and starts processes or stops one (SIGTERM:
    the child finishes its tasks or hands them back, as on any shutdown).
    With ``metrics`` (a started ``MetricsServer``) it tells the server which
    children are gone, and closes it (removing the directory) when it exits.
    """

    def __init__(
        self,
        processes: int,
        worker_options: dict[str, Any],
        *,
        scheduler: bool = True,
        autoscale: AutoscalePolicy | None = None,
        autoscale_interval: float = 5.0,
        metrics: MetricsServer | None = None,
    ) -> None:
        self.processes = max(0, processes)
        self.worker_options = worker_options
        self.burst = bool(worker_options.get("burst"))
        self.scheduler = scheduler
        self.autoscale = autoscale
        self.autoscale_interval = autoscale_interval
        self.metrics = metrics
        self.stopping = False
        self._signals: list[int] = []
        #: The running children (multiprocessing's fork Process) by their key: a
        #: worker's number, or SCHEDULER.
        self.children: dict[int | str, Any] = {}
        #: Workers asked to stop by the autoscaler: not restarted when they exit.
        self.retiring: set[int | str] = set()
        self.crashes: dict[int | str, list[float]] = {}
        self._context = multiprocessing.get_context("fork")
        self._next_sample = 0.0
        self._reported_processes = -1
        #: Worker pids whose registration could not be marked stopped yet (database away).
        self._unmarked: set[int] = set()
        self._mark_backoff = Backoff()
        self._mark_after = 0.0

    def run(self) -> int:
        # Put back on return: runworkers may be called from a program (a test).
        previous = {
            signum: signal.signal(signum, self._on_signal)
            for signum in (signal.SIGTERM, signal.SIGINT)
        }
        # Its own calls (waiting for migrate, autoscale samples) end in seconds
        # when the server is cut off silently, so it acts on its signals.
        bound_user_connections(float(self.worker_options.get("lease", 30.0)))
        try:
            return self._supervise()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if self.metrics is not None:
                self.metrics.close()

    def _supervise(self) -> int:
        if not self._wait_for_tables():
            return 0
        if self.scheduler and self.burst:
            # Burst: fire what is due now, once, then drain; no scheduler process.
            database = _database(self.worker_options)

            def fire() -> bool:
                sync_declared_jobs(database)
                fire_due_jobs(using=database)
                return True

            fired = retry_database(
                fire,
                "firing due jobs",
                alias=database,
                stop=threading.Event(),
                # Waits out the database, not a signal (recorded, passed on below).
                give_up=lambda: bool(self._signals) or self.stopping,
                log=logger,
            )
            if fired is None:
                self._pass_signals_on()
                return 0
        elif self.scheduler:
            self._start(SCHEDULER)
        first = self.processes if self.autoscale is None else self.autoscale.minimum
        for index in range(first):
            self._start(index)
        if self.autoscale is not None:
            logger.info(
                "autoscale: %d to %d worker processes, backlog read every %gs",
                self.autoscale.minimum,
                self.autoscale.maximum,
                self.autoscale_interval,
            )
            self._next_sample = time.monotonic() + self.autoscale_interval
        # Scaled to zero, an autoscaling supervisor has no child and still runs.
        while self.children or (self.autoscale is not None and not self.stopping):
            time.sleep(0.05)
            self._pass_signals_on()
            self._reap_children()
            if self.autoscale is not None and not self.stopping:
                now = time.monotonic()
                if now >= self._next_sample:
                    self._next_sample = now + self.autoscale_interval
                    self._scale(self.autoscale, now)
            self._report_processes()
            if self._unmarked and time.monotonic() >= self._mark_after:
                self._mark_stopped(set())
        if self._unmarked and time.monotonic() >= self._mark_after:
            # Not again at once after a failure: a server cut off silently
            # would hold the exit for another connection timeout.
            self._mark_stopped(set())
        if self._unmarked:
            logger.warning(
                "the registrations of %d ended worker processes could not be marked stopped "
                "(the database does not answer); they show as gone until they age out",
                len(self._unmarked),
            )
        return 0

    def _wait_for_tables(self) -> bool:
        """Wait while this app's migrations are not applied, saying so; False if signalled.

        The processes would only retry against missing tables, each on its
        own and quietly after the first failure: one line here, repeated while
        it lasts, says what to do. A database that does not answer is left to
        the processes, which wait for it (and report it) themselves.
        """
        database = _database(self.worker_options)
        reminder = Reminder()
        while True:
            # Closed after the look if it opened it: a connection of the caller's
            # (runworkers called from a test) is the caller's to close.
            opened = connections[database].connection is None
            try:
                missing = unapplied_migrations(database, APP_LABEL)
            except DatabaseError:
                missing = []
            finally:
                if opened:
                    close_quietly(database)
            if not missing:
                if reminder.said_at is not None:
                    logger.info("the task tables are there now: starting the worker processes")
                return True
            now = time.monotonic()
            if reminder.due(now):
                logger.warning(
                    "%s; the worker processes start once it has run (database %r)",
                    what_to_do(missing),
                    database,
                )
            deadline = now + TABLES_POLL
            while time.monotonic() < deadline:
                if self._signals:
                    self._signals.clear()
                    logger.info("supervisor got a signal while waiting for migrate: exiting")
                    return False
                time.sleep(0.05)

    def _reap_children(self) -> None:
        """Join the children that exited; restart those that should be running.

        Every child that ended has its registration marked stopped (a child
        that could say goodbye itself already did; the mark then changes
        nothing) before it is reaped: until then its pid is a zombie's, which
        no new process can take, so the mark cannot reach a live registration.
        """
        ended = [(child, process) for child, process in self.children.items() if _ended(process)]
        if not ended:
            return
        self._mark_stopped(
            {p.pid for child, p in ended if child != SCHEDULER and p.pid is not None}
        )
        for child, process in ended:
            process.join()
            code = process.exitcode
            del self.children[child]
            if self.metrics is not None:
                self.metrics.process_gone(process.pid)
            self._after_exit(child, process.pid, code)

    def _after_exit(self, child: int | str, pid: int | None, code: int | None) -> None:
        kind = "scheduler" if child == SCHEDULER else "worker"
        reason = exit_reason(code)
        if child in self.retiring:
            self.retiring.discard(child)
            logger.info("%s process %s %s (autoscale)", kind, pid, reason)
            return
        if self.stopping or (code == 0 and self.burst):
            logger.log(
                logging.INFO if code == 0 else logging.WARNING,
                "%s process %s %s",
                kind,
                pid,
                reason,
            )
            return
        if code in RECYCLED:
            logger.info("%s process %s %s; starting a new one", kind, pid, reason)
            self._start(child)
            return
        logger.error("%s process %s %s; restarting", kind, pid, reason)
        self._restart_after_crash(child)

    def _mark_stopped(self, pids: set[int]) -> None:
        """Mark the registrations of ended worker processes stopped, now or later."""
        pending = self._unmarked | pids
        if not pending:
            return
        alias = worker_alias(
            _database(self.worker_options),
            float(self.worker_options.get("lease", 30.0)),
            pooled=_backend(self.worker_options).config.transaction_pooling,
        )
        try:
            open_in_thread(alias)
            mark_gone(alias, sorted(pending))
        except DatabaseError as exc:
            self._unmarked = pending
            delay = self._mark_backoff.next_delay()
            self._mark_after = time.monotonic() + delay
            logger.log(
                logging.WARNING if self._mark_backoff.loud else logging.DEBUG,
                "could not mark %d ended worker processes stopped in the registry (%s); "
                "retrying in %.1fs",
                len(pending),
                exc,
                delay,
            )
        else:
            self._unmarked = set()
            self._mark_backoff.reset()
        finally:
            # A child must never inherit this connection: closed, and the
            # alias dropped from this thread (close_all does not see it).
            close_in_thread(alias)
            try:
                del connections[alias]
            except AttributeError:
                pass

    def _start(self, child: int | str) -> None:
        # The child leaves every connection it inherits (leave_inherited_connections):
        # none is shared, and none this process did not open is closed.
        kind = SCHEDULER if child == SCHEDULER else "worker"
        process = self._context.Process(
            target=_child_main,
            args=(self.worker_options, kind, os.getpid(), self.metrics),
            name=f"rdbtasks-{kind}-{child}",
        )
        process.start()
        self.children[child] = process

    def _restart_after_crash(self, child: int | str) -> None:
        now = time.monotonic()
        recent = [t for t in self.crashes.get(child, []) if now - t < 60] + [now]
        self.crashes[child] = recent
        pause = min(30.0, 0.5 * 2 ** (len(recent) - 1)) if len(recent) > 1 else 0.0
        deadline = now + pause
        while time.monotonic() < deadline and not self.stopping:
            time.sleep(0.05)
            self._pass_signals_on()
        if not self.stopping:
            self._start(child)

    # -- autoscaling -------------------------------------------------------------------

    def worker_numbers(self) -> list[int]:
        """The worker processes counted as running: not the scheduler, not the retiring."""
        return sorted(
            child
            for child in self.children
            if isinstance(child, int) and child not in self.retiring
        )

    def _scale(self, policy: AutoscalePolicy, now: float) -> None:
        # Only a reading of the backlog: a replica's, if the backend has one.
        database = read_database(_database(self.worker_options))
        try:
            load = sample_load(database, self._queues())
        except DatabaseError as exc:  # django.db.Error: InterfaceError too
            # No sample, no change: the processes running go on running.
            logger.warning("autoscale: could not read the backlog (%s)", exc)
            try:
                connections[database].close()  # a fresh connection for the next sample
            except DatabaseError:
                pass
            return
        numbers = self.worker_numbers()
        current = len(numbers)
        wanted = policy.desired(load, current, now)
        if wanted == current:
            return
        lag = "none" if load.lag is None else f"{load.lag:.1f}s"
        logger.info(
            "autoscale: %d -> %d worker processes (ready %d, running %d, lag %s)",
            current,
            wanted,
            load.ready,
            load.running,
            lag,
        )
        if wanted > current:
            taken = set(numbers) | {s for s in self.children if isinstance(s, int)}
            free = (index for index in range(len(taken) + wanted) if index not in taken)
            for _ in range(wanted - current):
                self._start(next(free))
        else:
            # The newest go first; each finishes its tasks (or hands them back).
            for child in numbers[wanted - current :]:
                self.retiring.add(child)
                process = self.children[child]
                if process.pid is not None:
                    try:
                        os.kill(process.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass

    def _queues(self) -> list[str]:
        queues = self.worker_options.get("queues")
        if queues:
            return list(queues)
        backend: Any = task_backends[self.worker_options.get("backend", "default")]
        return list(backend.queues)

    def _report_processes(self) -> None:
        if self.metrics is None:
            return
        count = len(self.worker_numbers())
        if count != self._reported_processes:
            self._reported_processes = count
            self.metrics.set_worker_processes(count)

    # -- signals -----------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only counted here; the loop passes it on (a handler must take no lock).
        self._signals.append(signum)

    def _pass_signals_on(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            again = self.stopping
            self.stopping = True
            logger.info(
                "supervisor got %s: %s",
                signal.Signals(signum).name,
                "stopping workers now" if again else "stopping workers gracefully",
            )
            for process in self.children.values():
                if process.pid is not None:
                    try:
                        os.kill(process.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass


def _backend(worker_options: dict[str, Any]) -> Any:
    return task_backends[worker_options.get("backend", "default")]


def _database(worker_options: dict[str, Any]) -> str:
    return str(_backend(worker_options).database)


def _ended(process: Any) -> bool:
    """Whether a child has exited, without reaping it where the system allows."""
    if process.pid is None:
        return False
    if not hasattr(os, "waitid"):
        return not process.is_alive()
    try:
        found = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        # Reaped already (multiprocessing reaps finished children when it
        # starts one): ask multiprocessing, which kept the status.
        return not process.is_alive()
    return found is not None
