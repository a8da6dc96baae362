"""After an outcome is written (or found fenced off): the log line, the signal, the counters
and, when enabled, the Prometheus metrics."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..compat import TaskError, TaskResultStatus
from ..db.rows import Outcome
from ..exceptions import error_summary
from ..observability import metrics
from ..states import OutcomeKind
from . import task_logging
from .execution import Running

logger = logging.getLogger("django_rdbtasks.worker")


@dataclass
class Counters:
    """What this process has done, for the worker registry and ``--max-tasks``."""

    processed: int = 0
    failed: int = 0
    #: Claim statements made (transactions: each is one, or part of one), and
    #: tasks they claimed: tasks per claim transaction, logged at the end.
    claim_statements: int = 0
    claimed: int = 0
    #: Of those, tasks claimed by the hand-over alone (``Exchange.handed_over``):
    #: a limited task's next of its key, in the slot its round freed.
    handed_over: int = 0
    #: Public ids of tasks this process scheduled a retry for (``--burst`` waits for them).
    retrying: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


#: What a reporter's thread is handed: a batch of outcomes and which were written.
Batch = tuple[Sequence[tuple[Outcome, Running]], dict[Any, bool | None]]


class Reporter:
    """Tells what became of each outcome: counters, metrics, the log line, the signal.

    The counters and the metrics are updated by ``report`` itself. Each task's
    log line and ``task_finished`` signal are told by ``report`` too, or, once
    ``tell_in_background`` started a thread for them, by that thread, in the
    order reported: a lane's round thread then goes back to the database at
    once. Its round is what a drain of short tasks waits on, and a signal with
    the framework's receivers and a result brought up to date cost about a
    tenth of it (docs/benchmarks.md, "Reads that skip what others hold").
    """

    def __init__(self, backend: Any, counters: Counters, public_id: Any) -> None:
        self.backend = backend
        self.counters = counters
        self.public_id = public_id
        # None unless runworkers --metrics-port (or metrics.enable()) turned them on.
        self.metrics = metrics.current()
        # This worker's line is each task's one record (task_logging.py).
        task_logging.install()
        self._told: queue.SimpleQueue[Batch | None] | None = None
        self._teller: threading.Thread | None = None

    def tell_in_background(self, name: str) -> None:
        """From now on each task's log line and signal are told by a thread of their own."""
        self._told = queue.SimpleQueue()
        self._teller = threading.Thread(target=self._tell_all, name=name, daemon=True)
        self._teller.start()

    def close(self) -> None:
        """Once everything reported has been told (a background thread's last batch too)."""
        if self._teller is not None and self._told is not None:
            self._told.put(None)
            self._teller.join()
            self._teller = None

    def report(
        self, pairs: Sequence[tuple[Outcome, Running]], written: dict[Any, bool | None]
    ) -> None:
        self._count(pairs, written)
        if self.metrics is not None and pairs:
            try:
                self.metrics.record(pairs, written)
            except Exception as exc:  # a metric must never cost a task its result
                logger.warning("could not update metrics (%s)", exc)
        if not pairs:
            return
        if self._told is not None:
            self._told.put((pairs, written))
        else:
            self._tell(pairs, written)

    def _tell_all(self) -> None:
        assert self._told is not None
        while (batch := self._told.get()) is not None:
            self._tell(*batch, robust=True)

    def _tell(
        self,
        pairs: Sequence[tuple[Outcome, Running]],
        written: dict[Any, bool | None],
        robust: bool = False,
    ) -> None:
        """Each task's log line and signal; ``robust``: a receiver that raises is
        logged and the other tasks are still told."""
        # Final failures are logged at ERROR, whatever this says.
        log = logger.isEnabledFor(logging.INFO)
        for outcome, running in pairs:
            try:
                self._one(outcome, running, outcome.id in written, log)
            except Exception:
                if not robust:
                    raise
                logger.exception("a task_finished receiver failed")

    def _count(
        self, pairs: Sequence[tuple[Outcome, Running]], written: dict[Any, bool | None]
    ) -> None:
        """The counters, once per batch (one lock)."""
        processed = failed = 0
        retrying, settled = [], []
        for outcome, running in pairs:
            kind = outcome.kind
            if kind == OutcomeKind.RELEASE:
                continue
            processed += 1
            failed += kind.counts_as_failure
            if kind == OutcomeKind.RETRY and outcome.id in written:
                retrying.append(self._task_id(running))
            elif self.counters.retrying:
                settled.append(self._task_id(running))
        counters = self.counters
        with counters.lock:
            counters.processed += processed
            counters.failed += failed
            counters.retrying.update(retrying)
            counters.retrying.difference_update(settled)

    def _task_id(self, running: Running) -> str:
        result = running.result
        return result.id if result is not None else self.public_id(running.row.id)

    def _one(self, outcome: Outcome, running: Running, written: bool, log: bool) -> None:
        row = running.row
        kind = outcome.kind
        if kind == OutcomeKind.RELEASE:
            if written and log:
                logger.info("task %s %s released unfinished", self._task_id(running), row.task_path)
            return
        if not written:
            task_id = self._task_id(running)
            logger.warning(
                "task %s %s: result discarded, this worker no longer holds the task "
                "(its lease expired and it was reclaimed)",
                task_id,
                row.task_path,
            )
            return
        if log or kind.counts_as_failure:
            self._log(outcome, running)
        result = running.result
        # The result is made final for task_finished's receivers: with none to
        # call (only the guards), nothing would read it.
        if (
            result is not None
            and kind in (OutcomeKind.SUCCESS, OutcomeKind.FAILURE)
            and task_logging.sends(self.backend, "task_finished")
        ):
            finished_at = row.claimed_at + timedelta(seconds=outcome.duration)
            object.__setattr__(result, "finished_at", finished_at)
            if kind == OutcomeKind.SUCCESS:
                object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
                object.__setattr__(result, "_return_value", outcome.return_value)
            else:
                object.__setattr__(result, "status", TaskResultStatus.FAILED)
                # As the framework's own backends do: the error is on the
                # result before task_finished is sent.
                if outcome.entry is not None and "exception_class_path" in outcome.entry:
                    result.errors.append(
                        TaskError(
                            exception_class_path=outcome.entry["exception_class_path"],
                            traceback=outcome.entry.get("traceback", ""),
                        )
                    )
            if kind == OutcomeKind.FAILURE and outcome.error is not None:
                self._send_failed(result, outcome.error)
            else:
                task_logging.send_signal(self.backend, "task_finished", result)

    def _log(self, outcome: Outcome, running: Running) -> None:
        """The task's one record: what became of it, how long it ran, which attempt.

        A final failure is an ERROR with the task's exception and its own
        traceback (what the framework's record of it carried, which this one
        replaces: task_logging.py); anything else is INFO, a retry with its
        error in one line.
        """
        row = running.row
        kind = outcome.kind
        when = ""
        if kind in (OutcomeKind.RETRY, OutcomeKind.POSTPONE, OutcomeKind.HANDOVER):
            when = f" in {format_seconds(outcome.delay)}" if outcome.delay > 0 else " at once"
        details = [f"ran {format_seconds(outcome.duration)}"]
        attempt = attempt_number(outcome)
        if attempt is not None:
            details.append(f"attempt {attempt} of {row.max_attempts}")
        error = outcome.error
        arguments = (self._task_id(running), row.task_path, kind.log_word, when, ", ".join(details))
        if kind == OutcomeKind.FAILURE and error is not None:
            logger.error(
                "task %s %s %s%s (%s)",
                *arguments,
                exc_info=(type(error), error, error.__traceback__),
            )
        elif kind.counts_as_failure:
            summary = f": {error_summary(error)}" if error is not None else ""
            logger.error("task %s %s %s%s (%s)%s", *arguments, summary)
        else:
            summary = f": {error_summary(error)}" if error is not None else ""
            logger.info("task %s %s %s%s (%s)%s", *arguments, summary)

    def _send_failed(self, result: Any, error: BaseException) -> None:
        """``task_finished`` with the task's exception as the one being handled.

        The framework's receiver logs the failure with ``sys.exc_info()`` (the
        backport's with ``logger.exception``), as its own backends send the
        signal from their ``except`` block. The outcome was written since, so
        the exception is raised again here; its traceback is put back, so the
        log shows the task's stack and not this frame.
        """
        stack, context = error.__traceback__, error.__context__
        try:
            raise error
        except BaseException:
            # sys.exc_info() reads the traceback from the exception (3.11+).
            error.__traceback__, error.__context__ = stack, context
            task_logging.send_signal(self.backend, "task_finished", result)


def attempt_number(outcome: Outcome) -> int | None:
    """The attempt an outcome is about (None: none was spent, nothing to number).

    An abandoned task's is the lost attempt its history records, not the one
    the takeover's claim counted and gave back (that read "attempt 4/3").
    """
    if outcome.entry is not None and isinstance(outcome.entry.get("attempt"), int):
        return int(outcome.entry["attempt"])
    if outcome.row is not None and outcome.kind.spends_attempt:
        return int(outcome.row.attempts)
    return None


def format_seconds(seconds: float) -> str:
    """A duration for a log line: '850µs', '12.3ms', '4.20s'."""
    if seconds < 0.001:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1:
        return f"{seconds * 1000:.1f}ms"
    return f"{seconds:.2f}s"
