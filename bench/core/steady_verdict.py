"""bench/sustained.py's verdict, and its tables in Markdown for docs/benchmarks.md.

The judged intervals are those after the warm-up (``--warmup``: by default
``--keep`` plus two minutes, until which the table fills up to its steady
size). They are cut into thirds by count: the first ``n // 3``, the last
``n // 3``, and the middle the rest. The verdict passes when every check does:

- *throughput*: the mean finished/s of the last third is at least
  ``1 - tolerance`` times the first third's;
- *start delay*: the median of the per-interval start delay p50s of the last
  third is at most ``1 + tolerance`` times the first third's (or within
  ``delay_slack_s`` of it, 0 by default);
- *size levels off*: the largest table + indexes + TOAST size of the last
  third is at most ``1 + tolerance`` times the largest of the middle third;
- *keeps up*: no judged interval finished fewer than ``floor`` times the
  tasks enqueued in it while more than a second of production waited;
- *backlog*: at most ``max_backlog`` READY rows due at the end;
- *offered load*: the producer enqueued at least 95 % of its rate over the
  judged intervals (if not, the machine could not offer the load, and the
  run says nothing about the queue).
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Sequence
from typing import Any

#: The producer must have offered this share of its rate for the run to count.
OFFERED = 0.95


def thirds(rows: Sequence[dict[str, Any]]) -> tuple[list, list, list]:
    n = len(rows)
    k = n // 3
    return list(rows[:k]), list(rows[k : n - k]), list(rows[n - k :])


def judge(
    rows: Sequence[dict[str, Any]],
    *,
    warmup: float,
    rate: float,
    tolerance: float = 0.10,
    delay_slack_s: float = 0.0,
    floor: float = 0.8,
    max_backlog: int,
) -> dict[str, Any]:
    judged = [row for row in rows if row["from_s"] >= warmup]
    checks: list[dict[str, Any]] = []
    first, middle, last = thirds(judged)
    span = {
        name: [part[0]["from_s"], part[-1]["from_s"] + part[-1]["seconds"]] if part else None
        for name, part in (("first", first), ("middle", middle), ("last", last))
    }
    if len(judged) < 3:
        checks.append(
            _check(
                "enough intervals",
                f"{len(judged)} intervals after the warm-up, at least 3 needed",
                passed=False,
            )
        )
    else:
        checks.append(_throughput(first, last, tolerance))
        checks.append(_delay(first, last, tolerance, delay_slack_s))
        checks.append(_size(middle, last, tolerance))
    checks.append(_keeps_up(judged, floor, rate))
    end = rows[-1]["depth_end"] if rows else None
    checks.append(
        _check(
            "backlog",
            f"READY rows due at the end: {end if end is not None else '-'} "
            f"(at most {max_backlog:,})",
            value=end,
            limit=max_backlog,
            passed=end is not None and end <= max_backlog,
        )
    )
    checks.append(_offered(judged, rate))
    return {
        "passed": all(check["passed"] for check in checks),
        "judged_intervals": len(judged),
        "thirds_s": span,
        "tolerance": tolerance,
        "checks": checks,
        "failures": [check["description"] for check in checks if not check["passed"]],
    }


def _check(name: str, description: str, *, passed: bool, **figures: Any) -> dict[str, Any]:
    return {"name": name, "description": description, "passed": passed, **figures}


def _mean(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if row[key] is not None]
    return statistics.fmean(values) if values else None


def _throughput(first: list, last: list, tolerance: float) -> dict[str, Any]:
    before, after = _mean(first, "finished_per_second"), _mean(last, "finished_per_second")
    ratio = after / before if before and after is not None else None
    return _check(
        "throughput",
        f"finished/s, last third over first: {_fmt_ratio(ratio)} "
        f"({_fmt(after, '{:,.0f}')} / {_fmt(before, '{:,.0f}')}; at least {1 - tolerance:.2f})",
        first=before,
        last=after,
        ratio=ratio,
        passed=ratio is not None and ratio >= 1 - tolerance,
    )


def _delay(first: list, last: list, tolerance: float, slack: float) -> dict[str, Any]:
    def median_p50(rows: list) -> float | None:
        values = [row["delay_p50_s"] for row in rows if row["delay_p50_s"] is not None]
        return statistics.median(values) if values else None

    before, after = median_p50(first), median_p50(last)
    ratio = after / before if before and after is not None else None
    passed = (
        before is not None
        and after is not None
        and (after <= before * (1 + tolerance) or after - before <= slack)
    )
    slack_text = f" or within {slack * 1000:g} ms" if slack else ""
    return _check(
        "start delay p50",
        f"median of the per-interval p50s, last third over first: {_fmt_ratio(ratio)} "
        f"({_fmt_ms(after)} / {_fmt_ms(before)}; at most {1 + tolerance:.2f}{slack_text})",
        first=before,
        last=after,
        ratio=ratio,
        passed=passed,
    )


def _size(middle: list, last: list, tolerance: float) -> dict[str, Any]:
    before = max((row["total_mb"] for row in middle), default=None)
    after = max((row["total_mb"] for row in last), default=None)
    ratio = after / before if before and after is not None else None
    return _check(
        "size levels off",
        f"largest table + indexes, last third over middle third: {_fmt_ratio(ratio)} "
        f"({_fmt(after, '{:,.0f}')} MB / {_fmt(before, '{:,.0f}')} MB; "
        f"at most {1 + tolerance:.2f})",
        middle_max_mb=before,
        last_max_mb=after,
        ratio=ratio,
        passed=ratio is not None and ratio <= 1 + tolerance,
    )


def _keeps_up(judged: list, floor: float, rate: float) -> dict[str, Any]:
    behind = [
        row
        for row in judged
        if row["depth_end"] > rate
        and row["finished_per_second"] < floor * (row["enqueued_per_second"] or rate)
    ]
    description = (
        "every interval finished what was enqueued in it"
        if not behind
        else "fell behind from "
        + ", ".join(f"{row['from_s']:.0f} s ({row['depth_end']:,} waiting)" for row in behind)
    )
    return _check(
        "keeps up",
        f"{description} (at least {floor:.0%} of it while more than a second's worth waited)",
        intervals_behind=[row["from_s"] for row in behind],
        passed=not behind,
    )


def _offered(judged: list, rate: float) -> dict[str, Any]:
    offered = _mean(judged, "enqueued_per_second")
    share = offered / rate if offered is not None and rate else None
    return _check(
        "offered load",
        f"the producer enqueued {_fmt(offered, '{:,.0f}')}/s of {rate:,.0f}/s "
        f"({_fmt(share, '{:.0%}')}; at least {OFFERED:.0%})",
        enqueued_per_second=offered,
        share=share,
        passed=share is not None and share >= OFFERED,
    )


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _fmt_ratio(value: float | None) -> str:
    return _fmt(value, "{:.3f}")


def _fmt_ms(seconds: float | None) -> str:
    return _fmt(None if seconds is None else seconds * 1000, "{:.1f} ms")


# -- the tables ---------------------------------------------------------------------------


def _kb(value: float | None) -> float | None:
    return None if value is None else value / 1024


def _mb(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


def _since(stamp: str | None, started: float) -> str:
    """An ISO time as seconds since the run started, e.g. ``245``; ``-`` for never."""
    if stamp is None:
        return "-"
    offset = dt.datetime.fromisoformat(stamp).timestamp() - started
    return f"{offset:.0f}" if offset >= 0 else "before"


def render_intervals(rows: Sequence[dict[str, Any]], started: float) -> str:
    lines = [
        "| from (s) | enqueued/s | finished/s | pruned/s | queue depth max / end | running max "
        "| start delay p50 / p99 (ms) | heap / indexes / total (MB) | live / dead tuples "
        "| HOT updates | vacuuming | autovacuums (last, s) | autoanalyzes (last, s) "
        "| CPU µs/task workers / db | WAL kB/task | load |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        p50, p99 = row["delay_p50_s"], row["delay_p99_s"]
        delays = "-" if p50 is None else f"{p50 * 1000:.1f} / {p99 * 1000:.1f}"
        lines.append(
            f"| {row['from_s']:.0f} | {_fmt(row['enqueued_per_second'], '{:,.0f}')} "
            f"| {row['finished_per_second']:,.0f} | {row['pruned_per_second']:,.0f} "
            f"| {row['depth_max']:,} / {row['depth_end']:,} | {row['running_max']:,} | {delays} "
            f"| {_mb(row['heap_mb'])} / {_mb(row['indexes_mb'])} / {_mb(row['total_mb'])} "
            f"| {row['live_tuples']:,} / {row['dead_tuples']:,} "
            f"| {_fmt(row['hot_share'], '{:.0%}')} | {row['vacuuming_share']:.0%} "
            f"| {row['autovacuum_count']} ({_since(row['last_autovacuum'], started)}) "
            f"| {row['autoanalyze_count']} ({_since(row['last_autoanalyze'], started)}) "
            f"| {_fmt(row['worker_cpu_us_per_task'], '{:,.0f}')} / "
            f"{_fmt(row['server_cpu_us_per_task'], '{:,.0f}')} "
            f"| {_fmt(_kb(row['wal_bytes_per_task']), '{:.1f}')} | {row['load_average']:.1f} |"
        )
    return "\n".join(lines)


def short_index_name(name: str) -> str:
    for prefix in ("rdbtasks_task_", "django_rdbtasks_task_"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def render_indexes(rows: Sequence[dict[str, Any]]) -> str:
    names = sorted({name for row in rows for name in row["index_mb"]})
    header = " | ".join(short_index_name(name) for name in names)
    lines = [
        f"| from (s) | {header} |",
        "|---:|" + "---:|" * len(names),
    ]
    for row in rows:
        sizes = " | ".join(f"{row['index_mb'].get(name, 0):,.1f}" for name in names)
        lines.append(f"| {row['from_s']:.0f} | {sizes} |")
    return "\n".join(lines)


def render_verdict(verdict: dict[str, Any]) -> str:
    spans = ", ".join(
        f"{name} {span[0]:.0f}-{span[1]:.0f} s"
        for name, span in verdict["thirds_s"].items()
        if span is not None
    )
    lines = [
        f"Verdict: {'PASSED' if verdict['passed'] else 'FAILED'} "
        f"({verdict['judged_intervals']} intervals judged; thirds: {spans or '-'})",
        "",
    ]
    for check in verdict["checks"]:
        lines.append(
            f"- {'ok' if check['passed'] else 'FAILED'}: {check['name']}: {check['description']}"
        )
    return "\n".join(lines)
