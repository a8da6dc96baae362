"""Medians over the repeats, the comparison table, and the JSON file."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REFERENCE = "rdbtasks"  # the system every ratio is about


@dataclass
class SystemResults:
    """Everything measured for one system, run by run."""

    key: str
    label: str
    version: str = ""
    notes: list[str] = field(default_factory=list)
    bulk_api: str = ""
    drain: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # by worker count
    backlog: dict[int, dict[int, list[dict[str, Any]]]] = field(
        default_factory=dict
    )  # rows, workers
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    latency: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        """Medians of each figure over the repeats."""
        return {
            "drain_tasks_per_second": {
                workers: median_of(runs, "tasks_per_second") for workers, runs in self.drain.items()
            },
            "backlog_tasks_per_second": {
                rows: {
                    workers: median_of(runs, "tasks_per_second")
                    for workers, runs in by_workers.items()
                }
                for rows, by_workers in self.backlog.items()
            },
            "enqueue_single_per_second": median_of(self.enqueue, "single_per_second"),
            "enqueue_bulk_per_second": median_of(self.enqueue, "bulk_per_second"),
            "latency_p50_ms": median_of(self.latency, "p50_ms"),
            "latency_p99_ms": median_of(self.latency, "p99_ms"),
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "version": self.version,
            "notes": self.notes,
            "bulk_api": self.bulk_api,
            "error": self.error,
            "summary": self.summary(),
            "runs": {
                "drain": self.drain,
                "backlog": self.backlog,
                "enqueue": self.enqueue,
                "latency": self.latency,
            },
        }


def median_of(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [run[key] for run in runs if run.get(key) is not None]
    return statistics.median(values) if values else None


def write_json(path: Path, meta: dict[str, Any], results: Sequence[SystemResults]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"meta": meta, "systems": {result.key: result.as_dict() for result in results}}
    path.write_text(json.dumps(document, indent=2) + "\n")


# -- the table --------------------------------------------------------------------------

Row = tuple[str, list[float | None]]


def fmt_number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"x{value:.2f}"


def ratio_row(rows: dict[str, list[float | None]], higher_is_better: bool) -> list[float | None]:
    """Per column, how many times better the reference is than the best peer (>1: better)."""
    reference = rows.get(REFERENCE)
    peers = [values for key, values in rows.items() if key != REFERENCE]
    if reference is None or not peers:
        return []
    ratios: list[float | None] = []
    for column, value in enumerate(reference):
        peer_values = [values[column] for values in peers if values[column]]
        if not value or not peer_values:
            ratios.append(None)
        elif higher_is_better:
            ratios.append(value / max(peer_values))
        else:
            ratios.append(min(peer_values) / value)
    return ratios


def render_table(
    title: str,
    headers: Sequence[str],
    rows: dict[str, list[float | None]],
    labels: dict[str, str],
    *,
    higher_is_better: bool,
    digits: int = 0,
) -> str:
    cells = [
        [labels[key], *(fmt_number(value, digits) for value in values)]
        for key, values in rows.items()
    ]
    ratios = ratio_row(rows, higher_is_better)
    if any(ratio is not None for ratio in ratios):
        cells.append([f"{labels[REFERENCE]} vs best peer", *(fmt_ratio(ratio) for ratio in ratios)])
    header = ["", *headers]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        first, *rest = row
        return "  ".join(
            [
                first.ljust(widths[0]),
                *(cell.rjust(w) for cell, w in zip(rest, widths[1:], strict=True)),
            ]
        )

    rule = "-" * len(line(header))
    return "\n".join([title, rule, line(header), rule, *(line(row) for row in cells), ""])


def render(results: Sequence[SystemResults], config: dict[str, Any]) -> str:
    """The report printed at the end of a run."""
    labels = {result.key: f"{result.label} {result.version}".strip() for result in results}
    # A system that failed part-way still shows what it measured before that.
    summaries = {result.key: result.summary() for result in results}
    parts: list[str] = []
    workers: list[int] = config["workers"]
    repeat = f"median of {config['repeat']}" if config["repeat"] > 1 else "1 run"

    if config["mode"] == "backlog":
        return _with_errors([render_backlog(results, config, repeat)], results)

    sections: list[
        tuple[str, list[str], Callable[[dict[str, Any]], list[float | None]], bool, int]
    ] = [
        (
            f"Drain: {config['tasks']:,} no-op tasks queued, then N worker processes"
            f" (tasks/s, {repeat})",
            [f"{n} worker{'s' if n > 1 else ''}" for n in workers],
            lambda s: [s["drain_tasks_per_second"].get(n) for n in workers],
            True,
            0,
        ),
        (
            f"Enqueue (tasks/s, {repeat}): {config['single']:,} one per transaction;"
            f" {config['bulk']:,} in bulk calls of {config['chunk']:,}",
            ["one per transaction", "bulk"],
            lambda s: [s["enqueue_single_per_second"], s["enqueue_bulk_per_second"]],
            True,
            0,
        ),
        (
            f"Idle enqueue-to-start latency, {config['latency_count']} tasks"
            f" {config['latency_pause'] * 1000:g} ms apart, one idle worker (ms, {repeat})",
            ["p50", "p99"],
            lambda s: [s["latency_p50_ms"], s["latency_p99_ms"]],
            False,
            1,
        ),
    ]
    for title, headers, pick, higher, digits in sections:
        rows = {key: pick(summary) for key, summary in summaries.items()}
        parts.append(
            render_table(title, headers, rows, labels, higher_is_better=higher, digits=digits)
        )
    return _with_errors(parts, results)


def render_backlog(results: Sequence[SystemResults], config: dict[str, Any], repeat: str) -> str:
    """One row per worker count, one column per backlog size, and the last against the first."""
    sizes: list[int] = config["backlog_rows"]
    lines: list[str] = []
    for result in results:
        measured = result.summary()["backlog_tasks_per_second"]
        headers = [f"{rows:,} rows" for rows in sizes] + [f"{sizes[-1]:,} / {sizes[0]:,}"]
        cells = [headers]
        for workers in config["workers"]:
            rates = [measured.get(rows, {}).get(workers) for rows in sizes]
            first, last = rates[0], rates[-1]
            ratio = last / first if first and last else None
            cells.append([*(fmt_number(rate) for rate in rates), fmt_ratio(ratio)])
        labels = ["", *(f"{n} worker{'s' if n > 1 else ''}" for n in config["workers"])]
        widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
        label_width = max(len(label) for label in labels)
        table = [
            label.ljust(label_width)
            + "  "
            + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))
            for label, row in zip(labels, cells, strict=True)
        ]
        rule = "-" * len(table[0])
        lines += [
            f"{result.label}: drain of {config['tasks']:,} no-op tasks with finished rows"
            f" already in the table (tasks/s, {repeat})",
            rule,
            table[0],
            rule,
            *table[1:],
            "",
        ]
    return "\n".join(lines)


def error_line(error: str) -> str:
    """The exception line of a traceback: the last line that reads ``SomeError: ...``."""
    lines = error.strip().splitlines()
    for line in reversed(lines):
        # An optional dotted module, then a CamelCase class name: not PostgreSQL's "DETAIL: ".
        if re.match(r"([a-z_]\w*\.)*[A-Z]\w*[a-z]\w*: ", line):
            return line
    return lines[-1] if lines else error


def _with_errors(parts: list[str], results: Sequence[SystemResults]) -> str:
    notes = [f"  {result.label}: {note}" for result in results for note in result.notes]
    if notes:
        parts.append("How each system ran:\n" + "\n".join(notes) + "\n")
    errors = [f"  {result.label}: {error_line(result.error)}" for result in results if result.error]
    if errors:
        parts.append(
            "Failed (measured no further; traceback in the JSON):\n" + "\n".join(errors) + "\n"
        )
    return "\n".join(parts)
