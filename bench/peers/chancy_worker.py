"""Chancy's schema and worker, for the harness (runs in Chancy's virtualenv).

    python chancy_worker.py setup          # migrate, declare the benchmark's queue
    python chancy_worker.py work           # one worker, until SIGTERM
    python chancy_worker.py work --drain   # one worker, until no job is left to run

A worker is Chancy's ``Worker`` as its documentation starts one (``async with
Worker(chancy) as worker``). Chancy has no drain mode, so ``--drain`` adds one
like PgQueuer's ``--mode drain`` and django-rdbtasks' ``--burst``: once this
worker's executors are empty and no job of the queue is pending, it calls
``worker.stop()``, which writes its last buffered job updates and returns.
"""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chancy import Worker
from chancy_app import QUEUE, chancy

#: How often a draining worker checks whether it is done (seconds). A check costs
#: one indexed query, and only when its executors are empty.
DRAIN_CHECK = 0.1
PENDING_SQL = (
    "SELECT EXISTS (SELECT 1 FROM chancy_jobs WHERE queue = %s"
    " AND state IN ('pending', 'retrying'))"
)


async def setup() -> None:
    async with chancy:
        await chancy.migrate()
        await chancy.declare(QUEUE, upsert=True)


async def pending() -> bool:
    async with chancy.pool.connection() as conn:
        cursor = await conn.execute(PENDING_SQL, (QUEUE.name,))
        row = await cursor.fetchone()
        return bool(row and row[0])


async def stop_when_drained(worker: Worker) -> None:
    while not worker.shutdown_event.is_set():
        await asyncio.sleep(DRAIN_CHECK)
        if any(len(executor) for executor in worker.executors.values()):
            continue
        if not await pending():
            break
    await worker.stop()


async def work(drain: bool) -> None:
    async with chancy, Worker(chancy) as worker:
        if drain:
            await stop_when_drained(worker)
        else:
            await worker.wait_for_shutdown()


def main(argv: list[str]) -> None:
    if argv[:1] == ["setup"]:
        asyncio.run(setup())
    elif argv[:1] == ["work"] and set(argv[1:]) <= {"--drain"}:
        asyncio.run(work("--drain" in argv))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
