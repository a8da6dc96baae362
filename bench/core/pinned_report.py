"""``bench/sustained.py --pinned``: the phases, issue 43's checks, and the tables in Markdown.

A run has three phases: *clean*, *pinned* (the harness holds a snapshot and
an xid, bench/core/pin.py) and *recovery*. Issue 43 asks that, at a load the
workers keep up with, while the pin lasts

- *pickup p99*: the pickup latency's p99 (``started_at - enqueued_at``) stays
  within ``LIMIT`` times the clean phase's, and does not grow with the pin's
  length: the worst pinned interval's p99 over the median of the clean
  intervals' p99s;
- *enqueue p95*: likewise the ``bulk_enqueue`` call's p95;
- *back to clean size*: after the pin, the task table (heap and indexes, the
  finished rows' table apart) returns to its clean size: the last recovery
  interval's at most ``1 + SIZE_TOLERANCE`` times the largest clean one's.

It also reports, without judging them, the dead row versions each task leaves
in the task table (its updates and deletes over the tasks finished) and how
the pinned phase's figures grew from its first interval to its last.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Sequence
from typing import Any

#: How many times the clean phase's latency the pinned phase's may be (issue 43).
LIMIT = 2.0
#: How much bigger than its largest clean size the task table may end.
SIZE_TOLERANCE = 0.10


class Phase(enum.StrEnum):
    CLEAN = "clean"
    PINNED = "pinned"
    RECOVERY = "recovery"


def phase_of(from_s: float, clean_s: float, pinned_s: float) -> Phase:
    """The phase an interval starting ``from_s`` seconds into the load belongs to."""
    # Half a second of slack: an interval's start is a float sum of intervals.
    if from_s < clean_s - 0.5:
        return Phase.CLEAN
    if from_s < clean_s + pinned_s - 0.5:
        return Phase.PINNED
    return Phase.RECOVERY


def hot_mb(row: dict[str, Any]) -> float:
    """The task table's heap and indexes (the table the claim reads), MB."""
    return float(row["hot_table"]["heap_mb"] + row["hot_table"]["indexes_mb"])


