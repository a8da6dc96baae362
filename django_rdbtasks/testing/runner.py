"""Running a test's tasks in its own process, on its own connection: ``drain()``.

The worker's own parts do the work, not a copy of them: the ``ClaimStore``
claims runnable rows and writes outcomes with the statements a worker uses
(fenced, with dependants, workflows, job records and limit slots settled as
in production), the ``Executor`` runs each row as a worker would (loading only
real framework tasks, retries and backoff, ``once()``, checkpoints,
``task_started``), and the ``Reporter`` sends ``task_finished``. What differs
is only where it runs: in the calling thread, on the alias's own connection
(inside a ``TestCase``'s transaction, its effects are the test's and roll back
with it), one task after another, with no lease keeper (a task's ``timeout``
is not enforced) and no LISTEN.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.utils.crypto import get_random_string

from ..backend import RDBTaskBackend
from ..compat import TaskResult, task_backends
from ..db.rows import ClaimedRow, ClaimRequest, Outcome
from ..jobs import fire_due_jobs, sync_declared_jobs
from ..states import ClaimMode, OutcomeKind, TaskStatus
from ..worker.execution import Executor, Running
from ..worker.reporting import Counters, Reporter
from ..worker.store import ClaimStore

#: Tasks claimed per round: enough that a drain of many costs few rounds.
BATCH = 100
#: Rounds in a row that may find runnable rows they could not claim yet (a
#: limit's slots being made) before the drain stops looking.
CONTENDED_ROUNDS = 20


class TaskLeftTransactionOpen(RuntimeError):
    """A task returned inside an ``atomic()`` block it entered and never left."""


@dataclass(frozen=True)
class RanTask:
    """One attempt the drain ran (or handed back), and how it ended."""

    id: str
    task_path: str
    #: What the worker wrote: success, failure, retry, handover...
    outcome: OutcomeKind
    #: The attempt's number (1 for the first run).
    attempt: int
    #: The task's exception, for a failure or a retry.
    error: BaseException | None
    return_value: Any
    #: The framework's result as the worker saw it, ``task_finished`` sent with it.
    result: TaskResult | None

    @property
    def status(self) -> TaskStatus | None:
        """The task's state after this attempt (READY again for a retry)."""
        return self.outcome.status

    def __repr__(self) -> str:
        error = f" {type(self.error).__name__}: {self.error}" if self.error is not None else ""
        return f"<RanTask {self.task_path} {self.id} attempt {self.attempt}: {self.outcome}{error}>"


class DrainReport(Sequence[RanTask]):
    """What a drain ran, in the order it ran it."""

    def __init__(self, ran: list[RanTask]) -> None:
        self.ran = ran

    def __getitem__(self, index: Any) -> Any:
        return self.ran[index]

    def __len__(self) -> int:
        return len(self.ran)

    def __iter__(self) -> Iterator[RanTask]:
        return iter(self.ran)

    def of(self, task: Any) -> list[RanTask]:
        """The attempts of one task (a framework ``Task`` or its dotted path)."""
        path = task if isinstance(task, str) else task.module_path
        return [ran for ran in self.ran if ran.task_path == path]

    def _kind(self, *kinds: OutcomeKind) -> list[RanTask]:
        return [ran for ran in self.ran if ran.outcome in kinds]

    @property
    def succeeded(self) -> list[RanTask]:
        return self._kind(OutcomeKind.SUCCESS)

    @property
    def failed(self) -> list[RanTask]:
        """Attempts that ended their task FAILED (no retry left, or none allowed)."""
        return self._kind(OutcomeKind.FAILURE, OutcomeKind.ABANDON)

    @property
    def retried(self) -> list[RanTask]:
        """Attempts that failed and left their task waiting out a backoff."""
        return self._kind(OutcomeKind.RETRY)

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for ran in self.ran:
            counts[ran.outcome] = counts.get(ran.outcome, 0) + 1
        summary = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "nothing ran"
        return f"<DrainReport: {summary}>"


