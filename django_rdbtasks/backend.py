"""The Tasks framework backend: enqueue in the caller's transaction, read results."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from django.core import checks
from django.db import connections, transaction
from django.db.models import F

from .backend_interface import TaskBackendInterface
from .compat import (
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    framework_signals,
)
from .conf import DATABASE_MISSING, OPTION_ERROR, read_backend_options
from .db import dialect_for
from .db.functions import DbNow
from .enqueueing import Enqueuer
from .exceptions import InvalidTaskPath
from .limits import validate_limit
from .loading import check_loadable, load_task, note_declared
from .models import Task as TaskRow
from .models import TaskStatus
from .pooling import pooling_checks
from .rdbtask import RDBTask
from .reads import read_database_checks
from .results import RDBTaskResult
from .sagas import lock_workflows, settle_finished
from .stored import replace_unvalidated, result_from_row, unloadable_task
from .suggest import did_you_mean

# What this module has always offered, wherever it is defined now.
__all__ = ["RDBTask", "RDBTaskBackend", "RDBTaskResult", "bulk_enqueue"]

#: The keys of a ``TASKS`` entry the framework reads; any other is a typo (an error).
KNOWN_KEYS = ("BACKEND", "QUEUES", "OPTIONS")

#: Tasks made (by ``@task`` or ``using()``) with a queue their backend's QUEUES
#: lacks, by (backend alias, path, queue): reported by a system check
#: (checks.py, E062) and refused at enqueue. Bounded: ``using()`` makes copies.
DECLARED_OUTSIDE_QUEUES: dict[tuple[str, str, str], Task] = {}
DECLARED_OUTSIDE_QUEUES_MAX = 1000

#: The ``max_attempts`` column's largest value everywhere (an ``integer`` on PostgreSQL).
MAX_ATTEMPTS_LIMIT = 2**31 - 1


class RDBTaskBackend(TaskBackendInterface):
    task_class = RDBTask
    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True

    def __init__(self, alias: str, params: dict) -> None:
        queues = params.get("QUEUES")
        if queues is not None and not isinstance(queues, Iterable):
            params = {**params, "QUEUES": []}  # the framework's set() would raise: E003 says it
        super().__init__(alias, params)
        if queues is not None and not isinstance(queues, Iterable):
            params = {**params, "QUEUES": queues}
        #: The OPTIONS, typed and checked once (conf.py). A bad value is its
        #: default there, and a problem reported by check() and refused by
        #: enqueue(): raising here instead would make ``manage.py check`` crash
        #: rather than say so.
        self.config = read_backend_options(self.options)
        #: What is wrong with QUEUES (refused by enqueue() too).
        self.queue_errors: list[str] = []
        #: What is wrong with the entry itself (its keys), for check() only.
        self.settings_errors: list[str] = self._settings_errors(params)
        #: What enqueue() refuses to go on with.
        self.option_errors: list[str] = self.queue_errors + self.config.errors
        self.database: str = self.config.database
        self.max_attempts = self.config.max_attempts
        self.backoff = self.config.backoff
        self.max_backoff = self.config.max_backoff
        self.notify = self.config.notify
        #: What of a task's data may be stored (storable.py): checked at enqueue
        #: (arguments) and by the worker (results, errors, checkpoints).
        self.storage_limits = self.config.storage_limits
        self.queue_limits = dict(self.config.queue_limits)
        #: Whether the enqueue may keep its statement prepared in the session:
        #: not behind a transaction pooler, whose sessions change hands.
        self.prepare = not self.config.transaction_pooling
        #: Tasks validate_task() accepted, by id: a Task is immutable and so is
        #: this backend's configuration (the framework makes a new backend when
        #: TASKS changes), so the same task object needs checking once.
        self._valid_tasks: dict[int, Task] = {}
        #: Builds and inserts this backend's task rows (enqueueing.py).
        self.enqueuer = Enqueuer(self)

    def _settings_errors(self, params: dict) -> list[str]:
        """Unknown keys of the TASKS entry, and QUEUES that is not a list of names.

        QUEUES given as one string (``"QUEUES": "default"``) is refused by
        enqueue and by the checks; meanwhile it counts as that one queue, so
        that the error says QUEUES and not "Queue 'default' is not valid".
        """
        errors = [
            f"TASKS[{self.alias!r}] has the key {key!r}, which the Tasks framework does "
            f"not read (it reads {', '.join(KNOWN_KEYS)}).{did_you_mean(str(key), KNOWN_KEYS)}"
            for key in params
            if key not in KNOWN_KEYS
        ]
        queues = params.get("QUEUES")
        if isinstance(queues, str):
            self.queues = {queues}
            self.queue_errors.append(
                f"TASKS[{self.alias!r}]['QUEUES'] must be a list of queue names, not the "
                f"string {queues!r}: write [{queues!r}]."
            )
        elif queues is not None and (
            not isinstance(queues, list | tuple | set | frozenset)
            or not all(isinstance(name, str) and name for name in queues)
        ):
            self.queue_errors.append(
                f"TASKS[{self.alias!r}]['QUEUES'] must be a list of queue names, not {queues!r}."
            )
        return errors

    # -- validation --------------------------------------------------------------------

    def queue_problem(self, task: Task) -> str | None:
        """Why ``task``'s queue is not one of this backend's QUEUES (None: it is).

        The framework's own words ("Queue 'x' is not valid for backend.") name
        neither the task nor the setting to change.
        """
        if not self.queues or task.queue_name in self.queues:
            return None
        return (
            f"Queue {task.queue_name!r} is not valid for backend {self.alias!r}: task "
            f"{task.module_path} uses it, and TASKS[{self.alias!r}]['QUEUES'] is "
            f"{sorted(self.queues)}. Add it to QUEUES, or give the task one of those "
            f"(@task(queue_name=...) or .using(queue_name=...))."
            + did_you_mean(task.queue_name, self.queues)
        )

    def validate_declaration(self, task: Task) -> None:
        """What the framework checks as a task is made (``@task``, ``using()``): all of
        ``validate_task`` but the queue.

        A queue missing from QUEUES refused there ends every ``manage.py``
        command in a traceback at import, wherever a module imports the task.
        Such a task is remembered instead, reported by ``manage.py check``
        (E062, which also stops ``runworkers``), and refused by ``enqueue()``.
        """
        if self.queue_problem(task) is None:
            self.validate_task(task)
            return
        self.validate_task(replace_unvalidated(task, queue_name=sorted(self.queues)[0]))
        if len(DECLARED_OUTSIDE_QUEUES) >= DECLARED_OUTSIDE_QUEUES_MAX:
            DECLARED_OUTSIDE_QUEUES.clear()
        DECLARED_OUTSIDE_QUEUES[(self.alias, task.module_path, task.queue_name)] = task

    def validate_task(self, task: Task) -> None:
        problem = self.queue_problem(task)
        if problem is not None:
            raise InvalidTask(problem)
        super().validate_task(task)
        max_attempts = getattr(task, "max_attempts", None)
        if max_attempts is not None and (
            not isinstance(max_attempts, int)
            or isinstance(max_attempts, bool)
            or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT
        ):
            raise InvalidTask(
                f"max_attempts must be a whole number from 1 to {MAX_ATTEMPTS_LIMIT:,}."
            )
        backoff = getattr(task, "backoff", None)
        if backoff is not None and (not isinstance(backoff, int | float) or backoff < 0):
            raise InvalidTask("backoff must be a number of seconds, 0 or more.")
        timeout = getattr(task, "timeout", None)
        if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
            raise InvalidTask("timeout must be a positive number of seconds.")
        validate_limit(task)
        for option in ("dedup_key", "once_key"):
            value = getattr(task, option, None)
            if value is not None and not (isinstance(value, str) or callable(value)):
                raise InvalidTask(f"{option} must be a format string or a callable.")
        # For the system check of tasks no worker would load (checks.py, E012).
        note_declared(task.module_path)

    def _validate_once(self, task: Task) -> None:
        if self._valid_tasks.get(id(task)) is task:
            return
        self.validate_task(task)
        # Not in validate_task(): the framework calls that while @task runs,
        # before the module has the name the worker will look the task up by.
        try:
            check_loadable(task.module_path)
        except InvalidTaskPath as exc:
            raise InvalidTask(str(exc)) from exc
        # Deferred tasks are made per call (using(run_after=...)): not kept.
        if task.run_after is None:
            if len(self._valid_tasks) >= 1024:
                self._valid_tasks.clear()
            self._valid_tasks[id(task)] = task

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        errors = list(super().check(**kwargs))
        prefix = f"Task backend {self.alias!r}: "
        errors += [checks.Error(prefix + message, id=OPTION_ERROR) for message in self.queue_errors]
        errors += [problem.as_check(prefix) for problem in self.config.problems]
        errors += [
            checks.Error(message, id="django_rdbtasks.E060") for message in self.settings_errors
        ]
        errors += pooling_checks(self)
        errors += read_database_checks(self)
        if self.database not in connections:
            errors.append(
                checks.Error(
                    f"Task backend {self.alias!r} uses database {self.database!r}, "
                    "which is not in DATABASES.",
                    id=DATABASE_MISSING,
                )
            )
        elif connections[self.database].vendor not in {"postgresql", "mysql", "sqlite"}:
            errors.append(
                checks.Error(
                    f"django-rdbtasks does not support {connections[self.database].vendor}.",
                    id="django_rdbtasks.E002",
                )
            )
        return errors

    # -- per-task options --------------------------------------------------------------

    def max_attempts_for(self, task: Task) -> int:
        value = getattr(task, "max_attempts", None)
        return self.max_attempts if value is None else value

    def retry_delay(self, task: Task | None, attempt: int) -> float:
        """Exponential backoff with jitter: about base * 2^(attempt-1), half of it random."""
        base = getattr(task, "backoff", None)
        base = self.backoff if base is None else base
        delay = min(self.max_backoff, base * 2 ** max(attempt - 1, 0))
        return delay / 2 + random.uniform(0, delay / 2)

    # -- enqueue -----------------------------------------------------------------------

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self._validate_once(task)
        return self.enqueuer.enqueue(task, *self.enqueuer.prepare(task, args, kwargs))

    def enqueue_job_task(self, task: Task, kwargs: dict[str, Any], *, job_name: str) -> TaskResult:
        """Enqueue a Job's tick, marked so its JobRecord follows the task."""
        self.validate_task(task)
        return self.enqueuer.enqueue(
            task, self.enqueuer.new_task(task, [], kwargs, job_name=job_name)
        )

    def bulk_enqueue(
        self,
        task: Task,
        calls: Iterable[tuple[Sequence[Any], dict[str, Any]]],
        *,
        batch_size: int = 5000,
    ) -> list[TaskResult]:
        """Enqueue many runs of one task in one transaction, a batch per statement.

        Every call's arguments are checked before anything is written. Tasks
        with a dedup key are inserted one by one (each may meet its key, even
        one an earlier call of the same batch made).
        """
        self._validate_once(task)
        return self.enqueuer.bulk_enqueue(task, calls, batch_size)

    # -- results -----------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        try:
            row = TaskRow.objects.using(self.database).get(pk=uuid.UUID(str(result_id)))
        except (ValueError, TaskRow.DoesNotExist) as exc:
            raise TaskResultDoesNotExist(result_id) from exc
        try:
            task = load_task(row.task_path)
        except InvalidTaskPath:
            # The row is there, whatever became of its task (renamed, removed,
            # never importable here): its result still reads.
            task = unloadable_task(row.task_path, self.alias)
        return self.result_from_row(row, task)

    def result_from_row(self, row: TaskRow, task: Task) -> TaskResult:
        return result_from_row(row, task, self.alias)

    # -- operators -----------------------------------------------------------------

    def cancel(self, result_id: str) -> str:
        """Cancel a task: at once if it has not started, else ask it to stop.

        Returns the status it has now: CANCELLED, or RUNNING with the request
        recorded (the worker tells the task; it ends CANCELLED when it
        returns), or its final status if it had already finished.
        """
        rows = TaskRow.objects.using(self.database).filter(pk=result_id)
        with transaction.atomic(using=self.database):
            # Its workflow's row before its own: a worker settling the workflow
            # holds that row while it cancels the steps not started, this one too.
            lock_workflows(self.database, [result_id])
            if rows.filter(status__in=[TaskStatus.READY, TaskStatus.WAITING]).update(
                status=TaskStatus.CANCELLED, finished_at=DbNow(), version=F("version") + 1
            ):
                # Its dependants end; a workflow it is a step of compensates.
                settle_finished(self.database, [], [result_id])
                return TaskStatus.CANCELLED
        if rows.filter(status=TaskStatus.RUNNING).update(cancel_requested=True):
            return TaskStatus.RUNNING
        row = rows.values_list("status", flat=True).first()
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        return row

    def requeue(self, result_id: str) -> bool:
        """Run a FAILED or CANCELLED task again with fresh attempts, or a READY one now.

        The history of earlier attempts is kept. Returns whether it was requeued.
        """
        rows = TaskRow.objects.using(self.database).filter(pk=result_id)
        updated = rows.requeue()
        if updated and self.notify:
            connection = connections[self.database]
            queue = rows.values_list("queue_name", flat=True).first()
            if queue is not None:  # deleted in between: nothing to wake for
                with connection.cursor() as cursor:
                    dialect_for(connection).notify(cursor, [queue])
        return bool(updated)

    def send_signal(self, name: str, result: TaskResult) -> None:
        """Send one of the framework's signals, once. ``task_finished`` of a
        failure must be sent while its exception is being handled: the
        framework's receiver logs ``sys.exc_info()`` (see ``worker.reporting``)."""
        getattr(framework_signals, name).send(sender=type(self), task_result=result)


def bulk_enqueue(
    task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]], *, batch_size: int = 5000
) -> list[TaskResult]:
    """Enqueue many runs of ``task`` at once: ``[(args, kwargs), ...]``.

    The framework has no bulk API; this one inserts in batches of
    ``batch_size`` rows in one transaction and wakes the workers once.
    """
    backend = task.get_backend()
    if not isinstance(backend, RDBTaskBackend):
        raise TypeError(f"bulk_enqueue needs an RDBTaskBackend, not {type(backend).__name__}.")
    return backend.bulk_enqueue(task, calls, batch_size=batch_size)
