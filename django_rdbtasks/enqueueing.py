"""The enqueue engine: every task row is built and inserted here.

The arguments encoded and checked, the dedup key and the limit computed, the
row (``db.rows.NewTask`` or a bulk enqueue's ``NewBatch``) made and inserted,
the result returned and ``task_enqueued`` sent. ``backend.RDBTaskBackend``
enqueues through it; so do a workflow's steps (``dependencies.py``, which set
what makes a row wait for its parents) and a saga's compensations
(``sagas.py``), so that a row is made one way whoever enqueues it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connections, transaction

from .arguments import encode_arguments, encode_arguments_and_values
from .backend_interface import TaskBackendInterface
from .compat import InvalidTask, Task, TaskResult
from .db import dialect_for
from .db.cursors import kept_cursor
from .db.rows import NewBatch, NewTask, new_ids
from .exceptions import ArgumentsNotJSON, InvalidTaskPath
from .keys import task_key
from .limits import LimitSpec, QueueLimit, limit_for, limit_spec
from .loading import load_task
from .models import Task as TaskRow
from .models import uuid7
from .observability import tracing
from .results import ready_result, stamp_enqueued_at
from .stored import result_from_row

#: A compensation's messages go to the sagas' logger, where an operator follows sagas.
sagas_logger = logging.getLogger("django_rdbtasks.sagas")

#: The ``dedup_key`` column's length.
MAX_DEDUP_KEY_LENGTH = 255

#: The arguments as the task will receive them: ``(args, kwargs)``.
Decoded = tuple[list[Any], dict[str, Any]]


class Enqueuer:
    """Builds and inserts the task rows of one task backend, with its settings."""

    def __init__(self, backend: TaskBackendInterface) -> None:
        # The backend itself, not a copy of its settings: they are read at each enqueue.
        self.backend = backend

    # -- the rows ------------------------------------------------------------------------

    def refuse_bad_options(self) -> None:
        if self.backend.option_errors:
            raise ImproperlyConfigured(
                f"Task backend {self.backend.alias!r}: {' '.join(self.backend.option_errors)}"
            )

    def new_task(
        self, task: Task, args: Sequence[Any], kwargs: dict[str, Any], *, job_name: str = ""
    ) -> NewTask:
        """The row to insert for ``task(*args, **kwargs)``."""
        return self.prepare(task, args, kwargs, job_name=job_name)[0]

    def prepare(
        self, task: Task, args: Sequence[Any], kwargs: dict[str, Any], *, job_name: str = ""
    ) -> tuple[NewTask, Decoded]:
        """The row to insert, and the arguments as the task will receive them."""
        backend = self.backend
        self.refuse_bad_options()
        args_json, kwargs_json, values, keywords = encode_arguments(
            args, kwargs, backend.storage_limits.arguments
        )
        dedup = getattr(task, "dedup_key", None)
        dedup_key = None if dedup is None else task_key(dedup, task, args, kwargs, what="Dedup key")
        if dedup_key is not None and len(dedup_key) > MAX_DEDUP_KEY_LENGTH:
            raise InvalidTask(
                f"A dedup key is at most {MAX_DEDUP_KEY_LENGTH} characters: {dedup_key[:60]!r}..."
            )
        limit = limit_for(task, backend.queue_limits)  # computed before anything is written
        new = NewTask(
            id=uuid7(),
            task_path=task.module_path,
            queue_name=task.queue_name,
            backend_name=backend.alias,
            priority=task.priority,
            args_json=args_json,
            kwargs_json=kwargs_json,
            max_attempts=backend.max_attempts_for(task),
            run_after=task.run_after,
            job_name=job_name,
            dedup_key=dedup_key,
            limit=limit_spec(limit, task, args, kwargs) if limit is not None else None,
        )
        return new, (values, keywords)

    def prepare_calls(
        self, task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]
    ) -> list[tuple[NewTask, Decoded]]:
        """``prepare`` for each of a bulk enqueue's calls; a refusal names the call."""
        prepared = []
        for index, (args, kwargs) in enumerate(calls):
            try:
                prepared.append(self.prepare(task, args, kwargs))
            except ArgumentsNotJSON as exc:
                raise ArgumentsNotJSON(f"calls[{index}]: {exc}") from exc
        return prepared

    def compensation(
        self, path: str, args: list[Any], kwargs: dict[str, Any], queue_name: str
    ) -> NewTask:
        """The row of a saga's compensation (``sagas.py``), enqueued while a step's outcome is
        written: nothing may refuse it, so its arguments (read back from the step's row) are
        not held to ``MAX_ARGUMENTS_BYTES`` and a key that cannot be computed falls back to
        its limit's default key."""
        backend = self.backend
        args_json, kwargs_json, _ = encode_arguments_and_values(args, kwargs)
        try:
            task = load_task(path)
        except InvalidTaskPath as exc:
            # Checked loadable at enqueue; this worker's code lacks it (a rollout):
            # enqueued anyway, for a worker that has it, on the step's queue.
            sagas_logger.warning(
                "Compensation %s cannot be loaded here (%s); enqueued anyway.", path, exc
            )
            # Its own limit is unknown here: its queue's (QUEUE_LIMITS), if any, still applies.
            unknown = SimpleNamespace(queue_name=queue_name, module_path=path)
            return NewTask(
                id=uuid7(),
                task_path=path,
                queue_name=queue_name,
                backend_name=backend.alias,
                priority=0,
                args_json=args_json,
                kwargs_json=kwargs_json,
                max_attempts=backend.max_attempts,
                run_after=None,
                limit=self._compensation_limit(unknown, args, kwargs),
            )
        return NewTask(
            id=uuid7(),
            task_path=path,
            queue_name=task.queue_name,
            backend_name=backend.alias,
            priority=task.priority,
            args_json=args_json,
            kwargs_json=kwargs_json,
            max_attempts=backend.max_attempts_for(task),
            run_after=None,
            limit=self._compensation_limit(task, args, kwargs),
        )

    def _compensation_limit(
        self, task: Any, args: list[Any], kwargs: dict[str, Any]
    ) -> LimitSpec | None:
        """The compensation's limit, computed as ``prepare`` computes it.

        A key that cannot be computed from these arguments cannot refuse the
        enqueue (the step's outcome is being written): the limit's default key
        is used instead, narrower, never none.
        """
        which = limit_for(task, self.backend.queue_limits)
        if which is None:
            return None
        try:
            return limit_spec(which, task, args, kwargs)
        except InvalidTask as exc:
            sagas_logger.error(
                "Compensation %s: %s; its limit's default key is used.", task.module_path, exc
            )
            if isinstance(which, QueueLimit):
                return limit_spec(QueueLimit(replace(which.limit, key=None)), task, args, kwargs)
            return limit_spec(replace(which, key=None), task, args, kwargs)

    # -- the insert ----------------------------------------------------------------------

    def insert(
        self, tasks: Sequence[NewTask] | NewBatch, meanwhile: Callable[[], object] | None = None
    ) -> Any:
        """Insert the rows; returns the time the database wrote them."""
        connection = connections[self.backend.database]
        dialect = dialect_for(connection)
        # None unless the caller is being traced (the tracing extra).
        span = tracing.enqueue_span(tasks) if tracing.ENABLED else None
        if span is None:
            return self._insert_rows(connection, dialect, tasks, meanwhile)
        with span:
            span.mark(tasks)  # its context goes into the rows' trace_context
            return self._insert_rows(connection, dialect, tasks, meanwhile)

    def _insert_rows(
        self,
        connection: Any,
        dialect: Any,
        tasks: Sequence[NewTask] | NewBatch,
        meanwhile: Callable[[], object] | None = None,
    ) -> Any:
        # The rows and their NOTIFY commit with the caller's transaction if one
        # is open, so a rollback takes the tasks with it; else in their own.
        # One statement is atomic by itself and needs no transaction around it.
        backend = self.backend
        cursor = kept_cursor(connection, dialect, prepare=backend.prepare)
        if isinstance(tasks, NewBatch):  # a bulk enqueue's, in its transaction
            return dialect.inserts.insert_batch(cursor, tasks, backend.notify, meanwhile)
        limited = [t for t in tasks if t.limit is not None]
        if dialect.inserts.insert_is_one_statement and not limited:
            return dialect.inserts.insert_tasks(cursor, tasks, backend.notify)
        with transaction.atomic(using=backend.database, savepoint=False):
            enqueued_at = dialect.inserts.insert_tasks(cursor, tasks, backend.notify)
            if limited:
                # In the rows' transaction: no worker sees them unlimited.
                dialect.limits.attach(cursor, limited)
            return enqueued_at

    # -- enqueue -------------------------------------------------------------------------

    def _new_result(
        self, task: Task, new: NewTask, enqueued_at: Any, decoded: Decoded | None = None
    ) -> TaskResult:
        args, kwargs = decoded or (json.loads(new.args_json), json.loads(new.kwargs_json))
        return ready_result(task, str(new.id), enqueued_at, args, kwargs, self.backend.alias)

    def enqueue(self, task: Task, new: NewTask, decoded: Decoded | None = None) -> TaskResult:
        """Insert one row (``prepare``'s, or one a workflow made wait) and send ``task_enqueued``.

        A row with a dedup key meeting an active one is not inserted: the
        result is that task's.
        """
        if new.dedup_key is not None:
            return self._enqueue_deduplicated(task, new)
        result = self._new_result(task, new, self.insert([new]), decoded)
        self.backend.send_signal("task_enqueued", result)
        return result

    def _enqueue_deduplicated(self, task: Task, new: NewTask) -> TaskResult:
        """Insert unless a READY or RUNNING task has the key; then return that one.

        The unique index on the active key decides, not a read before the
        write, so concurrent producers cannot both get in.
        """
        backend = self.backend
        for _ in range(5):
            try:
                with transaction.atomic(using=backend.database):
                    enqueued_at = self.insert([new])
            except IntegrityError:
                active = (
                    TaskRow.objects.using(backend.database)
                    .filter(active_dedup_key=new.dedup_key)
                    .first()
                )
                if active is not None:
                    return result_from_row(active, task, backend.alias)
                continue  # it finished in between: try again
            result = self._new_result(task, new, enqueued_at)
            backend.send_signal("task_enqueued", result)
            return result
        raise IntegrityError(f"Could not enqueue with dedup key {new.dedup_key!r}.")

    def bulk_enqueue(
        self, task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]], batch_size: int
    ) -> list[TaskResult]:
        """``RDBTaskBackend.bulk_enqueue`` of a task already validated."""
        backend = self.backend
        if getattr(task, "dedup_key", None) is not None:
            prepared = self.prepare_calls(task, calls)
            with transaction.atomic(using=backend.database, savepoint=False):
                return [self.enqueue(task, new, decoded) for new, decoded in prepared]
        self.refuse_bad_options()
        if limit_for(task, backend.queue_limits) is not None:
            return self._bulk_enqueue_limited(task, calls, batch_size)
        # Each column of the calls a list of its own: a bulk enqueue makes no
        # object per task that outlives the call but its result and values
        # (every one that does costs the garbage collector's passes again).
        args_json: list[str] = []
        kwargs_json: list[str] = []
        values: list[list[Any]] = []
        keywords: list[dict[str, Any]] = []
        limit = backend.storage_limits.arguments
        for index, (args, kwargs) in enumerate(calls):
            try:
                encoded = encode_arguments(args, kwargs, limit)
            except ArgumentsNotJSON as exc:
                raise ArgumentsNotJSON(f"calls[{index}]: {exc}") from exc
            args_json.append(encoded[0])
            kwargs_json.append(encoded[1])
            values.append(encoded[2])
            keywords.append(encoded[3])
        results: list[TaskResult] = []
        with transaction.atomic(using=backend.database, savepoint=False):
            for start in range(0, len(values), batch_size):
                end = start + batch_size
                batch = NewBatch(
                    task_path=task.module_path,
                    queue_name=task.queue_name,
                    backend_name=backend.alias,
                    priority=task.priority,
                    max_attempts=backend.max_attempts_for(task),
                    run_after=task.run_after,
                    ids=new_ids(min(end, len(values)) - start),
                    args_json=args_json[start:end],
                    kwargs_json=kwargs_json[start:end],
                )
                results += self._enqueue_batch(task, batch, values[start:end], keywords[start:end])
        for result in results:
            backend.send_signal("task_enqueued", result)
        return results

    def _enqueue_batch(
        self,
        task: Task,
        batch: NewBatch,
        values: list[list[Any]],
        keywords: list[dict[str, Any]],
    ) -> list[TaskResult]:
        """One statement of a bulk enqueue; its results made while the database writes it."""
        made: list[TaskResult] = []

        def make() -> None:
            alias = self.backend.alias
            made.extend(
                ready_result(task, result_id, None, args, kwargs, alias)
                for result_id, args, kwargs in zip(batch.ids, values, keywords, strict=True)
            )

        # Stamped with the rows' clock once they are in, before anyone sees them.
        stamp_enqueued_at(made, self.insert(batch, meanwhile=make))
        return made

    def _bulk_enqueue_limited(
        self, task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]], batch_size: int
    ) -> list[TaskResult]:
        # Each row's key is computed from its arguments and stored with it, in
        # the rows' transaction; their slots are made by the workers that meet
        # them (db/limits.py): a NewTask per row.
        prepared = self.prepare_calls(task, calls)
        results = []
        with transaction.atomic(using=self.backend.database, savepoint=False):
            for start in range(0, len(prepared), batch_size):
                chunk = prepared[start : start + batch_size]
                enqueued_at = self.insert([new for new, _ in chunk])
                results += [
                    self._new_result(task, new, enqueued_at, values) for new, values in chunk
                ]
        for result in results:
            self.backend.send_signal("task_enqueued", result)
        return results


def insert_compensations(using: str, rows: list[NewTask]) -> None:
    """Insert a saga's compensations, in the transaction of the settlement that made them.

    On the settlement's connection with a cursor of its own, and always
    waking the workers: the worker writing an outcome is not an enqueue.
    """
    connection = connections[using]
    limited = [new for new in rows if new.limit is not None]
    with connection.cursor() as cursor:
        dialect = dialect_for(connection)
        dialect.inserts.insert_tasks(cursor, rows, True)
        if limited:
            # As an enqueue does, in the rows' transaction: no worker sees them unlimited.
            dialect.limits.attach(cursor, limited)