class InProcessRunner:
    """Claims, runs and writes the outcomes of a backend's tasks in the calling thread."""

    def __init__(
        self,
        backend: str = "default",
        queues: Sequence[str] | None = None,
        *,
        lease: float = 30.0,
    ) -> None:
        instance = self.backend = rdb_backend(backend)
        self.database = instance.database
        self.queues = list(queues or instance.queues)
        unknown = sorted(set(self.queues) - set(instance.queues))
        if unknown:
            raise ValueError(
                f"Queues {unknown} are not among backend {backend!r}'s QUEUES "
                f"{sorted(instance.queues)}."
            )
        self.lease = lease
        self.worker_id = f"testing:{socket.gethostname()}:{os.getpid()}:{get_random_string(6)}"

    def drain(
        self, *, until_idle: bool = True, raise_errors: bool = False, max_tasks: int = 10_000
    ) -> DrainReport:
        # Made per drain: a pinned clock (TaskClock) changes the alias's statements.
        store = ClaimStore(self.database, self.database, prepares=False)
        connection = connections[self.database]
        depth = len(connection.atomic_blocks) if connection.in_atomic_block else 0
        executor = Executor(
            self.backend,
            store,
            lease=self.lease,
            poll_interval=1.0,
            progress_interval=self.backend.config.progress_interval,
            stopping=threading.Event(),
            after_task=lambda: _check_atomic_depth(connection, depth),
        )
        reporter = Reporter(self.backend, Counters(), store.public_id)
        ran: list[RanTask] = []
        pending: list[tuple[Outcome, Running]] = []
        contended = 0
        first = True
        while True:
            want = 0 if (not until_idle and not first) else min(BATCH, max_tasks - len(ran))
            request = (
                ClaimRequest(self.queues, want, self.worker_id, self.lease, ClaimMode.OPTIMISTIC)
                if want > 0
                else None
            )
            exchange = store.exchange([o for o, _ in pending], self.worker_id, request)
            written = [pair for pair in pending if pair[0].id not in exchange.busy]
            reporter.report(written, exchange.written)
            ran += [_ran(outcome, running) for outcome, running in written]
            pending = [pair for pair in pending if pair[0].id in exchange.busy]
            if raise_errors:
                _raise_first_error(written)
            if exchange.claimed:
                contended = 0
                first = False
                pending += [self._run(executor, store, row) for row in exchange.claimed]
                continue
            if pending:
                continue  # outcomes another session held locked: written next round
            if request is not None and exchange.contended and contended < CONTENDED_ROUNDS:
                contended += 1  # a limit's slots were just made: claim again
                continue
            if until_idle and exchange.written and len(ran) < max_tasks:
                continue  # what just finished may have released dependants
            return DrainReport(ran)

    def _run(
        self, executor: Executor, store: ClaimStore, row: ClaimedRow
    ) -> tuple[Outcome, Running]:
        running = Running(row, self.worker_id)
        outcome = executor.run(running)
        store.dialect.encode_outcome(outcome, self.backend.storage_limits)
        return outcome, running


def rdb_backend(alias: str) -> RDBTaskBackend:
    """The task backend ``alias``, which must be this app's."""
    instance = task_backends[alias]
    if not isinstance(instance, RDBTaskBackend):
        raise TypeError(
            f"Task backend {alias!r} is {type(instance).__name__}, not RDBTaskBackend: "
            "django_rdbtasks.testing works with this app's backend only."
        )
    return instance


def _ran(outcome: Outcome, running: Running) -> RanTask:
    row = running.row
    result = running.result
    return RanTask(
        id=result.id if result is not None else str(row.id),
        task_path=row.task_path,
        outcome=outcome.kind,
        attempt=row.attempts,
        error=outcome.error,
        return_value=outcome.return_value,
        result=result,
    )


def _raise_first_error(written: list[tuple[Outcome, Running]]) -> None:
    for outcome, _ in written:
        if outcome.error is not None and outcome.kind in (
            OutcomeKind.FAILURE,
            OutcomeKind.RETRY,
            OutcomeKind.ABANDON,
        ):
            raise outcome.error


def _check_atomic_depth(connection: Any, depth: int) -> None:
    """A task must leave the atomic blocks it entered; the test's own stay open."""
    now = len(connection.atomic_blocks) if connection.in_atomic_block else 0
    if now > depth:
        error = TaskLeftTransactionOpen(
            f"a task returned inside {now - depth} atomic() block(s) it entered on "
            f"{connection.alias!r} and never left (a worker would roll them back and "
            "drop its connection)."
        )
        # Rolled back here, as a worker's server would: the test's own blocks stay.
        while len(connection.atomic_blocks) > depth:
            connection.atomic_blocks[-1].__exit__(type(error), error, None)
        raise error


def drain(
    queue: str | None = None,
    *,
    queues: Sequence[str] | None = None,
    backend: str = "default",
    until_idle: bool = True,
    raise_errors: bool = False,
    jobs: bool = False,
    max_tasks: int = 10_000,
) -> DrainReport:
    """Run the backend's runnable tasks here and now; what ran, and how each ended.

    ``queue`` (or ``queues``): only these (default: all the backend's QUEUES).
    ``until_idle``: also run what the tasks enqueue or release as they finish,
    until nothing is runnable; False runs only what was runnable at the start.
    A task waiting out a backoff, deferred, or behind a limit's full key is not
    runnable: move the clock (``TaskClock.advance``) to make it so.
    ``raise_errors``: raise a failed attempt's exception (once its outcome is
    written) instead of only recording it. ``jobs``: fire the cron jobs due at
    the database's now first (``tick_jobs``); off by default, so that what a
    drain runs does not depend on where the clock stands against a schedule.
    ``max_tasks`` bounds a drain of
    tasks that keep enqueueing more.
    """
    if queue is not None and queues is not None:
        raise TypeError("drain() takes queue or queues, not both.")
    runner = InProcessRunner(backend, [queue] if queue is not None else queues)
    if jobs:
        tick_jobs(runner.database)
    return runner.drain(until_idle=until_idle, raise_errors=raise_errors, max_tasks=max_tasks)


def tick_jobs(using: str = "default") -> int:
    """Fire the cron jobs due at the database's now, each tick once, as a scheduler
    would; how many fired. Jobs declared in code are synced first."""
    sync_declared_jobs(using)
    return fire_due_jobs(using=using)
