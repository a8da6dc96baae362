"""Enqueue driver for PgQueuer (runs in its own virtualenv).

PgQueuer's producer API is asyncio: ``Queries.enqueue`` on one asyncpg
connection, on a uvloop event loop as its workers use. One task per transaction
is ``enqueue(entrypoint, payload)`` in autocommit (asyncpg's default); bulk is
``enqueue`` with lists, one statement per call; "in one transaction" is the
one-task call repeated inside the connection's ``transaction()``. The timed
loops run inside the event loop (``enqueue_each``), so that entering the loop
once per task is not counted as PgQueuer's cost.
"""

import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for driverlib
sys.path.insert(0, str(Path(__file__).resolve().parent))

import asyncpg
import uvloop
from driverlib import Driver, main
from pgqueuer import AsyncpgDriver, Queries
from pgqueuer_app import mixed_payload

loop = uvloop.new_event_loop()
#: The connection and its Queries, once ``prepare`` has opened them.
state: dict[str, Any] = {}


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return loop.run_until_complete(coroutine)


def queries() -> Queries:
    return state["queries"]


async def connect() -> None:
    state["connection"] = connection = await asyncpg.connect()
    state["queries"] = Queries(AsyncpgDriver(connection))


async def each(count: int) -> None:
    q = queries()
    for _ in range(count):
        await q.enqueue("noop", None)


async def in_transaction(count: int) -> None:
    q = queries()
    async with state["connection"].transaction():
        for _ in range(count):
            await q.enqueue("noop", None)


def enqueue_many(count: int) -> None:
    run(queries().enqueue(["noop"] * count, [None] * count, [0] * count))


def enqueue_mixed(items: Sequence[tuple[int, float]]) -> None:
    payloads = [mixed_payload(key, seconds) for key, seconds in items]
    if len(payloads) == 1:
        run(queries().enqueue("mixed", payloads[0]))
    else:
        run(queries().enqueue(["mixed"] * len(payloads), payloads, [0] * len(payloads)))


def close() -> None:
    if "connection" in state:
        run(state["connection"].close())
    loop.close()


if __name__ == "__main__":
    main(
        Driver(
            prepare=lambda: run(connect()),
            enqueue_one=lambda: run(queries().enqueue("noop", None)),
            enqueue_many=enqueue_many,
            enqueue_keyed=lambda key: run(queries().enqueue("record_start", str(key).encode())),
            close=close,
            enqueue_mixed=enqueue_mixed,
            enqueue_in_transaction=lambda count: run(in_transaction(count)),
            enqueue_each=lambda count: run(each(count)),
        )
    )
