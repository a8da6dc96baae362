"""Enqueue driver for django-rdbtasks. Run as ``python driver.py enqueue|latency ...``.

"bulk" is the package's ``bulk_enqueue`` (multi-row inserts, one transaction);
"transaction" is ``task.enqueue()`` called once per task inside one ``transaction.atomic()``.
"""

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import django

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # bench/, for driverlib
sys.path.insert(1, str(HERE.parents[1]))  # the checkout, for django_rdbtasks
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
django.setup()

from benchapp import tasks  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from driverlib import Driver, main  # noqa: E402

from django_rdbtasks.backend import bulk_enqueue  # noqa: E402

NO_CALL: tuple[tuple, dict] = ((), {})


def enqueue_many(count: int) -> None:
    bulk_enqueue(tasks.noop, [NO_CALL] * count, batch_size=count)


def enqueue_in_transaction(count: int) -> None:
    with transaction.atomic():
        for _ in range(count):
            tasks.noop.enqueue()


def enqueue_mixed(items: Sequence[tuple[int, float]]) -> None:
    if len(items) == 1:
        tasks.mixed.enqueue(*items[0])
    else:
        bulk_enqueue(tasks.mixed, [(item, {}) for item in items], batch_size=len(items))


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
