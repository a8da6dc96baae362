"""One worker process: claim loops ("slots"), the heartbeat, and the listener.

Each slot is a thread with its own database connection and worker id. It claims
a batch, runs the tasks one after another and writes their outcomes in one
fenced statement per kind. The heartbeat renews the leases of everything the
process holds; a lease it cannot renew is lost, and the slot's later write for
that task will match nothing.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from traceback import format_exception
from typing import Any, TypeVar

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.utils.crypto import get_random_string

from ..backend import RDBTaskBackend, RDBTaskResult, task_key
from ..compat import TaskResult, TaskResultStatus, normalize_json, task_backends
from ..context import _UNSET, RDBTaskContext
from ..db import dialect_for
from ..db.base import Candidate, ClaimedRow, Outcome
from ..db.functions import DbNow
from ..dependencies import end_dependants, release_dependants
from ..exceptions import (
    HandOver,
    InvalidTaskPath,
    ReturnValueNotJSON,
    TaskCancelled,
    TaskTimeout,
    WorkerLost,
)
from ..idempotency import AlreadyDone, current_task, once
from ..loading import load_task
from ..locks import LeasedLock

logger = logging.getLogger("django_rdbtasks.worker")

EXIT_RECYCLE = 3
#: Candidates read per task wanted: room to start at a random place and miss
#: the rows other workers are claiming at the same moment.
CANDIDATE_SPREAD = 4
#: Longest a finished outcome waits for the rest of its batch before it is written.
FLUSH_INTERVAL = 0.05

T = TypeVar("T")


def _error_path(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def _isoformat(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


@dataclass(slots=True)
class Running:
    """A claimed row and the result object the signals carry."""

    row: ClaimedRow
    result: TaskResult | None = None
    lost: bool = False
    #: An operator asked to cancel it.
    cancel: bool = False
    #: Set when the task should stop: cancelled, lost, timed out, or the worker is stopping.
    stop: threading.Event = field(default_factory=threading.Event)
    task: Any = None
    started: float | None = None  # monotonic, once it runs
    timeout: float | None = None
    timed_out: bool = False


class Control:
    """The worker's side of a task's context: stop requests, progress, checkpoints."""

    def __init__(self, worker: Worker, worker_id: str, running: Running) -> None:
        self.worker = worker
        self.worker_id = worker_id
        self.running = running
        self.checkpoint: Any = running.row.checkpoint
        self.progress: float | None = None
        self.message = ""
        self.stop_observed = False
        self._dirty = False
        self._checkpoint_dirty = False
        self._last_write = 0.0

    def should_stop(self) -> bool:
        if self.running.stop.is_set():
            self.stop_observed = True
            return True
        return False

    def update(self, progress: Any, message: str, checkpoint: Any, force: bool) -> None:
        if progress is not _UNSET:
            self.progress, self.message = progress, message
        if checkpoint is not _UNSET:
            self.checkpoint, self._checkpoint_dirty = checkpoint, True
        self._dirty = True
        if force or time.monotonic() - self._last_write >= self.worker.progress_interval:
            self.flush()

    def flush(self) -> None:
        """Write what changed, fenced by the claim; one try (a task must not hang on it)."""
        if not self._dirty:
            return
        row = self.running.row
        connection = connections[self.worker.database]
        try:
            with connection.cursor() as cursor:
                held = dialect_for(connection).save_progress(
                    cursor,
                    row.id,
                    row.version,
                    self.worker_id,
                    progress=self.progress,
                    message=self.message,
                    checkpoint_json=json.dumps(self.checkpoint) if self._checkpoint_dirty else None,
                )
        except DatabaseError as exc:
            logger.warning("could not save progress of task %s (%s)", row.id, exc)
            return
        self._dirty = self._checkpoint_dirty = False
        self._last_write = time.monotonic()
        if not held:
            self.running.lost = True
            self.running.stop.set()


class Worker:
    """Claims and runs tasks of some queues until stopped (or drained in burst mode)."""

    def __init__(
        self,
        *,
        backend: str = "default",
        queues: Sequence[str] | None = None,
        mode: str = "optimistic",
        batch: int | None = None,
        threads: int = 1,
        lease: float = 30.0,
        poll_interval: float = 1.0,
        burst: bool = False,
        max_tasks: int | None = None,
        grace: float = 30.0,
        listen: bool = True,
        processors: bool = False,
    ) -> None:
        instance = task_backends[backend]
        if not isinstance(instance, RDBTaskBackend):
            raise ValueError(
                f"Task backend {backend!r} is {type(instance).__name__}, not RDBTaskBackend."
            )
        if mode not in {"optimistic", "skip-locked"}:
            raise ValueError("mode must be 'optimistic' or 'skip-locked'.")
        self.backend = instance
        self.database = instance.database
        vendor = connections[self.database].vendor
        if mode == "skip-locked" and vendor == "sqlite":
            raise ValueError(
                "--mode skip-locked needs SELECT ... FOR UPDATE SKIP LOCKED, which SQLite "
                "does not have; use the default optimistic mode on SQLite."
            )
        self.queues = sorted(queues or instance.queues)
        unknown = set(self.queues) - set(instance.queues)
        if unknown:
            raise ValueError(
                f"Queues {sorted(unknown)} are not among backend {backend!r}'s QUEUES "
                f"{sorted(instance.queues)}."
            )
        self.mode = mode
        self.threads = max(1, threads)
        self.batch = max(1, batch or 1)
        self.lease = lease
        self.heartbeat_interval = max(0.05, lease / 3)
        self.progress_interval = float(instance.options.get("PROGRESS_INTERVAL", 1.0))
        self.timeout_grace = float(instance.options.get("TIMEOUT_GRACE", 5.0))
        self.poll_interval = poll_interval
        self.burst = burst
        self.max_tasks = max_tasks
        self.grace = grace
        self.listen = listen and vendor == "postgresql" and instance.notify
        self.processors = processors
        self.name = f"{socket.gethostname()}:{os.getpid()}"

        self.stopping = threading.Event()  # stop claiming, finish what runs
        self.halt = threading.Event()  # background threads end
        self.wake = threading.Event()
        self.stop_deadline = float("inf")
        self._held: dict[str, dict[Any, Running]] = {}
        self._lock = threading.Lock()
        self._started_count = 0
        self.processed = 0
        self.failed = 0
        self.recycle = False
        self._parent_pid = os.getppid()

    # -- lifecycle ---------------------------------------------------------------------

    def run(self, *, install_signals: bool = True) -> int:
        """Run until stopped; return the process exit code."""
        if install_signals and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        logger.info(
            "worker %s started: queues=%s mode=%s threads=%d batch=%d lease=%.1fs",
            self.name,
            ",".join(self.queues),
            self.mode,
            self.threads,
            self.batch,
            self.lease,
        )
        background: list[threading.Thread] = [
            threading.Thread(target=self._heartbeat_loop, name="rdbtasks-heartbeat", daemon=True)
        ]
        if self.listen:
            from .listener import Listener

            background.append(Listener(self.database, self.queues, self.wake, self.halt))
        if self.processors:
            background += self._processor_threads()
        self._with_db(self._register, "register worker", give_up_when_stopping=True)
        for thread in background:
            thread.start()
        try:
            if self.threads == 1:
                self._slot_loop(0)
            else:
                slots = [
                    threading.Thread(target=self._slot_loop, args=(i,), name=f"rdbtasks-slot-{i}")
                    for i in range(self.threads)
                ]
                for slot in slots:
                    slot.start()
                for slot in slots:
                    while slot.is_alive():
                        slot.join(0.2)
        finally:
            self.stop()  # processors check their remaining records back in
            for thread in background:
                if thread.name.startswith("rdbtasks-processor-"):
                    thread.join(max(0.0, self.stop_deadline - time.monotonic()))
            self.halt.set()
            self.wake.set()
            try:
                self._deregister()
            except DatabaseError:
                pass
            connections.close_all()
        logger.info("worker %s stopped after %d tasks", self.name, self.processed)
        return EXIT_RECYCLE if self.recycle else 0

    def stop(self) -> None:
        """Stop claiming; running tasks get ``grace`` seconds before their claims are released."""
        if not self.stopping.is_set():
            self.stop_deadline = time.monotonic() + self.grace
            self.stopping.set()
            self.wake.set()
            with self._lock:
                for held in self._held.values():
                    for running in held.values():
                        running.stop.set()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stopping.is_set():
            logger.warning("second signal: exiting now; leases will expire and free the tasks")
            os._exit(1)
        logger.info(
            "signal %s: finishing running tasks (grace %.0fs), claiming no more",
            signal.Signals(signum).name,
            self.grace,
        )
        self.stop()

    # -- the claim loop ----------------------------------------------------------------

    def _slot_loop(self, index: int) -> None:
        worker_id = f"{self.name}:{index}:{get_random_string(6)}"
        with self._lock:
            self._held[worker_id] = {}
        try:
            while not self.stopping.is_set():
                want = self._claim_budget()
                if want == 0:
                    self.recycle = True
                    self.stop()
                    break
                self.wake.clear()
                rows, saw_candidates = self._claim(worker_id, want)
                if rows:
                    self._run_batch(worker_id, rows)
                elif not saw_candidates:
                    if self.burst:
                        break
                    self.wake.wait(self.poll_interval)
        finally:
            self._release_all(worker_id)
            with self._lock:
                self._held.pop(worker_id, None)
            connections.close_all()

    def _claim_budget(self) -> int:
        if self.max_tasks is None:
            return self.batch
        with self._lock:
            left = self.max_tasks - self._started_count
            want = max(0, min(self.batch, left))
            self._started_count += want
        return want

    def _claim(self, worker_id: str, want: int) -> tuple[list[ClaimedRow], bool]:
        """Claim up to ``want`` tasks; also say whether any were claimable at all."""

        def attempt() -> tuple[list[ClaimedRow], bool]:
            connection = connections[self.database]
            dialect = dialect_for(connection)
            with connection.cursor() as cursor:
                if self.mode == "optimistic":
                    found = dialect.candidates(cursor, self.queues, want * CANDIDATE_SPREAD)
                    if not found:
                        return [], False
                    start = random.randrange(len(found))
                    chosen = (found[start:] + found[:start])[:want]
                    rows = dialect.claim(cursor, chosen, worker_id, self.lease)
                else:
                    with transaction.atomic(using=self.database):
                        chosen = dialect.locked_candidates(cursor, self.queues, want)
                        if not chosen:
                            return [], False
                        rows = dialect.claim(cursor, chosen, worker_id, self.lease)
            by_id: dict[Any, Candidate] = {c.id: c for c in chosen}
            for row in rows:
                previous = by_id.get(row.id)
                if previous is not None and previous.status == TaskResultStatus.RUNNING:
                    row.lost_from = previous
            return rows, True

        claimed = self._with_db(attempt, "claim", give_up_when_stopping=True)
        if claimed is None:
            return [], True
        rows, saw = claimed
        if self.max_tasks is not None and len(rows) < want:
            with self._lock:
                self._started_count -= want - len(rows)
        if rows:
            rows.sort(key=lambda r: (-r.priority, r.run_after))
            with self._lock:
                held = self._held[worker_id]
                for row in rows:
                    held[row.id] = Running(row)
        return rows, saw

    def _run_batch(self, worker_id: str, rows: list[ClaimedRow]) -> None:
        pending: list[tuple[Outcome, Running]] = []
        last_flush = time.monotonic()
        for position, row in enumerate(rows):
            if self.stopping.is_set():
                for rest in rows[position:]:
                    pending.append(
                        (Outcome(rest.id, rest.version, "release"), self._running(worker_id, rest))
                    )
                break
            running = self._running(worker_id, row)
            pending.append((self._execute(worker_id, running), running))
            if time.monotonic() - last_flush >= FLUSH_INTERVAL:
                self._flush(worker_id, pending)
                pending = []
                last_flush = time.monotonic()
        self._flush(worker_id, pending)

    def _running(self, worker_id: str, row: ClaimedRow) -> Running:
        with self._lock:
            return self._held[worker_id].get(row.id) or Running(row)

    # -- running one task --------------------------------------------------------------

    def _public_id(self, raw_id: Any) -> str:
        return str(dialect_for(connections[self.database]).decode_id(raw_id))

    def _execute(self, worker_id: str, running: Running) -> Outcome:
        row = running.row
        if row.lost_from is not None:
            outcome = self._take_over_lost(worker_id, row)
            if outcome is not None:
                return outcome
        started = time.monotonic()
        try:
            task = load_task(row.task_path)
        except InvalidTaskPath as exc:
            # Permanent: retrying cannot make the path valid.
            return self._failure(worker_id, row, exc, started, retry=False)

        result = RDBTaskResult(
            task=task,
            id=self._public_id(row.id),
            status=TaskResultStatus.RUNNING,
            enqueued_at=row.enqueued_at,
            started_at=row.started_at,
            finished_at=None,
            last_attempted_at=row.claimed_at,
            args=row.args,
            kwargs=row.kwargs,
            backend=self.backend.alias,
            errors=[],
            worker_ids=[e.get("worker_id", "") for e in row.history] + [worker_id],
        )
        running.result = result
        self.backend.send_signal("task_started", result)
        lock = None
        if getattr(task, "singleton", False):
            lock = LeasedLock(f"task:{row.task_path}", lease=self.lease, using=self.database)
            if not self._with_db(lock.acquire, "singleton lock"):
                # One is running elsewhere: try again later, attempt not spent.
                return Outcome(row.id, row.version, "postpone", delay=self.poll_interval)
            lock.start_renewing()
        token = current_task.set((result.id, worker_id))
        control = Control(self, worker_id, running)
        running.task = task
        running.timeout = getattr(task, "timeout", None)
        running.started = started
        try:
            value = self._call(task, result, row, control)
        except HandOver as handover:
            control.flush()
            return self._handed_over(worker_id, row, started, handover.delay)
        except AlreadyDone as done:
            duration = time.monotonic() - started
            entry = self._entry(worker_id, row, duration, "ALREADY_DONE")
            entry["detail"] = str(done)
            return Outcome(
                row.id,
                row.version,
                "success",
                entry=entry,
                return_value=None,
                extra={"duration": duration},
            )
        except BaseException as error:  # a task's SystemExit must not end the worker
            control.flush()
            if running.cancel:
                return self._cancelled(worker_id, row, started)
            reason = self._timeout_error(running) if running.timed_out else error
            # An exception may say retrying cannot help (retryable = False).
            retry = bool(getattr(reason, "retryable", True))
            return self._failure(worker_id, row, reason, started, task=task, retry=retry)
        finally:
            running.started = None
            current_task.reset(token)
            if lock is not None:
                lock.stop_renewing()
                self._with_db(lock.release, "singleton lock release")
            _reset_connections()
        control.flush()
        if running.cancel:
            return self._cancelled(worker_id, row, started)
        if running.timed_out:
            return self._failure(worker_id, row, self._timeout_error(running), started, task=task)
        if self.stopping.is_set() and control.stop_observed:
            # It saw the shutdown and returned early: another worker resumes it.
            return self._handed_over(worker_id, row, started, 0.0)
        try:
            value = normalize_json(value)
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            error = ReturnValueNotJSON(f"return value is not JSON: {exc}")
            return self._failure(worker_id, row, error, started, retry=False)
        duration = time.monotonic() - started
        return Outcome(
            row.id,
            row.version,
            "success",
            entry=self._entry(worker_id, row, duration, "SUCCESSFUL"),
            return_value=value,
            extra={"duration": duration},
        )

    def _call(self, task: Any, result: TaskResult, row: ClaimedRow, control: Control) -> Any:
        args: list[Any] = list(row.args)
        if task.takes_context:
            args.insert(0, RDBTaskContext(task_result=result, control=control))
        template = getattr(task, "once_key", None)
        if template is None:
            return task.call(*args, **row.kwargs)
        key = task_key(template, task, row.args, row.kwargs)
        with once(task.module_path, key, using=self.database):
            return task.call(*args, **row.kwargs)

    def _entry(
        self,
        worker_id: str,
        row: ClaimedRow,
        duration: float,
        outcome: str,
        exc: BaseException | None = None,
    ) -> dict[str, Any]:
        # Both ends come from the database clock: the claim's time plus the
        # monotonic duration of the run.
        entry: dict[str, Any] = {
            "attempt": row.attempts,
            "worker_id": worker_id,
            "started_at": _isoformat(row.claimed_at),
            "finished_at": _isoformat(row.claimed_at + timedelta(seconds=duration)),
            "outcome": outcome,
        }
        if exc is not None:
            entry["exception_class_path"] = _error_path(exc)
            entry["traceback"] = "".join(format_exception(exc))
        return entry

    def _failure(
        self,
        worker_id: str,
        row: ClaimedRow,
        exc: BaseException,
        started: float,
        *,
        task: Any = None,
        retry: bool = True,
    ) -> Outcome:
        duration = time.monotonic() - started
        if retry and row.attempts < row.max_attempts:
            delay = self.backend.retry_delay(task, row.attempts)
            entry = self._entry(worker_id, row, duration, "RETRY", exc)
            return Outcome(
                row.id,
                row.version,
                "retry",
                entry=entry,
                delay=delay,
                extra={"duration": duration, "error": exc},
            )
        entry = self._entry(worker_id, row, duration, "FAILED", exc)
        return Outcome(
            row.id, row.version, "failure", entry=entry, extra={"duration": duration, "error": exc}
        )

    def _handed_over(
        self, worker_id: str, row: ClaimedRow, started: float, delay: float
    ) -> Outcome:
        duration = time.monotonic() - started
        entry = self._entry(worker_id, row, duration, "HANDED_OVER")
        return Outcome(
            row.id,
            row.version,
            "handover",
            entry=entry,
            delay=delay,
            extra={"duration": duration},
        )

    def _timeout_error(self, running: Running) -> TaskTimeout:
        return TaskTimeout(f"ran past its timeout of {running.timeout:g}s")

    def _cancelled(self, worker_id: str, row: ClaimedRow, started: float) -> Outcome:
        duration = time.monotonic() - started
        error = TaskCancelled("cancelled by an operator while running")
        entry = self._entry(worker_id, row, duration, "CANCELLED", error)
        return Outcome(row.id, row.version, "cancelled", entry=entry, extra={"duration": duration})

    def _take_over_lost(self, worker_id: str, row: ClaimedRow) -> Outcome | None:
        """Record the lost attempt; fail the task unrun if that was its last one."""
        lost = row.lost_from
        assert lost is not None
        exc = WorkerLost(
            f"worker {lost.worker_id} stopped renewing its lease during attempt "
            f"{row.attempts - 1}; the task was reclaimed by {worker_id}"
        )
        entry: dict[str, Any] = {
            "attempt": row.attempts - 1,
            "worker_id": lost.worker_id,
            "started_at": _isoformat(lost.last_attempted_at),
            "finished_at": _isoformat(row.claimed_at),
            "outcome": "LOST",
            "exception_class_path": _error_path(exc),
            "traceback": str(exc),
        }
        row.history.append(entry)
        logger.warning("task %s %s: %s", self._public_id(row.id), row.task_path, exc)
        if row.attempts - 1 >= row.max_attempts:
            return Outcome(row.id, row.version, "abandon", entry=entry, extra={"duration": 0.0})

        def note() -> set[Any]:
            connection = connections[self.database]
            with connection.cursor() as cursor:
                return dialect_for(connection).finish(
                    cursor, [Outcome(row.id, row.version, "note", entry=entry)], worker_id
                )

        self._with_db(note, "record lost attempt")
        return None

    # -- writing outcomes --------------------------------------------------------------

    def _flush(self, worker_id: str, pending: list[tuple[Outcome, Running]]) -> None:
        if not pending:
            return
        outcomes = [outcome for outcome, _ in pending]

        def write() -> set[Any]:
            connection = connections[self.database]
            with transaction.atomic(using=self.database), connection.cursor() as cursor:
                written = dialect_for(connection).finish(cursor, outcomes, worker_id)
                self._update_job_records(worker_id, pending, written)
                self._settle_dependants(outcomes, written)
                return written

        written = self._with_db(write, "write results")
        if written is None:
            written = {}
        with self._lock:
            held = self._held.get(worker_id, {})
            for outcome, _ in pending:
                held.pop(outcome.id, None)
        for outcome, running in pending:
            self._report(worker_id, outcome, running, outcome.id in written)

    def _settle_dependants(self, outcomes: list[Outcome], written: dict[Any, bool | None]) -> None:
        """Release or end the dependants of what just finished, in the same transaction."""
        succeeded, failed = [], []
        for outcome in outcomes:
            if written.get(outcome.id, False) is False:
                continue  # not written, or known to have no dependants
            if outcome.kind == "success":
                succeeded.append(self._public_id(outcome.id))
            elif outcome.kind in {"failure", "abandon", "cancelled"}:
                failed.append(self._public_id(outcome.id))
        if succeeded:
            release_dependants(self.database, succeeded)
        if failed:
            end_dependants(self.database, failed)

    def _update_job_records(
        self, worker_id: str, pending: list[tuple[Outcome, Running]], written: dict[Any, Any]
    ) -> None:
        """A Job's record follows its task, in the transaction that ends the attempt."""
        from ..models import JobRecord

        for outcome, running in pending:
            row = running.row
            if not row.job_name or outcome.id not in written or outcome.kind == "release":
                continue
            duration = timedelta(seconds=outcome.extra.get("duration", 0.0))
            error = outcome.extra.get("error")
            status = {"success": "SUCCESSFUL", "retry": "READY"}.get(outcome.kind, "FAILED")
            JobRecord.objects.using(self.database).filter(
                task_id=self._public_id(row.id), job_name=row.job_name
            ).update(
                status=status,
                started_at=row.started_at,
                finished_at=row.claimed_at + duration,
                duration=duration,
                worker_id=worker_id,
                error="" if error is None else f"{_error_path(error)}: {error}",
            )

    def _report(self, worker_id: str, outcome: Outcome, running: Running, written: bool) -> None:
        row = running.row
        task_id = running.result.id if running.result is not None else self._public_id(row.id)
        if outcome.kind == "release":
            if written:
                logger.info("task %s %s released unfinished", task_id, row.task_path)
            return
        self.processed += 1
        if outcome.kind in {"failure", "abandon"}:
            self.failed += 1
        if not written:
            logger.warning(
                "task %s %s: result discarded, this worker no longer holds the task "
                "(its lease expired and it was reclaimed)",
                task_id,
                row.task_path,
            )
            return
        duration = outcome.extra.get("duration", 0.0)
        error = outcome.extra.get("error")
        logger.info(
            "task %s %s %s in %.1fms (attempt %d/%d)%s",
            task_id,
            row.task_path,
            _outcome_word(outcome.kind),
            duration * 1000,
            row.attempts,
            row.max_attempts,
            f": {_error_path(error)}: {error}" if error is not None else "",
        )
        result = running.result
        if result is not None and outcome.kind in {"success", "failure"}:
            finished_at = row.claimed_at + timedelta(seconds=duration)
            object.__setattr__(result, "finished_at", finished_at)
            if outcome.kind == "success":
                object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
                object.__setattr__(result, "_return_value", outcome.return_value)
            else:
                object.__setattr__(result, "status", TaskResultStatus.FAILED)
            self.backend.send_signal("task_finished", result)

    def _release_all(self, worker_id: str) -> None:
        """Give back every claim this slot still holds, without spending attempts."""
        with self._lock:
            held = list(self._held.get(worker_id, {}).values())
        if held:
            self._flush(
                worker_id,
                [(Outcome(r.row.id, r.row.version, "release"), r) for r in held],
            )

    # -- heartbeat ---------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        next_renew = time.monotonic() + self.heartbeat_interval
        while not self.halt.wait(0.1 if self.stopping.is_set() else 0.25):
            if os.getppid() != self._parent_pid:
                logger.warning("supervisor is gone; stopping")
                self.stop()
            if self.stopping.is_set() and time.monotonic() > self.stop_deadline:
                self._give_up_running()
            self._watch_timeouts()
            if time.monotonic() >= next_renew:
                next_renew = time.monotonic() + self.heartbeat_interval
                self._renew()
        connections.close_all()

    def _renew(self) -> None:
        with self._lock:
            claims = {
                worker_id: [(r.row.id, r.row.version) for r in held.values() if not r.lost]
                for worker_id, held in self._held.items()
            }
        for worker_id, held in claims.items():
            if not held:
                continue

            def renew(worker_id: str = worker_id, held: list = held) -> tuple[set[Any], set[Any]]:
                connection = connections[self.database]
                with connection.cursor() as cursor:
                    return dialect_for(connection).renew(cursor, held, worker_id, self.lease)

            try:
                still, cancel = renew()
            except DatabaseError as exc:
                logger.warning("lease renewal failed (%s); retrying", exc)
                _close_quietly(self.database)
                continue
            lost = {task_id for task_id, _ in held} - still
            with self._lock:
                mine = self._held.get(worker_id, {})
                for task_id in cancel:
                    running = mine.get(task_id)
                    if running is not None and not running.cancel:
                        running.cancel = True
                        running.stop.set()
                        logger.info("task %s: cancel requested; asking it to stop", task_id)
                for task_id in lost:
                    running = mine.get(task_id)
                    if running is not None and not running.lost:
                        running.lost = True
                        running.stop.set()
                        logger.warning(
                            "task %s: lease lost (reclaimed or changed by someone else); "
                            "its result will not be written",
                            task_id,
                        )
        self._report_alive()

    def _watch_timeouts(self) -> None:
        """Ask a task past its timeout to stop; if it ignores that, recycle the process."""
        now = time.monotonic()
        with self._lock:
            running = [
                (worker_id, r)
                for worker_id, held in self._held.items()
                for r in held.values()
                if r.timeout is not None and r.started is not None
            ]
        for worker_id, task in running:
            elapsed = now - task.started  # type: ignore[operator]
            if not task.timed_out and elapsed > task.timeout:  # type: ignore[operator]
                task.timed_out = True
                task.stop.set()
                logger.warning(
                    "task %s ran past its timeout of %gs; asking it to stop",
                    task.row.id,
                    task.timeout,
                )
            elif task.timed_out and elapsed > task.timeout + self.timeout_grace:  # type: ignore[operator]
                self._recycle_for_timeout(worker_id, task)

    def _recycle_for_timeout(self, worker_id: str, stuck: Running) -> None:
        """Fail the stuck task (retried if attempts remain), give the rest back, exit.

        A thread cannot be killed safely mid-write; a process can. The
        supervisor starts a fresh one.
        """
        error = TaskTimeout(
            f"ran past its timeout of {stuck.timeout:g}s and did not stop within "
            f"{self.timeout_grace:g}s; its worker process was recycled"
        )
        logger.error("task %s %s", stuck.row.id, error)
        failure = self._failure(
            worker_id, stuck.row, error, stuck.started or time.monotonic(), task=stuck.task
        )
        with self._lock:
            held = {w: list(h.values()) for w, h in self._held.items()}
        for holder, runnings in held.items():
            outcomes = [
                failure if r is stuck else Outcome(r.row.id, r.row.version, "release")
                for r in runnings
            ]
            try:
                connection = connections[self.database]
                with transaction.atomic(using=self.database), connection.cursor() as cursor:
                    dialect_for(connection).finish(cursor, outcomes, holder)
            except DatabaseError as exc:
                logger.warning("could not write before recycling (%s); leases will expire", exc)
        logging.shutdown()
        os._exit(EXIT_RECYCLE)

    def _processor_threads(self) -> list[threading.Thread]:
        from ..checkout import registered_processors, run_processor

        mode = "skip-locked" if self.mode == "skip-locked" else "optimistic"
        return [
            threading.Thread(
                target=run_processor,
                args=(
                    processor,
                    f"{self.name}:{processor.name}:{get_random_string(6)}",
                    self.stopping,
                ),
                kwargs={"poll_interval": self.poll_interval, "mode": mode},
                name=f"rdbtasks-processor-{processor.name}",
                daemon=True,
            )
            for processor in registered_processors()
        ]

    # -- the registry of workers -------------------------------------------------------

    def _register(self) -> None:
        from ..models import Worker as WorkerRow

        rows = WorkerRow.objects.using(self.database)
        # Rows of workers gone for a day are history nobody reads.
        rows.filter(last_heartbeat_at__lt=DbNow() - timedelta(days=1)).delete()
        fields = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": list(self.queues),
            "mode": self.mode,
            "threads": self.threads,
            "batch": self.batch,
            "started_at": DbNow(),
            "last_heartbeat_at": DbNow(),
            "stopped_at": None,
            "running": 0,
            "done": 0,
            "failed": 0,
        }
        # Update, else insert: no read-then-write transaction (which SQLite
        # cannot upgrade while another process writes).
        if not rows.filter(name=self.name).update(**fields):
            try:
                with transaction.atomic(using=self.database):
                    rows.create(name=self.name, **fields)
            except IntegrityError:
                rows.filter(name=self.name).update(**fields)

    def _report_alive(self) -> None:
        from ..models import Worker as WorkerRow

        with self._lock:
            running = sum(len(held) for held in self._held.values())
        try:
            WorkerRow.objects.using(self.database).filter(name=self.name).update(
                last_heartbeat_at=DbNow(),
                running=running,
                done=self.processed,
                failed=self.failed,
            )
        except DatabaseError as exc:
            logger.warning("could not update the worker registry (%s)", exc)
            _close_quietly(self.database)

    def _deregister(self) -> None:
        from ..models import Worker as WorkerRow

        WorkerRow.objects.using(self.database).filter(name=self.name).update(
            stopped_at=DbNow(),
            last_heartbeat_at=DbNow(),
            running=0,
            done=self.processed,
            failed=self.failed,
        )

    def _give_up_running(self) -> None:
        """The grace period is over: release every claim and leave at once."""
        logger.warning("grace period over; releasing unfinished tasks and exiting")
        with self._lock:
            held = {w: list(h.values()) for w, h in self._held.items()}
        for worker_id, runnings in held.items():
            outcomes = [Outcome(r.row.id, r.row.version, "release") for r in runnings]
            if not outcomes:
                continue
            try:
                connection = connections[self.database]
                with transaction.atomic(using=self.database), connection.cursor() as cursor:
                    written = dialect_for(connection).finish(cursor, outcomes, worker_id)
                logger.info("released %d unfinished tasks", len(written))
            except DatabaseError as exc:
                logger.warning("could not release claims (%s); their leases will expire", exc)
        logging.shutdown()
        os._exit(0)

    # -- database trouble --------------------------------------------------------------

    def _with_db(
        self, operation: Callable[[], T], what: str, *, give_up_when_stopping: bool = False
    ) -> T | None:
        """Run ``operation``, retrying through database errors with backoff.

        A lost connection is closed and reopened on the next try. Nothing held
        is dropped meanwhile: at worst a lease expires and the task is reclaimed.
        """
        delay = 0.1
        failures = 0
        while True:
            try:
                return operation()
            except DatabaseError as exc:
                failures += 1
                log = logger.warning if failures == 1 or failures % 20 == 0 else logger.debug
                log(
                    "database error during %s (%s: %s); retrying in %.1fs",
                    what,
                    type(exc).__name__,
                    exc,
                    delay,
                )
                _close_quietly(self.database)
            if give_up_when_stopping and self.stopping.is_set():
                return None
            # Jitter: processes that failed together must not retry together.
            if self.halt.wait(delay * random.uniform(0.5, 1.5)):
                return None
            delay = min(delay * 2, 5.0)


def _outcome_word(kind: str) -> str:
    return {
        "success": "succeeded",
        "failure": "failed",
        "retry": "failed, will retry",
        "abandon": "failed (worker lost, no attempts left)",
    }.get(kind, kind)


def _close_quietly(alias: str) -> None:
    try:
        connections[alias].close()
    except DatabaseError:
        pass


def _reset_connections() -> None:
    """Undo what a task may have left on this thread's connections.

    Like Django's request-end cleanup, but the connection stays open whatever
    ``CONN_MAX_AGE`` says: reconnecting per task would triple the cost.
    """
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        if connection.in_atomic_block or (
            connection.get_autocommit() != connection.settings_dict["AUTOCOMMIT"]
        ):
            _close_quietly(connection.alias)
        elif connection.errors_occurred:
            if connection.is_usable():
                connection.errors_occurred = False
            else:
                _close_quietly(connection.alias)
