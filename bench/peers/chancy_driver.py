"""Enqueue driver for Chancy (runs in its own virtualenv).

Chancy's API is asyncio first: one job per transaction is ``chancy.push``, bulk
is ``chancy.push_many`` (one INSERT per job, ``batch_size`` of them per
transaction: here the whole call), and "in one transaction" is ``push_ex`` with
the cursor of a connection inside its ``transaction()``, the low-level call its
documentation gives for pushing jobs atomically with other writes. The timed
loops run inside the event loop (``enqueue_each``).
"""

import asyncio
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/, for driverlib
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chancy_app import chancy, mixed, noop, record_start
from driverlib import Driver, main
from psycopg.rows import dict_row

loop = asyncio.new_event_loop()


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    return loop.run_until_complete(coroutine)


async def prepare() -> None:
    await chancy.__aenter__()  # opens its pool, as ``async with chancy`` would
    async with chancy.pool.connection():
        pass  # connected now, not in the first timed call


async def each(count: int) -> None:
    for _ in range(count):
        await chancy.push(noop)


async def in_transaction(count: int) -> None:
    async with (
        chancy.pool.connection() as conn,
        conn.cursor(row_factory=dict_row) as cursor,
        conn.transaction(),
    ):
        for _ in range(count):
            await chancy.push_ex(cursor, noop)


async def push_many(jobs: list) -> None:
    async for _ in chancy.push_many(jobs, batch_size=len(jobs)):
        pass


def enqueue_mixed(items: Sequence[tuple[int, float]]) -> None:
    jobs = [mixed.job.with_kwargs(key=key, seconds=seconds) for key, seconds in items]
    if len(jobs) == 1:
        run(chancy.push(jobs[0]))
    else:
        run(push_many(jobs))


def close() -> None:
    run(chancy.__aexit__(None, None, None))
    loop.close()


if __name__ == "__main__":
    main(
        Driver(
            prepare=lambda: run(prepare()),
            enqueue_one=lambda: run(chancy.push(noop)),
            enqueue_many=lambda count: run(push_many([noop.job] * count)),
            enqueue_keyed=lambda key: run(chancy.push(record_start.job.with_kwargs(key=key))),
            close=close,
            enqueue_mixed=enqueue_mixed,
            enqueue_in_transaction=lambda count: run(in_transaction(count)),
            enqueue_each=lambda count: run(each(count)),
        )
    )
