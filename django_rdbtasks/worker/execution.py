"""Running one task: a claimed row in, an ``Outcome`` out.

Nothing here writes the task row: the outcome says what to write, and the
loop hands it to the claim store with the next claim. What a task does while
it runs (progress, checkpoints, the record of a lost
attempt) goes through the small ``ExecutionStore`` interface, so this module
can be tested with a fake one and no database.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from traceback import format_exception
from typing import Any, Protocol

from ..backend import RDBTaskBackend
from ..compat import TASK_BASE_CLASSES, TaskResult, normalize_json
from ..context import UNSET, RDBTaskContext
from ..database_errors import describe, is_refusal
from ..db.rows import ClaimedRow, Outcome
from ..exceptions import (
    HandOver,
    InvalidTaskPath,
    TaskCancelled,
    TaskTimeout,
    ValueNotStorable,
    WorkerLost,
    error_path,
)
from ..idempotency import AlreadyDone, current_task, once
from ..keys import task_key
from ..loading import TaskNotHere, load_task
from ..observability import tracing
from ..results import running_result
from ..states import AttemptOutcome, OutcomeKind
from ..storable import (
    DEFAULT_MAX_ERROR_BYTES,
    PROGRESS_MESSAGE_CHARS,
    StorageLimits,
    escape_unstorable,
    json_problem,
    readable_text,
)
from . import task_logging
from .missing import missing_tasks
from .task_connections import reset_task_connections

logger = logging.getLogger("django_rdbtasks.worker")


class ExecutionStore(Protocol):
    """What running a task needs of the database (``ClaimStore`` in production)."""

    def public_id(self, raw_id: Any) -> str: ...

    def save_progress(
        self,
        row: ClaimedRow,
        worker_id: str,
        *,
        progress: float | None,
        message: str,
        checkpoint: Any,
        checkpoint_changed: bool,
    ) -> bool: ...

    def note_lost_attempt(self, row: ClaimedRow, worker_id: str, entry: dict) -> bool: ...


@dataclass(slots=True)
class Running:
    """A claimed row, from its claim until its outcome is written."""

    row: ClaimedRow
    worker_id: str
    result: TaskResult | None = None
    #: The lease keeper found the claim gone: whatever we write will match nothing.
    lost: bool = False
    #: An operator asked to cancel it.
    cancel: bool = False
    #: The task should stop: cancelled, lost, timed out, or the worker is stopping.
    #: A plain flag: set by the keeper, read by the task through its context.
    stop_requested: bool = False
    task: Any = None
    started: float | None = None  # monotonic, while it runs
    timeout: float | None = None
    timed_out: bool = False


class Control:
    """The worker's side of a task's context: stop requests, progress, checkpoints."""

    def __init__(
        self,
        store: ExecutionStore,
        running: Running,
        *,
        interval: float,
        limits: StorageLimits | None = None,
    ) -> None:
        self.store = store
        self.running = running
        self.interval = interval
        #: What a checkpoint may be (checked by the context, in the task).
        self.limits = limits or StorageLimits()
        self.checkpoint: Any = running.row.checkpoint
        self.progress: float | None = None
        self.message = ""
        self.stop_observed = False
        #: The database refused what the task reported: the task fails with it.
        self.refused: ValueNotStorable | None = None
        self._dirty = False
        self._checkpoint_dirty = False
        self._last_write = 0.0

    def should_stop(self) -> bool:
        if self.running.stop_requested:
            self.stop_observed = True
            return True
        return False

    def update(self, progress: Any, message: str, checkpoint: Any, force: bool) -> None:
        if self.refused is not None:
            raise self.refused  # it fails the task anyway: no more writes
        if progress is not UNSET:
            # Text for people: kept readable (no NUL) and as long as its column.
            self.progress = progress
            self.message = escape_unstorable(message)[:PROGRESS_MESSAGE_CHARS]
        if checkpoint is not UNSET:
            self.checkpoint, self._checkpoint_dirty = checkpoint, True
        self._dirty = True
        if force or time.monotonic() - self._last_write >= self.interval:
            self.flush()
            if self.refused is not None:
                raise self.refused

    def flush(self) -> None:
        """Write what changed, fenced by the claim; one try (a task must not hang on it).

        A write the database refuses (``database_errors.is_refusal``) would be
        refused again: the task is asked to stop and fails with it, not retried
        (``refused``). Any other error is logged; the next write tries again.
        """
        if not self._dirty or self.refused is not None:
            return
        running = self.running
        try:
            held = self.store.save_progress(
                running.row,
                running.worker_id,
                progress=self.progress,
                message=self.message,
                checkpoint=self.checkpoint,
                checkpoint_changed=self._checkpoint_dirty,
            )
        except Exception as exc:
            if is_refusal(exc):
                excerpt = readable_text(describe(exc), 1000, "message")
                self.refused = ValueNotStorable(
                    f"the database refused to store this task's progress or checkpoint: "
                    f"{excerpt}. The task is failed rather than retried: the same write "
                    "would be refused again."
                )
                running.stop_requested = True
                logger.error("task %s: %s", running.row.id, self.refused)
                return
            logger.warning("could not save progress of task %s (%s)", running.row.id, exc)
            return
        self._dirty = self._checkpoint_dirty = False
        self._last_write = time.monotonic()
        if not held:
            running.lost = True
            running.stop_requested = True


class Executor:
    """Runs claimed rows as framework tasks and says what became of each."""

    def __init__(
        self,
        backend: RDBTaskBackend,
        store: ExecutionStore,
        *,
        lease: float,
        poll_interval: float,
        progress_interval: float,
        stopping: threading.Event,
        after_task: Callable[[], None] = reset_task_connections,
    ) -> None:
        self.backend = backend
        #: What is undone after each task: on a worker, what the task left on
        #: its thread's connections; in a test's in-process drain (``testing``),
        #: only a check, since the test's own transaction is open on them.
        self.after_task = after_task
        self.store = store
        self.lease = lease
        self.poll_interval = poll_interval
        self.progress_interval = progress_interval
        self.stopping = stopping
        #: What of a task's data may be stored (storable.py).
        self.limits: StorageLimits = backend.storage_limits
        #: Whether a tracer provider records (an SDK is configured), asked once:
        #: projects configure it at start-up, before the worker runs.
        self.record_runs = tracing.ENABLED and tracing.provider_records()

    def run(self, running: Running) -> Outcome:
        if not self.record_runs and not (tracing.ENABLED and running.row.trace_context):
            return self._run(running)
        # A span around the whole run (the tracing extra): linked to the
        # enqueue's span, current while the task runs, ERROR if it failed.
        task_id = self.store.public_id(running.row.id)
        with tracing.RunSpan(running.row, running.worker_id, task_id) as span:
            return span.ended(self._run(running))

    def _run(self, running: Running) -> Outcome:
        row = running.row
        if row.lost_from is not None:
            outcome = self._take_over_lost(running)
            if outcome is not None:
                return outcome
        started = time.monotonic()
        try:
            task = load_task(row.task_path)
        except InvalidTaskPath as exc:
            if isinstance(exc, TaskNotHere):
                verdict = missing_tasks(self.backend).decide(row, exc)
                if verdict.error is None:
                    # Code another worker may have (a rolling deploy): back, attempt unspent.
                    return self._outcome(
                        running, OutcomeKind.POSTPONE, started, delay=verdict.delay or 0, error=exc
                    )
                exc = verdict.error
            # Permanent: retrying cannot make the path valid.
            return self._failure(running, exc, started, retry=False)

        task = self._as_enqueued(task, row)
        result = running_result(
            task,
            self.store.public_id(row.id),
            row.enqueued_at,
            row.started_at,
            row.claimed_at,
            row.args,
            row.kwargs,
            self.backend.alias,
            [e.get("worker_id", "") for e in row.history] + [running.worker_id],
        )
        running.result = result
        if logger.isEnabledFor(logging.DEBUG):
            # At INFO its one line says, when it ends, when it started (ran ...).
            logger.debug(
                "task %s %s started (attempt %d of %d)",
                result.id,
                row.task_path,
                row.attempts,
                row.max_attempts,
            )
        task_logging.send_signal(self.backend, "task_started", result)
        token = current_task.set((result.id, running.worker_id))
        # Only a task that takes a context can report progress or see a stop.
        control = (
            Control(self.store, running, interval=self.progress_interval, limits=self.limits)
            if task.takes_context
            else None
        )
        running.task = task
        running.timeout = getattr(task, "timeout", None)
        running.started = started
        try:
            value = self._call(task, result, row, control)
        except HandOver as handover:
            if control is not None:
                control.flush()
                if control.refused is not None:
                    return self._failure(running, control.refused, started, retry=False)
            return self._handed_over(running, started, handover.delay)
        except AlreadyDone as done:
            outcome = self._outcome(running, OutcomeKind.SUCCESS, started)
            assert outcome.entry is not None
            outcome.entry.update(outcome=AttemptOutcome.ALREADY_DONE, detail=str(done))
            return outcome
        except BaseException as error:  # a task's SystemExit must not end the worker
            if control is not None:
                control.flush()
                if control.refused is not None:
                    return self._failure(running, control.refused, started, retry=False)
            if running.cancel:
                return self._cancelled(running, started)
            reason = self._timeout_error(running) if running.timed_out else error
            # An exception may say retrying cannot help (retryable = False).
            retry = bool(getattr(reason, "retryable", True))
            return self._failure(running, reason, started, task=task, retry=retry)
        finally:
            running.started = None
            current_task.reset(token)
            self.after_task()
        if control is not None:
            control.flush()
            if control.refused is not None:
                # What it reported could not be stored: it fails, whatever it returned.
                return self._failure(running, control.refused, started, retry=False)
        if running.cancel:
            return self._cancelled(running, started)
        if running.timed_out:
            return self._failure(running, self._timeout_error(running), started, task=task)
        if control is not None and control.stop_observed and self.stopping.is_set():
            # It saw the shutdown and returned early: another worker resumes it.
            return self._handed_over(running, started, 0.0)
        try:
            value = _json_value(task, value, self.limits.result)
        except (TypeError, ValueError) as exc:
            return self._failure(running, exc, started, retry=False)
        outcome = self._outcome(running, OutcomeKind.SUCCESS, started)
        outcome.return_value = value
        return outcome

    def _as_enqueued(self, task: Any, row: ClaimedRow) -> Any:
        """The task as it was enqueued (``using()`` options), as ``get_result()`` shows it."""
        enqueued = (row.priority, row.queue_name, row.requested_run_after, self.backend.alias)
        if (task.priority, task.queue_name, task.run_after, task.backend) == enqueued:
            return task  # the common case: no copy, no validation
        return dataclasses.replace(
            task,
            priority=row.priority,
            queue_name=row.queue_name,
            run_after=row.requested_run_after,
            backend=self.backend.alias,
        )

    def _call(self, task: Any, result: TaskResult, row: ClaimedRow, control: Control | None) -> Any:
        args: list[Any] = list(row.args)
        if control is not None:  # the task takes a context
            args.insert(0, RDBTaskContext(task_result=result, control=control))
        template = getattr(task, "once_key", None)
        if template is None:
            return call_task(task, args, row.kwargs)
        key = task_key(template, task, row.args, row.kwargs)
        with once(task.module_path, key, using=self.backend.database):
            return call_task(task, args, row.kwargs)

    # -- outcomes ----------------------------------------------------------------------

    def _outcome(
        self,
        running: Running,
        kind: OutcomeKind,
        started: float,
        *,
        attempt: AttemptOutcome | None = None,
        error: BaseException | None = None,
        delay: float = 0.0,
    ) -> Outcome:
        duration = time.monotonic() - started
        row = running.row
        entry = None
        if attempt is not None or kind == OutcomeKind.SUCCESS:
            entry = history_entry(
                running, duration, attempt or AttemptOutcome.SUCCESSFUL, error, self.limits.error
            )
        return Outcome(
            row.id,
            row.version,
            kind,
            entry=entry,
            delay=delay,
            duration=duration,
            error=error,
            row=row,
        )

    def _failure(
        self,
        running: Running,
        exc: BaseException,
        started: float,
        *,
        task: Any = None,
        retry: bool = True,
    ) -> Outcome:
        row = running.row
        if retry and row.attempts < row.max_attempts:
            delay = self.backend.retry_delay(task, row.attempts)
            return self._outcome(
                running,
                OutcomeKind.RETRY,
                started,
                attempt=AttemptOutcome.RETRY,
                error=exc,
                delay=delay,
            )
        return self._outcome(
            running, OutcomeKind.FAILURE, started, attempt=AttemptOutcome.FAILED, error=exc
        )

    def timed_out(self, running: Running, grace: float) -> Outcome:
        """The outcome of a task that ignored its timeout, written before the process recycles."""
        error = TaskTimeout(
            f"ran past its timeout of {running.timeout:g}s and did not stop within "
            f"{grace:g}s; its worker process was recycled"
        )
        return self._failure(running, error, running.started or time.monotonic(), task=running.task)

    def _handed_over(self, running: Running, started: float, delay: float) -> Outcome:
        return self._outcome(
            running, OutcomeKind.HANDOVER, started, attempt=AttemptOutcome.HANDED_OVER, delay=delay
        )

    def _timeout_error(self, running: Running) -> TaskTimeout:
        return TaskTimeout(f"ran past its timeout of {running.timeout:g}s")

    def _cancelled(self, running: Running, started: float) -> Outcome:
        error = TaskCancelled("cancelled by an operator while running")
        return self._outcome(
            running, OutcomeKind.CANCELLED, started, attempt=AttemptOutcome.CANCELLED, error=error
        )

    def release(self, running: Running) -> Outcome:
        """Give back a claimed task that never started, its attempt unspent.

        A takeover first records the attempt it took over, which stays spent:
        released without that, the lost attempt would vanish from the history
        and the task could run past its ``max_attempts``. If that was its last
        attempt, the task ends FAILED (``abandon``) instead.
        """
        if running.row.lost_from is not None:
            outcome = self._take_over_lost(running)
            if outcome is not None:
                return outcome
        return Outcome.release(running.row)

    def _take_over_lost(self, running: Running) -> Outcome | None:
        """Record the lost attempt; fail the task unrun if that was its last one."""
        row = running.row
        lost = row.lost_from
        assert lost is not None
        row.lost_from = None  # recorded once, whether it then runs or is released
        row.taken_over = True
        exc = WorkerLost(
            f"worker {lost.worker_id} stopped renewing its lease during attempt "
            f"{row.attempts - 1}; the task was reclaimed by {running.worker_id}"
        )
        entry: dict[str, Any] = {
            "attempt": row.attempts - 1,
            "worker_id": lost.worker_id,
            "started_at": _isoformat(lost.last_attempted_at),
            "finished_at": _isoformat(row.claimed_at),
            "outcome": AttemptOutcome.LOST,
            "exception_class_path": error_path(exc),
            "traceback": str(exc),
        }
        row.history.append(entry)
        logger.warning("task %s %s: %s", self.store.public_id(row.id), row.task_path, exc)
        if row.attempts - 1 >= row.max_attempts:
            return Outcome(
                row.id, row.version, OutcomeKind.ABANDON, entry=entry, error=exc, row=row
            )
        try:
            self.store.note_lost_attempt(row, running.worker_id, entry)
        except Exception as error:
            # The history misses one entry; the task itself is unharmed.
            logger.warning("could not record the lost attempt of %s (%s)", row.id, error)
        return None


#: The last claim time formatted, as (time, the same without its zone, text):
#: a round's claims share their database clock's time, so most tasks format
#: only their end.
_last_claim: tuple[datetime | None, datetime | None, str] = (None, None, "")


def _attempt_times(claimed_at: datetime, duration: float) -> tuple[str, str]:
    """``claimed_at`` and ``duration`` after it as ``isoformat()`` texts.

    A time of the database clock is in UTC (``datetime.UTC``): formatted
    without its zone, and the zone's text added, it is the same text in
    half the time (an aware ``isoformat()`` asks its zone for the offset).
    """
    global _last_claim  # one tuple, replaced whole: each thread reads a consistent one
    moment, naive, start = _last_claim
    # (Equal instants in two zones are equal datetimes, and their texts differ.)
    if moment != claimed_at or moment.tzinfo is not claimed_at.tzinfo:
        start = claimed_at.isoformat()
        naive = claimed_at.replace(tzinfo=None) if claimed_at.tzinfo is UTC else None
        _last_claim = (claimed_at, naive, start)
    end = timedelta(seconds=duration)
    if naive is None:
        return start, (claimed_at + end).isoformat()
    return start, (naive + end).isoformat() + "+00:00"


def history_entry(
    running: Running,
    duration: float,
    outcome: AttemptOutcome,
    exc: BaseException | None = None,
    error_limit: int = DEFAULT_MAX_ERROR_BYTES,
) -> dict[str, Any]:
    """One attempt in the task's history. Both ends come from the database clock:
    the claim's time plus the monotonic duration of the run.

    The traceback (which ends with the error's message) is kept readable and at
    most ``error_limit`` bytes (``storable.readable_text``): an error whose
    message holds a NUL, or runs to megabytes, keeps its class and a cut
    message, and fails or retries the task as it would have.
    """
    row = running.row
    started_at, finished_at = _attempt_times(row.claimed_at, duration)
    entry: dict[str, Any] = {
        "attempt": row.attempts,
        "worker_id": running.worker_id,
        "started_at": started_at,
        "finished_at": finished_at,
        "outcome": outcome,
    }
    if exc is not None:
        entry["exception_class_path"] = error_path(exc)
        entry["traceback"] = readable_text("".join(format_exception(exc)), error_limit, "traceback")
    return entry


#: Tasks whose function is a plain (not ``async``) function, by identity.
_sync_functions: dict[int, Callable[..., Any]] = {}
#: The framework's own ``Task.call`` (either API's), which the shortcut stands for.
_FRAMEWORK_CALLS = frozenset(getattr(cls, "call", None) for cls in TASK_BASE_CLASSES)


def call_task(task: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """``task.call(*args, **kwargs)``; for a plain function, that function called directly.

    The framework's ``call`` asks whether the function is a coroutine function
    every time; the answer never changes, so it is asked once per function.
    A ``Task`` class with a ``call`` of its own is always called through it.
    """
    func: Callable[..., Any] = task.func
    if _sync_functions.get(id(task)) is func:
        return func(*args, **kwargs)
    if type(task).call in _FRAMEWORK_CALLS and not inspect.iscoroutinefunction(func):
        _sync_functions[id(task)] = func
    return task.call(*args, **kwargs)


def _json_value(task: Any, value: Any, limit: int) -> Any:
    """The return value as stored, or the error the framework's own backends record.

    That is a plain ``TypeError`` (``ValueError`` for a value such as NaN or
    bytes that are not UTF-8), not a subclass: ``errors[0].exception_class``
    is part of the contract. The message adds the task and where it is defined;
    the framework's own error is its cause. JSON that a database would refuse
    (a NUL, a lone surrogate, over ``limit`` bytes: ``storable.py``) is
    ``ValueNotStorable``, a ``ValueError`` the framework has no counterpart of.
    """
    if value is None:
        return None  # most tasks: nothing to check
    try:
        value = normalize_json(value)
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        error = ValueError if isinstance(exc, ValueError) else TypeError
        raise error(
            f"{task.module_path}{_defined_at(task)} returned {type(value).__name__!s} "
            f"that cannot be stored as JSON: {exc}"
        ) from exc
    problem = json_problem(value, text, "the value", limit, "result")
    if problem:
        raise ValueNotStorable(
            f"{task.module_path}{_defined_at(task)} returned {type(value).__name__!s} that "
            f"cannot be stored: {problem}."
        )
    return value


def _defined_at(task: Any) -> str:
    code = getattr(getattr(task, "func", None), "__code__", None)
    return f" ({code.co_filename}, line {code.co_firstlineno})" if code else ""


def _isoformat(value: Any) -> str | None:
    return value.isoformat() if value is not None else None
