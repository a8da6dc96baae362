"""bench/core/pinned_report.py: issue 43's phases, checks and tables, without a database."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

from core.pinned_report import (  # noqa: E402
    Phase,
    judge_pinned,
    phase_of,
    render_phases,
    render_pinned,
)


def interval(from_s: float, phase: Phase, p99_ms: float, call_ms: float, hot_mb: float) -> dict:
    return {
        "from_s": from_s,
        "seconds": 10.0,
        "phase": phase.value,
        "pin_held": phase is Phase.PINNED,
        "enqueued_per_second": 300.0,
        "finished_per_second": 300.0,
        "finished": 3000,
        "delay_p50_s": 0.005,
        "delay_p99_s": p99_ms / 1000,
        "enqueue_call_p95_s": call_ms / 1000,
        "hot_table": {
            "heap_mb": hot_mb / 2,
            "indexes_mb": hot_mb / 2,
            "dead_tuples": int(hot_mb * 1000),
        },
        "finished_table": {"heap_mb": 1.0, "indexes_mb": 0.5},
        "hot_dead_versions_per_task": 2.0,
        "oldest_xmin_age": 10,
        "autovacuum_count": 1,
        "load_average": 2.0,
    }


def test_an_interval_belongs_to_the_phase_it_starts_in():
    assert [phase_of(s, 30, 40) for s in (0, 20, 30, 60, 69.99999, 70, 90)] == [
        Phase.CLEAN,
        Phase.CLEAN,
        Phase.PINNED,
        Phase.PINNED,
        Phase.RECOVERY,
        Phase.RECOVERY,
        Phase.RECOVERY,
    ]


def test_latency_that_grows_under_the_pin_and_a_table_that_stays_big_fail():
    rows = [
        # The clean median is 20 ms (the start-up's 700 ms is one interval of three).
        interval(0, Phase.CLEAN, 700, 30, 1.0),
        interval(10, Phase.CLEAN, 20, 10, 1.0),
        interval(20, Phase.CLEAN, 20, 10, 2.0),
        interval(30, Phase.PINNED, 30, 15, 4.0),
        interval(40, Phase.PINNED, 60, 25, 8.0),
        interval(50, Phase.RECOVERY, 20, 10, 8.0),
    ]
    verdict = judge_pinned(rows, rate=300)
    checks = {check["name"]: check for check in verdict["checks"]}
    assert checks["pickup p99"]["ratio"] == 3.0 and not checks["pickup p99"]["passed"]
    assert checks["enqueue p95"]["ratio"] == 2.5 and not checks["enqueue p95"]["passed"]
    assert checks["back to clean size"]["ratio"] == 4.0
    assert not checks["back to clean size"]["passed"]
    assert checks["keeps up when clean"]["passed"]
    assert not verdict["passed"]
    assert verdict["pinned_last_over_first"] == {"delay_p99": 2.0, "hot_mb": 2.0}
    assert verdict["phases"]["pinned"]["hot_dead_versions_per_task"] == 2.0


def test_a_pin_that_changes_nothing_passes():
    rows = [interval(10 * k, phase, 20, 10, 1.0) for k, phase in enumerate(Phase)]
    verdict = judge_pinned(rows, rate=300)
    assert verdict["passed"], verdict["failures"]


def test_the_tables_have_a_line_per_interval_and_per_phase():
    rows = [interval(10 * k, phase, 20, 10, 1.0) for k, phase in enumerate(Phase)]
    per_interval = render_pinned(rows).splitlines()
    assert len(per_interval) == 2 + 3
    assert per_interval[3].startswith("| 10 | pinned (held) | 300 | 300 | 5.0 / 20.0 | 10.0 |")
    per_phase = render_phases(rows).splitlines()
    assert [line.split(" | ")[0] for line in per_phase[2:]] == [
        "| clean",
        "| pinned",
        "| recovery",
    ]
