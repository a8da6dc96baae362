"""Start worker processes, restart the ones that die, pass signals on."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import time
from typing import Any

from django.db import connections

from ..compat import task_backends
from ..jobs import fire_due_jobs, sync_declared_jobs
from .keeper import EXIT_RECYCLE
from .loop import Worker
from .processtree import die_with_parent
from .scheduler import Scheduler

logger = logging.getLogger("django_rdbtasks.worker")


SCHEDULER = "scheduler"


def _child_main(worker_options: dict[str, Any], kind: str, supervisor_pid: int) -> None:
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
        code = Worker(**worker_options, supervisor_pid=supervisor_pid).run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Supervisor:
    """Keeps ``processes`` workers running.

    A child that crashes (or is killed) is restarted, with a growing pause if
    it keeps dying; one that exits after ``--max-tasks`` is replaced at once.
    In burst mode children that exit cleanly are done; the supervisor exits 0
    when all are.
    """

    def __init__(
        self, processes: int, worker_options: dict[str, Any], *, scheduler: bool = True
    ) -> None:
        self.processes = max(0, processes)
        self.worker_options = worker_options
        self.burst = bool(worker_options.get("burst"))
        self.scheduler = scheduler
        self.stopping = False
        self._signals: list[int] = []
        self.children: dict[int | str, Any] = {}  # multiprocessing's fork Process
        self.crashes: dict[int | str, list[float]] = {}
        self._context = multiprocessing.get_context("fork")

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        if self.scheduler and self.burst:
            # Burst: fire what is due now, once, then drain; no scheduler process.
            database = _database(self.worker_options)
            sync_declared_jobs(database)
            fire_due_jobs(using=database)
        elif self.scheduler:
            self._start(SCHEDULER)
        for index in range(self.processes):
            self._start(index)
        while self.children:
            time.sleep(0.05)
            self._pass_signals_on()
            for slot, process in list(self.children.items()):
                if process.is_alive():
                    continue
                process.join()
                code = process.exitcode
                del self.children[slot]
                if self.stopping:
                    continue
                if code == 0 and self.burst:
                    continue
                if code == EXIT_RECYCLE:
                    logger.info("worker process %s recycled after --max-tasks", process.pid)
                    self._start(slot)
                    continue
                logger.error("worker process %s exited with %s; restarting", process.pid, code)
                self._restart_after_crash(slot)
        return 0

    def _start(self, slot: int | str) -> None:
        connections.close_all()  # never share a connection with a child
        kind = SCHEDULER if slot == SCHEDULER else "worker"
        process = self._context.Process(
            target=_child_main,
            args=(self.worker_options, kind, os.getpid()),
            name=f"rdbtasks-{kind}-{slot}",
        )
        process.start()
        self.children[slot] = process

    def _restart_after_crash(self, slot: int | str) -> None:
        now = time.monotonic()
        recent = [t for t in self.crashes.get(slot, []) if now - t < 60] + [now]
        self.crashes[slot] = recent
        pause = min(30.0, 0.5 * 2 ** (len(recent) - 1)) if len(recent) > 1 else 0.0
        deadline = now + pause
        while time.monotonic() < deadline and not self.stopping:
            time.sleep(0.05)
            self._pass_signals_on()
        if not self.stopping:
            self._start(slot)

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


def _database(worker_options: dict[str, Any]) -> str:
    backend: Any = task_backends[worker_options.get("backend", "default")]
    return str(backend.database)
