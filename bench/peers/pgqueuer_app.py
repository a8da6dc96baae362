"""The throwaway PgQueuer app: the worker factory and the benchmark's entrypoints.

Workers run it from this directory as ``pgq run pgqueuer_app:create_worker
--batch-size N [--mode drain]``: ``pgq run`` runs on uvloop when it is installed
(it is, a dependency of PgQueuer on Linux), and ``--mode drain`` exits once no job
is queued, like django-rdbtasks' ``--burst``. Each worker process has one asyncpg
connection of its own (``AsyncpgDriver``), what PgQueuer's performance guide
recommends for a ``QueueManager``
(https://janbjorge.github.io/pgqueuer/guides/performance-tuning/). The connection
comes from the libpq variables (``PGHOST``, ``PGDATABASE``, ...) that the harness
sets, which ``pgq install`` reads too.

A ``QueueManager`` rather than a ``PgQueuer``: the latter adds a scheduler for
cron entrypoints, which polls its own table on the same connection and which the
benchmark does not use.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

INSERT_STARTED = "INSERT INTO bench_started (key, started_at) VALUES ($1, $2)"


def mixed_payload(key: int, seconds: float) -> bytes:
    return f"{key} {seconds!r}".encode()


@asynccontextmanager
async def create_worker() -> AsyncIterator[QueueManager]:
    connection = await asyncpg.connect()
    try:
        driver = AsyncpgDriver(connection)
        manager = QueueManager(Queries(driver))

        @manager.entrypoint("noop")
        async def noop(job: Job) -> None:
            """The drain benchmark's task: the queue's own cost is all there is."""

        async def record(key: int) -> None:
            started = time.time()
            # The driver serialises its connection's use with a lock: the worker's
            # own queries and the tasks' can share it.
            await driver.execute(INSERT_STARTED, key, started)

        @manager.entrypoint("record_start")
        async def record_start(job: Job) -> None:
            """Latency probe: write when it started, for the harness to compare."""
            assert job.payload is not None
            await record(int(job.payload))

        @manager.entrypoint("mixed")
        async def mixed(job: Job) -> None:
            """Mixed load: record the start, then sleep 0 or 2 s (asyncio: not holding it)."""
            assert job.payload is not None
            key, seconds = job.payload.split()
            await record(int(key))
            if float(seconds):
                await asyncio.sleep(float(seconds))

        yield manager
    finally:
        await connection.close()
