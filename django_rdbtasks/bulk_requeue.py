"""Requeueing tasks in bulk: the admin's *Retry all failed…* and ``manage.py requeue``.

The same change as ``RDBTaskBackend.requeue`` (READY now, fresh attempts,
history kept), made a batch of ids per statement.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.conf import settings
from django.db import connections, transaction
from django.db.models import QuerySet

from .compat import task_backends
from .db import dialect_for
from .models import Task, TaskStatus

#: What ``requeue`` accepts, as ``RDBTaskBackend.requeue`` does.
REQUEUEABLE = (TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.READY)


@dataclass(frozen=True, slots=True)
class Requeued:
    id: uuid.UUID
    task_path: str
    was: str


def requeue_tasks(
    queryset: QuerySet[Task],
    *,
    batch_size: int = 500,
    limit: int | None = None,
    on_batch: Callable[[list[Requeued]], None] | None = None,
) -> int:
    """Requeue the FAILED, CANCELLED or READY tasks of ``queryset``; return how many.

    The same change as ``RDBTaskBackend.requeue`` (READY now, fresh attempts,
    history kept), made a batch of ids per statement so that "retry all
    failed" after an outage touches thousands of rows in seconds. Each batch
    is its own short transaction: nothing holds locks on the table for long,
    and a status that changed in between (a worker claimed it) is respected
    by the ``status`` condition of the ``UPDATE``.
    """
    using = queryset.db
    candidates = queryset.filter(status__in=REQUEUEABLE).order_by("pk")
    done = 0
    after: uuid.UUID | None = None
    while limit is None or done < limit:
        page = candidates if after is None else candidates.filter(pk__gt=after)
        size = batch_size if limit is None else min(batch_size, limit - done)
        rows = list(page.values_list("pk", "task_path", "status", "queue_name")[:size])
        if not rows:
            break
        after = rows[-1][0]
        with transaction.atomic(using=using):
            requeued = _requeue_batch(using, rows)
            done += len(requeued)
            if requeued and on_batch is not None:
                on_batch(requeued)
    return done


def _requeue_batch(using: str, rows: list[tuple]) -> list[Requeued]:
    # Keep in step with RDBTaskBackend.requeue (tests/test_bulk_requeue.py compares the two).
    tasks = Task.objects.using(using)
    ids = [row[0] for row in rows]
    # Re-read under the same transaction: only rows still requeueable are changed,
    # and only those are reported.
    still = set(
        tasks.select_for_update()
        .filter(pk__in=ids, status__in=REQUEUEABLE)
        .order_by("pk")  # lock in id order, as workers do: no deadlock between us
        .values_list("pk", flat=True)
    )
    if not still:
        return []
    tasks.filter(pk__in=still).requeue()
    _notify(using, {row[3] for row in rows if row[0] in still})
    return [Requeued(row[0], row[1], row[2]) for row in rows if row[0] in still]


def _notify(using: str, queue_names: Iterable[str]) -> None:
    """Wake the workers of these queues (PostgreSQL NOTIFY, sent at commit)."""
    from .backend import RDBTaskBackend

    backends = (task_backends[alias] for alias in getattr(settings, "TASKS", {}))
    wants = any(
        isinstance(backend, RDBTaskBackend) and backend.database == using and backend.notify
        for backend in backends
    )
    if wants:
        connection = connections[using]
        with connection.cursor() as cursor:
            dialect_for(connection).notify(cursor, queue_names)
