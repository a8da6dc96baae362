"""The throwaway Chancy app: its connection, its queue and the benchmark's jobs.

The queue is Chancy's ``AsyncExecutor`` (jobs are coroutines on the worker's
event loop) with its default concurrency (``concurrency=None``: the executor's
100 jobs at once per worker), ``eager_polling`` (fetch again as soon as a job
finishes rather than after ``polling_interval``) and LISTEN/NOTIFY (``Chancy``'s
default ``notifications=True``: a push wakes idle workers). It is named
``default`` because a starting worker declares a ``default`` queue with the
process-pool executor unless one exists. Chancy's default plugins (leadership,
pruner, recovery, metrics, workflows) stay on, as a user gets them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from chancy import Chancy, Queue, job


def conninfo() -> str:
    """libpq parameters from the ``BENCH_DB_*`` variables that ``run.py`` sets."""
    parts = {
        "dbname": os.environ.get("BENCH_DB_NAME", "bench_chancy"),
        "host": os.environ.get("BENCH_DB_HOST", "127.0.0.1"),
        "port": os.environ.get("BENCH_DB_PORT", "5432"),
        "user": os.environ.get("BENCH_DB_USER", "postgres"),
        "password": os.environ.get("BENCH_DB_PASSWORD", ""),
    }
    return " ".join(f"{key}='{value}'" for key, value in parts.items() if value)


def quiet_logger() -> logging.Logger:
    """Warnings only, as every system runs: Chancy logs each job it pulls at INFO."""
    logger = logging.getLogger("chancy")
    logger.setLevel(logging.WARNING)
    if not logger.handlers:
        logger.addHandler(logging.StreamHandler())
    return logger


chancy = Chancy(conninfo(), log=quiet_logger())
QUEUE = Queue("default", executor=Chancy.Executor.Async, eager_polling=True)


@job(queue=QUEUE.name)
async def noop() -> None:
    """The drain benchmark's job: the queue's own cost is all there is."""


@job(queue=QUEUE.name)
async def record_start(*, key: int) -> None:
    """Latency probe: write when it started, for the harness to compare."""
    started = time.time()
    async with chancy.pool.connection() as conn:
        await conn.execute(
            "INSERT INTO bench_started (key, started_at) VALUES (%s, %s)", (key, started)
        )


@job(queue=QUEUE.name)
async def mixed(*, key: int, seconds: float) -> None:
    """Mixed load: record the start, then sleep 0 or 2 s (asyncio: not holding the worker)."""
    await record_start(key=key)
    if seconds:
        await asyncio.sleep(seconds)
