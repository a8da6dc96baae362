"""The benchmark's tasks, declared for django-rdbtasks."""

import os
import time

from django.db import connection
from django_tasks import task

from django_rdbtasks.limits import ConcurrencyLimit


@task()
def noop() -> None:
    """The drain benchmark's task: the queue's own cost is all there is."""


@task()
def record_start(key: int) -> None:
    """Latency probe: write when it started, for the harness to compare."""
    started = time.time()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO bench_started (key, started_at) VALUES (%s, %s)", [key, started]
        )


@task()
def mixed(key: int, seconds: float) -> None:
    """Mixed load: record the start like ``record_start``, then sleep ``seconds`` (0 or 2)."""
    record_start.func(key)
    if seconds:
        time.sleep(seconds)


def _record_run(kind: str, n: int, started: float) -> None:
    """bench/limit_waits.py: one row a run, its start and end by the body's own clock.

    Into ``BENCH_RUNS_DIR``, a line in the process's own file, where it is set
    (``--record file``): the issue's tasks only sleep, and an INSERT and its
    commit would add to the server the scenario measures and to the time each
    body holds its lane and slot after its end was taken. Otherwise into
    ``bench_runs``."""
    runs_dir = os.environ.get("BENCH_RUNS_DIR")
    if runs_dir:
        with open(os.path.join(runs_dir, f"{os.getpid()}.txt"), "a") as runs:
            runs.write(f"{kind} {n} {started!r} {time.time()!r}\n")
        return
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO bench_runs (kind, n, started, finished) VALUES (%s, %s, %s, %s)",
            [kind, n, started, time.time()],
        )


@task(limit=ConcurrencyLimit(3, key="acc-conc:{group}"))
def limited_sleep(group: int, n: int, seconds: float) -> None:
    """bench/limit_waits.py: at most 3 running per group; sleeps, then records its run."""
    started = time.time()
    time.sleep(seconds)
    _record_run(f"group:{group}", n, started)


@task()
def unlimited_sleep(n: int, seconds: float) -> None:
    """bench/limit_waits.py: no limit; sleeps, then records its run."""
    started = time.time()
    time.sleep(seconds)
    _record_run("free", n, started)


@task(limit=ConcurrencyLimit(3, key="k{key}"))
def limited3(key: int) -> None:
    """bench/limits.py: a no-op, at most 3 running per key."""


@task(limit=ConcurrencyLimit(50, key="k{key}"))
def limited50(key: int) -> None:
    """bench/limits.py: a no-op, at most 50 running per key (a limit rarely reached)."""
