"""``once()``: do a piece of work at most once per key, in the caller's transaction."""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from django.db import IntegrityError, router, transaction

from .db.functions import DbNow
from .models import JobRecord
from .states import TaskStatus

#: (task id, worker id) of the task this thread is running, set by the worker
#: so that a ``once()`` inside a task links its record to the task.
current_task: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "rdbtasks_current_task", default=None
)


class AlreadyDone(Exception):
    """The key was done before: the work must not happen again.

    Raised by ``once()`` before the block runs. A task that lets it propagate
    ends SUCCESSFUL (with no return value), not FAILED.
    """

    def __init__(self, name: str, key: str) -> None:
        super().__init__(f"{name} [{key}] was already done")
        self.name = name
        self.key = key


@contextmanager
def once(name: str, key: object, *, using: str | None = None) -> Iterator[JobRecord]:
    """Run the block only if ``(name, key)`` was never done; record it as done.

    ::

        with once("daily-report", key=today.isoformat()):
            send_report()

    The record is inserted first, in the same transaction as the block's own
    writes (the caller's transaction if one is open). A concurrent run with
    the same key waits on the unique index until the first commits, then gets
    ``AlreadyDone``; if the block raises, everything rolls back together and
    the key is free for the retry. Effects outside the database (an e-mail, an
    HTTP call) are not rolled back: do them last in the block.
    """
    alias = using or router.db_for_write(JobRecord)
    running = current_task.get()
    with transaction.atomic(using=alias):
        try:
            with transaction.atomic(using=alias):
                record = JobRecord.objects.using(alias).create(
                    job_name=name,
                    key=str(key),
                    status=TaskStatus.RUNNING,
                    started_at=DbNow(),
                    task_id=running[0] if running else None,
                    worker_id=running[1] if running else "",
                )
        except IntegrityError:
            raise AlreadyDone(name, str(key)) from None
        started = time.monotonic()
        yield record
        JobRecord.objects.using(alias).filter(pk=record.pk).update(
            status=TaskStatus.SUCCESSFUL,
            finished_at=DbNow(),
            duration=timedelta(seconds=time.monotonic() - started),
        )
