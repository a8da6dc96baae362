"""The throwaway Procrastinate app: its connector and the benchmark's tasks.

Workers load it as ``procrastinate --app=procrastinate_app.app``. The tasks are
``async``, Procrastinate's native kind: a sync task would add a hop through a
thread per job, and the comparison should give each peer its best case.
"""

import asyncio
import os
import time

from procrastinate import App, PsycopgConnector


def conninfo() -> str:
    """libpq parameters from the ``BENCH_DB_*`` variables that ``run.py`` sets."""
    parts = {
        "dbname": os.environ.get("BENCH_DB_NAME", "bench_procrastinate"),
        "host": os.environ.get("BENCH_DB_HOST", "127.0.0.1"),
        "port": os.environ.get("BENCH_DB_PORT", "5432"),
        "user": os.environ.get("BENCH_DB_USER", "postgres"),
        "password": os.environ.get("BENCH_DB_PASSWORD", ""),
    }
    return " ".join(f"{key}='{value}'" for key, value in parts.items() if value)


app = App(connector=PsycopgConnector(conninfo=conninfo()))


@app.task(name="noop")
async def noop() -> None:
    """The drain benchmark's task: the queue's own cost is all there is."""


@app.task(name="record_start")
async def record_start(key: int) -> None:
    """Latency probe: write when it started, for the harness to compare."""
    started = time.time()
    await app.connector.execute_query_async(
        "INSERT INTO bench_started (key, started_at) VALUES (%(key)s, %(started)s)",
        key=key,
        started=started,
    )


@app.task(name="mixed")
async def mixed(key: int, seconds: float) -> None:
    """Mixed load: record the start like ``record_start``, then sleep ``seconds`` (0 or 2).

    ``asyncio.sleep``: a long task in an async worker waits without holding its process,
    which is Procrastinate's design and its best case.
    """
    await record_start(key)
    if seconds:
        await asyncio.sleep(seconds)