def _values(rows: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [row[key] for row in rows if row.get(key) is not None]


def _median(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    values = _values(rows, key)
    return statistics.median(values) if values else None


def _ratio(after: float | None, before: float | None) -> float | None:
    return after / before if after is not None and before else None


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per phase: medians of the per-interval figures, the worst, the size."""
    summary: dict[str, dict[str, Any]] = {}
    for phase in Phase:
        part = [row for row in rows if row.get("phase") == phase.value]
        if not part:
            continue
        finished = sum(row["finished"] for row in part)
        writes = sum((row["hot_dead_versions_per_task"] or 0) * row["finished"] for row in part)
        summary[phase.value] = {
            "intervals": len(part),
            "seconds": sum(row["seconds"] for row in part),
            "enqueued_per_second": statistics.fmean(_values(part, "enqueued_per_second") or [0]),
            "finished_per_second": statistics.fmean(_values(part, "finished_per_second")),
            "delay_p50_median_s": _median(part, "delay_p50_s"),
            "delay_p99_median_s": _median(part, "delay_p99_s"),
            "delay_p99_max_s": max(_values(part, "delay_p99_s"), default=None),
            "delay_p99_last_s": part[-1]["delay_p99_s"],
            "enqueue_call_p95_median_s": _median(part, "enqueue_call_p95_s"),
            "enqueue_call_p95_max_s": max(_values(part, "enqueue_call_p95_s"), default=None),
            "hot_dead_tuples_max": max(row["hot_table"]["dead_tuples"] for row in part),
            "hot_mb_max": max(hot_mb(row) for row in part),
            "hot_mb_last": hot_mb(part[-1]),
            "finished_table_mb_last": part[-1]["finished_table"]["heap_mb"]
            + part[-1]["finished_table"]["indexes_mb"],
            "hot_dead_versions_per_task": writes / finished if finished else None,
            # The machine is shared more often than not: the latency moves with it.
            "load_average_mean": statistics.fmean(_values(part, "load_average") or [0]),
        }
    return summary


def judge_pinned(rows: Sequence[dict[str, Any]], *, rate: float) -> dict[str, Any]:
    summary = summarize(rows)
    clean, pinned = summary.get(Phase.CLEAN.value), summary.get(Phase.PINNED.value)
    recovery = summary.get(Phase.RECOVERY.value)
    checks: list[dict[str, Any]] = []
    if clean is None or pinned is None or recovery is None:
        checks.append(_check("phases", "a clean, a pinned and a recovery phase", passed=False))
    else:
        checks.append(
            within_limit(
                "pickup p99",
                "worst pinned interval's pickup p99 over the clean intervals' median",
                pinned["delay_p99_max_s"],
                clean["delay_p99_median_s"],
            )
        )
        checks.append(
            within_limit(
                "enqueue p95",
                "worst pinned interval's bulk_enqueue call p95 over the clean intervals' median",
                pinned["enqueue_call_p95_max_s"],
                clean["enqueue_call_p95_median_s"],
            )
        )
        ratio = _ratio(recovery["hot_mb_last"], clean["hot_mb_max"])
        checks.append(
            _check(
                "back to clean size",
                f"task table (heap + indexes) at the end over its largest clean size: "
                f"{_fmt(ratio, '{:.2f}')} ({recovery['hot_mb_last']:.1f} MB / "
                f"{clean['hot_mb_max']:.1f} MB; at most {1 + SIZE_TOLERANCE:.2f})",
                ratio=ratio,
                passed=ratio is not None and ratio <= 1 + SIZE_TOLERANCE,
            )
        )
        offered = _ratio(clean["finished_per_second"], rate)
        checks.append(
            _check(
                "keeps up when clean",
                f"finished/s in the clean phase {clean['finished_per_second']:,.0f} of "
                f"{rate:,.0f}/s offered ({_fmt(offered, '{:.0%}')}; at least 95 %: otherwise "
                "the rate is too high for the machine and the run says nothing)",
                share=offered,
                passed=offered is not None and offered >= 0.95,
            )
        )
    growth = (
        {
            "delay_p99": _ratio(pinned["delay_p99_last_s"], _first(rows, "delay_p99_s")),
            "hot_mb": _ratio(pinned["hot_mb_last"], _first_hot_mb(rows)),
        }
        if pinned is not None
        else {}
    )
    return {
        "passed": bool(checks) and all(check["passed"] for check in checks),
        "phases": summary,
        "pinned_last_over_first": growth,
        "checks": checks,
        "failures": [check["description"] for check in checks if not check["passed"]],
    }


def _first(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    part = [row for row in rows if row.get("phase") == Phase.PINNED.value]
    return part[0][key] if part else None


def _first_hot_mb(rows: Sequence[dict[str, Any]]) -> float | None:
    part = [row for row in rows if row.get("phase") == Phase.PINNED.value]
    return hot_mb(part[0]) if part else None


def within_limit(name: str, what: str, worst: float | None, clean: float | None) -> dict[str, Any]:
    ratio = _ratio(worst, clean)
    return _check(
        name,
        f"{what}: {_fmt(ratio, '{:.2f}')} ({_fmt_ms(worst)} / {_fmt_ms(clean)}; at most {LIMIT:g})",
        pinned_max_s=worst,
        clean_median_s=clean,
        ratio=ratio,
        passed=ratio is not None and ratio <= LIMIT,
    )


def _check(name: str, description: str, *, passed: bool, **figures: Any) -> dict[str, Any]:
    return {"name": name, "description": description, "passed": passed, **figures}


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _fmt_ms(seconds: float | None) -> str:
    return _fmt(None if seconds is None else seconds * 1000, "{:.1f} ms")


def ms(seconds: float | None) -> str:
    return _fmt(None if seconds is None else seconds * 1000, "{:.1f}")


# -- the tables ---------------------------------------------------------------------------


def render_pinned(rows: Sequence[dict[str, Any]]) -> str:
    """One line per interval: latency, the enqueue call, the task table's dead rows and size."""
    lines = [
        "| from (s) | phase | enqueued/s | finished/s | pickup p50 / p99 (ms) "
        "| enqueue call p95 (ms) | task table dead tuples | task table heap / indexes (MB) "
        "| dead versions/task | finished table heap / indexes (MB) | oldest xmin age "
        "| autovacuums | load |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        hot, done = row["hot_table"], row["finished_table"]
        phase = row["phase"] + (" (held)" if row.get("pin_held") else "")
        lines.append(
            f"| {row['from_s']:.0f} | {phase} | {_fmt(row['enqueued_per_second'], '{:,.0f}')} "
            f"| {row['finished_per_second']:,.0f} "
            f"| {ms(row['delay_p50_s'])} / {ms(row['delay_p99_s'])} "
            f"| {ms(row['enqueue_call_p95_s'])} | {hot['dead_tuples']:,} "
            f"| {hot['heap_mb']:.1f} / {hot['indexes_mb']:.1f} "
            f"| {_fmt(row['hot_dead_versions_per_task'], '{:.2f}')} "
            f"| {done['heap_mb']:.1f} / {done['indexes_mb']:.1f} "
            f"| {_fmt(row['oldest_xmin_age'], '{:,}')} | {row['autovacuum_count']} "
            f"| {_fmt(row.get('load_average'), '{:.1f}')} |"
        )
    return "\n".join(lines)


def render_phases(rows: Sequence[dict[str, Any]]) -> str:
    """One line per phase: medians of the intervals' figures, the worst, the size."""
    lines = [
        "| phase | s | finished/s | pickup p50 median (ms) | pickup p99 median / max (ms) "
        "| enqueue call p95 median / max (ms) | task table dead tuples max "
        "| task table MB max / end | dead versions/task | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for phase, part in summarize(rows).items():
        lines.append(
            f"| {phase} | {part['seconds']:.0f} | {part['finished_per_second']:,.0f} "
            f"| {ms(part['delay_p50_median_s'])} "
            f"| {ms(part['delay_p99_median_s'])} / {ms(part['delay_p99_max_s'])} "
            f"| {ms(part['enqueue_call_p95_median_s'])} / {ms(part['enqueue_call_p95_max_s'])} "
            f"| {part['hot_dead_tuples_max']:,} "
            f"| {part['hot_mb_max']:.1f} / {part['hot_mb_last']:.1f} "
            f"| {_fmt(part['hot_dead_versions_per_task'], '{:.2f}')} "
            f"| {part['load_average_mean']:.1f} |"
        )
    return "\n".join(lines)


def render_pinned_verdict(verdict: dict[str, Any]) -> str:
    growth = verdict["pinned_last_over_first"]
    lines = [
        f"Issue 43's checks: {'PASSED' if verdict['passed'] else 'FAILED'}",
        "",
    ]
    for check in verdict["checks"]:
        lines.append(
            f"- {'ok' if check['passed'] else 'FAILED'}: {check['name']}: {check['description']}"
        )
    if growth:
        lines.append(
            f"- pinned phase, last interval over first: pickup p99 "
            f"x{_fmt(growth['delay_p99'], '{:.2f}')}, task table size "
            f"x{_fmt(growth['hot_mb'], '{:.2f}')}"
        )
    return "\n".join(lines)
