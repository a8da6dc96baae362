"""bench/core/report.py and the harness's helpers: the tables, without a database.

The SQL floor is a ceiling the others are read against, not a peer: django-rdbtasks'
"vs best peer" row must leave it out, and a "vs floor" row gives its share of it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

from core.pg import table_name  # noqa: E402
from core.report import SystemResults, render  # noqa: E402

CONFIG = {
    "mode": "compare",
    "workers": [1, 2],
    "repeat": 1,
    "tasks": 5000,
    "slow_tasks": 5000,
    "slow_systems": [],
    "single": 200,
    "bulk": 2000,
    "chunk": 1000,
    "latency_count": 20,
    "latency_pause": 0.02,
    "pgbench_seconds": 10,
}


def drained(key: str, label: str, rates: dict[int, float], **flags: bool) -> SystemResults:
    result = SystemResults(key, label, version="1.0", **flags)
    for workers, rate in rates.items():
        result.drain[workers] = [
            {
                "tasks_per_second": rate,
                "worker_cpu_us_per_task": 10.0,
                "server_cpu_us_per_task": 5.0,
                "machine_cpu_us_per_task": 20.0,
                "wal_bytes_per_task": 600.0,
                "transactions_per_task": 0.02,
            }
        ]
    return result


def drain_table(report: str) -> list[str]:
    return report.split("\n\n")[0].splitlines()


def test_the_floor_is_no_peer_but_a_ceiling_row():
    results = [
        drained("floor", "SQL floor", {1: 40_000, 2: 50_000}, ceiling=True),
        drained("rdbtasks:default", "django-rdbtasks", {1: 10_000, 2: 20_000}, reference=True),
        drained("graphile", "graphile-worker", {1: 20_000, 2: 25_000}),
    ]
    lines = drain_table(render(results, CONFIG))
    best_peer = next(line for line in lines if "vs best peer" in line)
    against_floor = next(line for line in lines if "vs floor" in line)
    # Against graphile-worker (the floor, faster, is left out): 0.50 and 0.80.
    assert best_peer.split()[-2:] == ["x0.50", "x0.80"]
    assert against_floor.split()[-2:] == ["x0.25", "x0.40"]


def test_without_a_floor_there_is_no_floor_row():
    results = [
        drained("rdbtasks:default", "django-rdbtasks", {1: 10_000, 2: 20_000}, reference=True),
        drained("pgboss", "pg-boss", {1: 20_000, 2: 10_000}),
    ]
    lines = drain_table(render(results, CONFIG))
    assert not any("vs floor" in line for line in lines)
    best_peer = next(line for line in lines if "vs best peer" in line)
    assert best_peer.split()[-2:] == ["x0.50", "x2.00"]


def test_the_drain_costs_have_a_row_per_system_and_worker_count():
    results = [
        drained("floor", "SQL floor", {1: 40_000, 2: 50_000}, ceiling=True),
        drained("graphile", "graphile-worker", {1: 20_000, 2: 25_000}),
    ]
    report = render(results, CONFIG)
    costs = report.split("\n\n")[1]
    assert "SQL floor 1.0, 1 worker" in costs and "graphile-worker 1.0, 2 workers" in costs


@pytest.mark.parametrize(
    ("name", "quoted"),
    [
        ("django_rdbtasks_task", '"django_rdbtasks_task"'),
        ("graphile_worker._private_jobs", '"graphile_worker"."_private_jobs"'),
        ("pgboss.job", '"pgboss"."job"'),
    ],
)
def test_a_table_in_a_schema_of_its_own_is_quoted_part_by_part(name, quoted):
    assert table_name(name).as_string(None) == quoted
