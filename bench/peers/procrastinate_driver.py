"""Enqueue driver for Procrastinate (runs in its own virtualenv).

Uses the synchronous API a Django view would use: ``defer`` for one job per
transaction and ``batch_defer`` (one statement) for bulk. Many ``defer`` calls in
one transaction go through an external connection, the way Procrastinate documents
for deferring inside the application's transaction
(https://procrastinate.readthedocs.io/en/stable/howto/production/external_connection.html).
"""

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for driverlib
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from driverlib import Driver, main
from procrastinate_app import app, conninfo, mixed, noop, record_start

NO_ARGS: dict = {}
#: The application's own connection, for the jobs deferred inside its transaction.
external: list[psycopg.Connection] = []


def enqueue_many(count: int) -> None:
    noop.batch_defer(*([NO_ARGS] * count))


def enqueue_mixed(items: Sequence[tuple[int, float]]) -> None:
    calls = [{"key": key, "seconds": seconds} for key, seconds in items]
    if len(calls) == 1:
        mixed.defer(**calls[0])
    else:
        mixed.batch_defer(*calls)


def enqueue_in_transaction(count: int) -> None:
    conn = external[0]
    with conn.transaction():
        deferrer = noop.configure(connection=conn)
        for _ in range(count):
            deferrer.defer()


def prepare() -> None:
    app.open()
    external.append(psycopg.connect(conninfo()))


def close() -> None:
    for conn in external:
        conn.close()
    app.close()


if __name__ == "__main__":
    main(
        Driver(
            prepare=prepare,
            enqueue_one=noop.defer,
            enqueue_many=enqueue_many,
            enqueue_keyed=lambda key: record_start.defer(key=key),
            close=close,
            enqueue_mixed=enqueue_mixed,
            enqueue_in_transaction=enqueue_in_transaction,
        )
    )
