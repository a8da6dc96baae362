"""bench/sustained.py, the harness itself: a few seconds at a low rate on the test server.

Not a benchmark (the CI server has autovacuum off, and seconds say nothing
about an hour): it checks that a run measures a peak, produces a row per
interval with every column, judges them, prints the tables and writes the
JSON; and that a run whose workers drain nothing fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "bench" / "sustained.py"

pytestmark = pytest.mark.slow

ROW_KEYS = {
    "from_s",
    "seconds",
    "enqueued_per_second",
    "finished_per_second",
    "depth_max",
    "depth_end",
    "running_max",
    "delay_p50_s",
    "delay_p99_s",
    "pruned_per_second",
    "hot_share",
    "vacuuming_share",
    "heap_mb",
    "indexes_mb",
    "total_mb",
    "index_mb",
    "live_tuples",
    "dead_tuples",
    "autovacuum_count",
    "autoanalyze_count",
    "last_autovacuum",
    "last_autoanalyze",
    "worker_cpu_us_per_task",
    "server_cpu_us_per_task",
    "wal_bytes_per_task",
    "load_average",
}
CHECKS = ["throughput", "start delay p50", "size levels off", "keeps up", "backlog"]


@pytest.fixture
def harness(tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("the sustained benchmark runs on PostgreSQL")
    server = connection.settings_dict
    database = f"{os.environ.get('RDBTASKS_TEST_DB', 'test_rdbtasks')}_bench"

    def run(*args: str) -> tuple[subprocess.CompletedProcess, dict]:
        output = tmp_path / "sustained.json"
        env = {**os.environ, "PGPASSWORD": server.get("PASSWORD") or ""}
        env.pop("DJANGO_SETTINGS_MODULE", None)  # the bench project's own settings
        done = subprocess.run(
            [
                sys.executable,
                str(HARNESS),
                "--pg-host",
                server["HOST"] or "127.0.0.1",
                "--pg-port",
                str(server["PORT"] or 5432),
                "--pg-user",
                server["USER"],
                "--database",
                database,
                "--python",
                sys.executable,
                "--allow-autovacuum-off",
                "--output",
                str(output),
                "--minutes",
                "0.1",  # 6 rows of 1 s, the first not judged: thirds of 1, 3 and 1
                "--interval",
                "1",
                "--probe",
                "0.2",
                "--warmup",
                "1",
                *args,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert output.exists(), done.stdout + done.stderr
        return done, json.loads(output.read_text())

    yield run
    with psycopg.connect(
        host=server["HOST"] or "127.0.0.1",
        port=server["PORT"] or 5432,
        user=server["USER"],
        password=server.get("PASSWORD") or None,
        dbname="postgres",
        autocommit=True,
    ) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )


def test_a_short_run_measures_its_peak_and_reports_every_interval(harness):
    done, result = harness("--share", "0.05", "--peak-tasks", "300", "--processes", "1")
    output = done.stdout + done.stderr
    peak = result["peak"]
    assert peak["tasks"] == 300 and peak["rate"] > 0, output
    assert result["rate"] == max(1, round(0.05 * peak["rate"]))
    rows = result["intervals"]
    assert [round(row["from_s"]) for row in rows] == [0, 1, 2, 3, 4, 5]
    for row in rows:
        assert ROW_KEYS <= set(row), sorted(ROW_KEYS - set(row))
        assert any(name.startswith("rdbtasks_task_ready") for name in row["index_mb"])
        assert row["total_mb"] >= row["heap_mb"] + row["indexes_mb"] > 0
    # What was enqueued was finished: the counts of the two sides agree.
    enqueued = sum(row["enqueued_per_second"] * row["seconds"] for row in rows)
    finished = sum(row["finished"] for row in rows)
    assert enqueued > 0 and abs(enqueued - finished) <= result["rate"] * 2, output
    verdict = result["verdict"]
    assert [check["name"] for check in verdict["checks"]][:5] == CHECKS
    assert verdict["judged_intervals"] == 5
    passed = {check["name"]: check["passed"] for check in verdict["checks"]}
    assert passed["keeps up"] and passed["backlog"] and passed["offered load"], output
    assert done.returncode == (0 if verdict["passed"] else 1), output
    # The tables for docs/benchmarks.md and the verdict are printed.
    assert "| from (s) | enqueued/s | finished/s |" in done.stdout
    assert "| from (s) | pkey |" in done.stdout
    assert "Verdict: " in done.stdout


def test_a_run_whose_workers_drain_nothing_fails(harness):
    # --processes 0: runworkers runs its scheduler only; the tasks pile up.
    done, result = harness(
        "--rate", "50", "--processes", "0", "--keep", "none", "--max-backlog", "100"
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    verdict = result["verdict"]
    assert not verdict["passed"]
    failed = {check["name"] for check in verdict["checks"] if not check["passed"]}
    assert {"backlog", "keeps up", "throughput"} <= failed, verdict
    assert result["intervals"][-1]["depth_end"] >= 200  # 6 s of 50 a second, nearly all
    assert "Verdict: FAILED" in done.stdout


def test_a_pinned_run_holds_its_snapshot_in_the_pinned_phase_only(harness):
    # Issue 43's harness: 3 s clean, 3 s with a REPEATABLE READ snapshot and an
    # xid held (and a reader), 3 s of recovery, a row a second.
    done, result = harness(
        "--rate",
        "50",
        "--processes",
        "1",
        "--pinned",
        "0.05",
        "--clean-minutes",
        "0.05",
        "--recovery-minutes",
        "0.05",
        "--pin-readers",
        "1",
        "--pin-read-every",
        "0.5",
    )
    output = done.stdout + done.stderr
    rows = result["intervals"]
    assert [row["phase"] for row in rows] == ["clean"] * 3 + ["pinned"] * 3 + ["recovery"] * 3
    assert [row["pin_held"] for row in rows] == [False] * 3 + [True] * 3 + [False] * 3
    for row in rows:
        assert {"hot_table", "finished_table", "enqueue_call_p95_s"} <= set(row), output
    pin = result["pin"]
    assert pin["xid"] and pin["released_at"] > pin["held_at"], output
    assert pin["reader_scans"] >= 1 and not pin["errors"], output
    # The held xid keeps the server's horizon back while it is held, and only then.
    pinned_ages = [row["oldest_xmin_age"] for row in rows if row["pin_held"]]
    assert min(pinned_ages) >= 1, output
    checks = [check["name"] for check in result["verdict"]["checks"]]
    assert checks == ["pickup p99", "enqueue p95", "back to clean size", "keeps up when clean"]
    assert "| from (s) | phase |" in done.stdout
    assert "Issue 43's checks: " in done.stdout
