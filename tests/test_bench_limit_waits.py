"""bench/limit_waits.py's pure parts: the runs its bodies record, and the medians of
several runs, without a database or workers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import limit_waits  # noqa: E402


def test_medians_take_each_figure_and_decile_apart_with_its_range():
    runs = [
        {"tasks": 2500, "unlimited_rate": 300.0, "unlimited_start_deciles_s": [0.0, 0.2, 1.5]},
        {"tasks": 2500, "unlimited_rate": 450.0, "unlimited_start_deciles_s": [0.0, 0.4, 0.9]},
        {"tasks": 2500, "unlimited_rate": 350.0, "unlimited_start_deciles_s": [0.0, 0.1, 1.1]},
    ]
    summary = limit_waits.medians(runs)
    assert summary["runs"] == 3
    assert summary["unlimited_rate"] == 350.0
    assert summary["unlimited_rate_range"] == [300.0, 450.0]
    assert summary["unlimited_start_deciles_s"] == [0.0, 0.2, 1.1]
    assert summary["tasks"] == 2500


def test_runs_written_to_files_are_read_back_from_every_process(tmp_path, monkeypatch):
    """As the benchmark's bodies write them (benchapp.tasks._record_run): a line a run
    in each process's own file."""
    monkeypatch.setattr(limit_waits, "LOGS", tmp_path)
    args = argparse.Namespace(record="file")
    runs = limit_waits.Runs(args, "mixed")
    directory = Path(runs.env()["BENCH_RUNS_DIR"])
    (directory / "101.txt").write_text("group:1 7 10.5 10.54\nfree 3 10.6 10.61\n")
    (directory / "102.txt").write_text("free 4 10.7 10.71\n")
    assert runs.count() == 3
    assert sorted(runs.read()) == [
        ("free", 3, 10.6, 10.61),
        ("free", 4, 10.7, 10.71),
        ("group:1", 7, 10.5, 10.54),
    ]
    # A drain of the same name starts from an empty directory.
    assert limit_waits.Runs(args, "mixed").count() == 0


def test_a_warm_up_drain_needs_workers_started_first(capsys):
    assert limit_waits.parse_args(["--started-first", "--warm-up"]).warm_up
    assert not limit_waits.parse_args(["--started-first"]).warm_up
    with pytest.raises(SystemExit):
        limit_waits.parse_args(["--warm-up"])
    assert "--warm-up drains twice" in capsys.readouterr().err


def test_supervisors_side_by_side_as_the_issue_ran_them():
    issue = limit_waits.parse_args(["--supervisors", "4x2, 2x3,2x2:skip-locked"])
    assert limit_waits.supervisors(issue) == [
        limit_waits.Supervisor(4, 2, "optimistic"),
        limit_waits.Supervisor(2, 3, "optimistic"),
        limit_waits.Supervisor(2, 2, "skip-locked"),
    ]
    assert sum(shape.lanes for shape in limit_waits.supervisors(issue)) == 18
    one = limit_waits.parse_args(["--processes", "3", "--threads", "5", "--mode", "skip-locked"])
    assert limit_waits.supervisors(one) == [limit_waits.Supervisor(3, 5, "skip-locked")]
    assert str(limit_waits.supervisors(one)[0]) == "--processes 3 --threads 5 --mode skip-locked"


def test_claims_are_summed_over_every_supervisors_log(tmp_path):
    logs = []
    for i, line in enumerate(
        [
            "worker a stopped after 120 tasks (120 claimed in 100 claim statements), "
            "90 by a slot's hand-over",
            "worker b stopped after 30 tasks (30 claimed in 40 claim statements)",
        ]
    ):
        logs.append(tmp_path / f"mixed-{i}.log")
        logs[-1].write_text(line + "\n")
    assert limit_waits.claims(logs) == (150, 140, 90)
