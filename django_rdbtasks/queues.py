"""Pausing and resuming a queue: what an operator does when a downstream service is down.

A paused queue's tasks stay where they are: no worker on any host claims from
it (the claim itself skips it, in every claim form and mode, on every
database), tasks already running finish, enqueues and cron ticks still add
tasks to it, and it stays paused across restarts until resumed. The pause is
a row of ``PausedQueue`` (who, when, why); the admin's dashboard, ``rdbtasks
pause``/``resume``/``status`` and the metrics read and write the same rows.
"""

from __future__ import annotations

import logging

from django.db import IntegrityError, connections, router, transaction

from .compat import task_backends
from .db import dialect_for
from .models import PausedQueue
from .suggest import did_you_mean

logger = logging.getLogger("django_rdbtasks.queues")


class UnknownQueue(ValueError):
    """A queue no task backend of the project has."""


def known_queues() -> set[str]:
    """Every queue of every task backend of the project (``TASKS[...]["QUEUES"]``)."""
    names: set[str] = set()
    for backend in task_backends.all():
        names.update(getattr(backend, "queues", None) or ())
    return names


def _database(using: str | None) -> str:
    return using or router.db_for_write(PausedQueue)


def _checked(queue: str) -> str:
    known = known_queues()
    if known and queue not in known:
        raise UnknownQueue(
            f"No task backend has a queue {queue!r} (QUEUES: {', '.join(sorted(known))})."
            + did_you_mean(queue, known)
        )
    return queue


def pause(queue: str, *, by: str = "", reason: str = "", using: str | None = None) -> bool:
    """Pause ``queue``; False if it was paused already (its first pause stands)."""
    alias = _database(using)
    _checked(queue)
    try:
        with transaction.atomic(using=alias):
            PausedQueue.objects.using(alias).create(
                queue_name=queue, paused_by=by[:150], reason=reason[:200]
            )
    except IntegrityError:
        return False
    logger.info(
        "queue %r paused%s%s", queue, f" by {by}" if by else "", f": {reason}" if reason else ""
    )
    return True


def resume(queue: str, *, by: str = "", using: str | None = None) -> bool:
    """Resume ``queue`` and wake the idle workers; False if it was not paused."""
    alias = _database(using)
    _checked(queue)
    with transaction.atomic(using=alias):
        deleted, _ = PausedQueue.objects.using(alias).filter(queue_name=queue).delete()
        if deleted:
            connection = connections[alias]
            with connection.cursor() as cursor:
                dialect_for(connection).notify(cursor, [queue])
    if deleted:
        logger.info("queue %r resumed%s", queue, f" by {by}" if by else "")
    return bool(deleted)


def paused_queues(using: str | None = None) -> dict[str, PausedQueue]:
    """The paused queues of the database, by name."""
    rows = PausedQueue.objects.using(_database(using)).order_by("queue_name")
    return {row.queue_name: row for row in rows}
