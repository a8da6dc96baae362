"""Enqueue driver for Procrastinate (runs in its own virtualenv).

Uses the synchronous API a Django view would use: ``defer`` for one job per
transaction and ``batch_defer`` (one statement) for bulk.
"""

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for driverlib
sys.path.insert(0, str(Path(__file__).resolve().parent))

from driverlib import Driver, main
from procrastinate_app import app, mixed, noop, record_start

NO_ARGS: dict = {}


def enqueue_many(count: int) -> None:
    noop.batch_defer(*([NO_ARGS] * count))


def enqueue_mixed(items: Sequence[tuple[int, float]]) -> None:
    calls = [{"key": key, "seconds": seconds} for key, seconds in items]
    if len(calls) == 1:
        mixed.defer(**calls[0])
    else:
        mixed.batch_defer(*calls)


def prepare() -> None:
    app.open()


if __name__ == "__main__":
    main(
        Driver(
            prepare=prepare,
            enqueue_one=noop.defer,
            enqueue_many=enqueue_many,
            enqueue_keyed=lambda key: record_start.defer(key=key),
            close=app.close,
            enqueue_mixed=enqueue_mixed,
        )
    )
