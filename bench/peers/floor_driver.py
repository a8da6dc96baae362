"""Fills the SQL floor's table for its drains (runs on the project's virtualenv).

Only the bulk form is measured (the floor is a drain's ceiling, not an enqueue
API): one ``INSERT ... SELECT generate_series`` per chunk, each its own
transaction. The one-row forms exist so that the driver speaks the whole
command line; the floor has no latency probe (nothing runs a task).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for driverlib
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg
from driverlib import Driver, main
from floor_worker import connect

INSERT_ONE = "INSERT INTO bench_floor_task (task) VALUES ('noop')"
INSERT_MANY = "INSERT INTO bench_floor_task (task) SELECT 'noop' FROM generate_series(1, %s)"

connections: list[psycopg.Connection] = []


def conn() -> psycopg.Connection:
    return connections[0]


def prepare() -> None:
    connections.append(connect())


def enqueue_one() -> None:
    conn().execute(INSERT_ONE, prepare=True)
    conn().commit()


def enqueue_many(count: int) -> None:
    conn().execute(INSERT_MANY, (count,), prepare=True)
    conn().commit()


def enqueue_in_transaction(count: int) -> None:
    for _ in range(count):
        conn().execute(INSERT_ONE, prepare=True)
    conn().commit()


def enqueue_keyed(key: int) -> None:
    raise SystemExit("the SQL floor runs no task: it has no latency probe")


if __name__ == "__main__":
    main(
        Driver(
            prepare=prepare,
            enqueue_one=enqueue_one,
            enqueue_many=enqueue_many,
            enqueue_keyed=enqueue_keyed,
            close=lambda: conn().close(),
            enqueue_in_transaction=enqueue_in_transaction,
        )
    )
