"""Enqueue driver for django-tasks-db (runs in its own virtualenv).

django-tasks-db has no bulk enqueue; "bulk" here is ``bulk_create`` on its
model with the fields its backend would set, not a public API. "transaction" is
``task.enqueue()`` once per task inside one ``transaction.atomic()``. Run with
``python driver.py enqueue|latency ...`` from this directory.
"""

import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import django

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/, for driverlib
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
django.setup()

from benchapp import tasks  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django_tasks.base import Task  # noqa: E402
from django_tasks_db.models import DBTaskResult, get_date_max  # noqa: E402
from driverlib import Driver, main  # noqa: E402


def bulk_create(task: Task, args: list[list[Any]]) -> None:
    rows = [
        DBTaskResult(
            id=uuid.uuid4(),
            args_kwargs={"args": call, "kwargs": {}},
            priority=task.priority,
            task_path=task.module_path,
            queue_name=task.queue_name,
            # The pre_save signal that sets this on enqueue does not fire on bulk_create.
            run_after=get_date_max(),
            backend_name="default",
        )
        for call in args
    ]
    DBTaskResult.objects.bulk_create(rows)


def enqueue_many(count: int) -> None:
    bulk_create(tasks.noop, [[]] * count)


def enqueue_in_transaction(count: int) -> None:
    with transaction.atomic():
        for _ in range(count):
            tasks.noop.enqueue()


def enqueue_mixed(items: Sequence[tuple[int, float]]) -> None:
    if len(items) == 1:
        tasks.mixed.enqueue(*items[0])
    else:
        bulk_create(tasks.mixed, [list(item) for item in items])


if __name__ == "__main__":
    main(
        Driver(
            prepare=connection.ensure_connection,
            enqueue_one=tasks.noop.enqueue,
            enqueue_many=enqueue_many,
            enqueue_keyed=tasks.record_start.enqueue,
            close=connection.close,
            enqueue_mixed=enqueue_mixed,
            enqueue_in_transaction=enqueue_in_transaction,
        )
    )
