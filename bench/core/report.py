"""Medians over the repeats, the comparison table, and the JSON file."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: What a drain cost per task, each a median over the repeats in the summary: the
#: worker processes' CPU, the PostgreSQL server's CPU, the whole machine's CPU, the
#: WAL written and the transactions committed (see core/counters.py).
DRAIN_COSTS = (
    "worker_cpu_us_per_task",
    "server_cpu_us_per_task",
    "machine_cpu_us_per_task",
    "wal_bytes_per_task",
    "transactions_per_task",
)


@dataclass
class SystemResults:
    """Everything measured for one system (or one configuration of it), run by run."""

    key: str
    label: str
    #: Which configuration, for django-rdbtasks' variants: ``batch100 (--batch 100)``.
    variant: str = ""
    #: django-rdbtasks, whose rows are compared with the best peer's.
    reference: bool = False
    #: The SQL floor: a ceiling the others are read against, not a peer.
    ceiling: bool = False
    #: The worker options of a django-rdbtasks variant; None for a peer.
    worker_args: list[str] | None = None
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

    def summary(self, commit_limit: dict[int, float] | None = None) -> dict[str, Any]:
        """Medians of each figure over the repeats."""
        drain = {
            workers: median_of(runs, "tasks_per_second") for workers, runs in self.drain.items()
        }
        limit = commit_limit or {}
        return {
            "drain_tasks_per_second": drain,
            **{
                f"drain_{figure}": {
                    workers: median_of(runs, figure) for workers, runs in self.drain.items()
                }
                for figure in DRAIN_COSTS
            },
            # The drain rate over pgbench's with as many clients as worker processes.
            "drain_share_of_commit_limit": {
                workers: rate / limit[workers]
                for workers, rate in drain.items()
                if rate is not None and limit.get(workers)
            },
            "backlog_tasks_per_second": {
                rows: {
                    workers: median_of(runs, "tasks_per_second")
                    for workers, runs in by_workers.items()
                }
                for rows, by_workers in self.backlog.items()
            },
            "enqueue_single_per_second": median_of(self.enqueue, "single_per_second"),
            "enqueue_transaction_per_second": median_of(self.enqueue, "transaction_per_second"),
            "enqueue_bulk_per_second": median_of(self.enqueue, "bulk_per_second"),
            "latency_p50_ms": median_of(self.latency, "p50_ms"),
            "latency_p99_ms": median_of(self.latency, "p99_ms"),
        }

    def as_dict(self, commit_limit: dict[int, float] | None = None) -> dict[str, Any]:
        return {
            "label": self.label,
            "variant": self.variant,
            "ceiling": self.ceiling,
            "version": self.version,
            "worker_args": self.worker_args,
            "notes": self.notes,
            "bulk_api": self.bulk_api,
            "error": self.error,
            "summary": self.summary(commit_limit),
            "runs": {
                "drain": self.drain,
                "backlog": self.backlog,
                "enqueue": self.enqueue,
                "latency": self.latency,
            },
        }


@dataclass
class CommitLimit:
    """pgbench's single-row UPDATE rate, by number of clients, run by run."""

    tool: str = ""
    command: str = ""
    script: str = ""
    runs: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    error: str | None = None

    def tps(self) -> dict[int, float]:
        medians = {clients: median_of(runs, "tps") for clients, runs in self.runs.items()}
        return {clients: tps for clients, tps in medians.items() if tps is not None}

    def as_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "command": self.command,
            "script": self.script,
            "error": self.error,
            "summary": {"tps": self.tps()},
            "runs": self.runs,
        }


@dataclass
class MixedResults:
    """The mixed load's start delays for one system or django-rdbtasks variant."""

    key: str
    label: str
    worker_args: list[str] | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        return {
            name: median_of(self.runs, name)
            for name in (
                "short_p50_ms",
                "short_p99_ms",
                "short_max_ms",
                "short_over_half_long",
                "long_p50_ms",
            )
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "worker_args": self.worker_args,
            "error": self.error,
            "summary": self.summary(),
            "runs": self.runs,
        }


def median_of(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [run[key] for run in runs if run.get(key) is not None]
    return statistics.median(values) if values else None


def write_json(
    path: Path,
    meta: dict[str, Any],
    results: Sequence[SystemResults],
    commit_limit: CommitLimit | None = None,
    mixed: Sequence[MixedResults] = (),
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    limit = commit_limit.tps() if commit_limit else None
    document = {
        "meta": meta,
        "commit_limit": commit_limit.as_dict() if commit_limit else None,
        "systems": {result.key: result.as_dict(limit) for result in results},
        "mixed": {result.key: result.as_dict() for result in mixed},
    }
    path.write_text(json.dumps(document, indent=2) + "\n")


# -- the table --------------------------------------------------------------------------

Row = tuple[str, list[float | None]]


def fmt_number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"x{value:.2f}"


def ratio_row(
    reference: list[float | None], peers: list[list[float | None]], higher_is_better: bool
) -> list[float | None]:
    """Per column, how many times better ``reference`` is than the best peer (>1: better)."""
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
    references: Sequence[str] = (),
    ceilings: Sequence[str] = (),
    higher_is_better: bool = True,
    digits: int | Sequence[int] = 0,
    extra: Sequence[Sequence[str]] = (),
) -> str:
    """One row per key of ``rows`` (all-empty rows left out), then for each key in
    ``references`` its ratio to the best of the other rows (``ceilings`` left out:
    they are no peers) and its share of each ceiling, then the ``extra`` rows."""
    rows = {key: values for key, values in rows.items() if any(v is not None for v in values)}
    if not rows and not extra:
        return ""  # a measurement left out (--skip): no empty table
    places = [digits] * len(headers) if isinstance(digits, int) else list(digits)
    cells = [
        [labels[key], *(fmt_number(value, d) for value, d in zip(values, places, strict=True))]
        for key, values in rows.items()
    ]
    peers = [
        values for key, values in rows.items() if key not in references and key not in ceilings
    ]
    for key in references:
        if key not in rows:
            continue
        comparisons = [("best peer", peers)] if peers else []
        comparisons += [(ceiling, [rows[ceiling]]) for ceiling in ceilings if ceiling in rows]
        for name, against in comparisons:
            ratios = ratio_row(rows[key], against, higher_is_better)
            if any(ratio is not None for ratio in ratios):
                cells.append([f"{key} vs {name}", *(fmt_ratio(ratio) for ratio in ratios)])
    cells += [list(row) for row in extra]
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


def row_label(result: SystemResults, *, variant: bool = True) -> str:
    version = "" if result.version in ("checkout", "not installed") else result.version
    return " ".join(part for part in (result.label, version, variant and result.variant) if part)


def plural(count: int, word: str, words: str | None = None) -> str:
    return f"{count} {word if count == 1 else words or word + 's'}"


def render(
    results: Sequence[SystemResults],
    config: dict[str, Any],
    commit_limit: CommitLimit | None = None,
    mixed: Sequence[MixedResults] = (),
) -> str:
    """The report printed at the end of a run."""
    labels = {result.key: row_label(result) for result in results}
    limit = commit_limit.tps() if commit_limit else {}
    # A system that failed part-way still shows what it measured before that.
    summaries = {result.key: result.summary(limit) for result in results}
    references = [result.key for result in results if result.reference]
    ceilings = [result.key for result in results if result.ceiling]
    parts: list[str] = []
    workers: list[int] = config["workers"]
    repeat = f"median of {config['repeat']}" if config["repeat"] > 1 else "1 run"

    if config["mode"] == "backlog":
        return _with_errors([render_backlog(results, config, repeat)], results, commit_limit, mixed)

    worker_headers = [plural(n, "worker") for n in workers]
    extra: list[list[str]] = []
    if limit:
        extra.append(
            [
                "commit limit: pgbench 1-row UPDATE, as many clients",
                *(fmt_number(limit.get(n)) for n in workers),
            ]
        )
    parts.append(
        render_table(
            f"Drain: {drain_size(config)} no-op tasks queued, then N worker processes"
            f" (tasks/s, {repeat})",
            worker_headers,
            {
                key: [s["drain_tasks_per_second"].get(n) for n in workers]
                for key, s in summaries.items()
            },
            labels,
            references=references,
            ceilings=ceilings,
            extra=extra,
        )
    )
    parts.append(render_drain_costs(results, summaries, workers, repeat))
    costs = render_variant_costs(results, summaries, workers, repeat)
    if costs:
        parts.append(costs)
    if limit:
        parts.append(
            render_table(
                "Drain rate as a share of the commit limit with as many pgbench clients as"
                f" worker processes (%, {repeat}; pgbench {config['pgbench_seconds']:g} s each)",
                worker_headers,
                {
                    key: [
                        None
                        if (share := s["drain_share_of_commit_limit"].get(n)) is None
                        else share * 100
                        for n in workers
                    ]
                    for key, s in summaries.items()
                },
                labels,
                digits=1,
            )
        )
    # Enqueue does not depend on the worker's options: one row for django-rdbtasks.
    enqueue_labels = {result.key: row_label(result, variant=False) for result in results}
    parts.append(
        render_table(
            f"Enqueue (tasks/s, {repeat}): {config['single']:,} one per transaction;"
            f" {config['bulk']:,} by one-task calls, {config['chunk']:,} per transaction;"
            f" {config['bulk']:,} in bulk calls of {config['chunk']:,}",
            ["one per transaction", f"{config['chunk']:,} per transaction", "bulk"],
            {
                key: [
                    s["enqueue_single_per_second"],
                    s["enqueue_transaction_per_second"],
                    s["enqueue_bulk_per_second"],
                ]
                for key, s in summaries.items()
            },
            enqueue_labels,
            references=references,
        )
    )
    parts.append(
        render_table(
            f"Idle enqueue-to-start latency, {config['latency_count']} tasks"
            f" {config['latency_pause'] * 1000:g} ms apart, one idle worker (ms, {repeat})",
            ["p50", "p99"],
            {key: [s["latency_p50_ms"], s["latency_p99_ms"]] for key, s in summaries.items()},
            labels,
            references=references,
            higher_is_better=False,
            digits=1,
        )
    )
    if mixed:
        parts.append(render_mixed(mixed, config, repeat))
    return _with_errors(parts, results, commit_limit, mixed)


def drain_size(config: dict[str, Any]) -> str:
    """How many tasks each drain had: ``--tasks``, and ``--slow-tasks`` for the slow peers."""
    tasks, slow = config["tasks"], config.get("slow_tasks", config["tasks"])
    slow_systems = config.get("slow_systems") or []
    if slow == tasks or not slow_systems:
        return f"{tasks:,}"
    return f"{tasks:,} ({', '.join(slow_systems)}: {slow:,})"


def render_drain_costs(
    results: Sequence[SystemResults],
    summaries: dict[str, dict[str, Any]],
    workers: list[int],
    repeat: str,
) -> str:
    """One row per system and worker count: the rate, and what each task cost."""
    labels: dict[str, str] = {}
    rows: dict[str, list[float | None]] = {}
    for result in results:
        summary = summaries[result.key]
        for n in workers:
            key = f"{result.key} {n}"
            labels[key] = f"{row_label(result)}, {plural(n, 'worker')}"
            rows[key] = [
                summary["drain_tasks_per_second"].get(n),
                *(summary[f"drain_{figure}"].get(n) for figure in DRAIN_COSTS),
            ]
    return render_table(
        f"Drain cost per task ({repeat}): workers' CPU (their processes, start-up included),"
        " the PostgreSQL server's CPU, the machine's CPU (all CPUs: the workers', the"
        " server's and anything else running), WAL written, transactions committed",
        [
            "tasks/s",
            "workers' CPU us",
            "server CPU us",
            "machine CPU us",
            "WAL bytes",
            "transactions",
        ],
        rows,
        labels,
        digits=[0, 0, 0, 0, 0, 3],
    )


def render_variant_costs(
    results: Sequence[SystemResults],
    summaries: dict[str, dict[str, Any]],
    workers: list[int],
    repeat: str,
) -> str:
    """Each django-rdbtasks variant against the ``default`` variant, in %: drain rate, CPU.

    What an option costs (``metrics=--metrics-port 0``, say), measured in the
    same run as ``default``. The CPU the workers used per task moves less than
    the rate when other processes compete for the machine.
    """
    base_key = "rdbtasks:default"
    if base_key not in summaries:
        return ""
    others = [r for r in results if r.reference and r.key != base_key and r.key in summaries]
    if not others:
        return ""
    labels: dict[str, str] = {}
    rows: dict[str, list[float | None]] = {}
    for figure, name in (
        ("drain_tasks_per_second", "rate"),
        ("drain_worker_cpu_us_per_task", "CPU per task"),
    ):
        base = summaries[base_key].get(figure, {})
        for result in others:
            values = summaries[result.key].get(figure, {})
            key = f"{result.key} {name}"
            labels[key] = f"{result.variant}: {name}"
            rows[key] = [
                None
                if not base.get(n) or values.get(n) is None
                else (values[n] / base[n] - 1) * 100
                for n in workers
            ]
    return render_table(
        f"Each variant against 'default' (% difference, {repeat}): drain rate (negative:"
        " slower) and worker CPU per task, start-up included (positive: more)",
        [plural(n, "worker") for n in workers],
        rows,
        labels,
        digits=1,
    )


def render_mixed(mixed: Sequence[MixedResults], config: dict[str, Any], repeat: str) -> str:
    burst = config["mixed_burst"]
    calls = "one task per enqueue call" if burst == 1 else f"bulk calls of {burst}"
    title = (
        f"Mixed load: {config['mixed_tasks']:,} tasks, {calls} every"
        f" {config['mixed_interval']:g} s ({config['mixed_rate']:.3g}/s), every"
        f" {config['long_every']}th sleeping {config['long_seconds']:g} s,"
        f" {plural(config['mixed_workers'], 'idle worker process', 'idle worker processes')};"
        f" start minus enqueue (ms, {repeat})"
    )
    summaries = {result.key: result.summary() for result in mixed}
    half_long = config["long_seconds"] / 2
    return render_table(
        title,
        ["short p50", "short p99", "short max", f"short >{half_long:g} s", "long p50"],
        {
            key: [
                s["short_p50_ms"],
                s["short_p99_ms"],
                s["short_max_ms"],
                s["short_over_half_long"],
                s["long_p50_ms"],
            ]
            for key, s in summaries.items()
        },
        {result.key: result.label for result in mixed},
        digits=[1, 1, 1, 0, 1],
    )


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
            f"{row_label(result)}: drain of {config['tasks']:,} no-op tasks with finished rows"
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


def _with_errors(
    parts: list[str],
    results: Sequence[SystemResults],
    commit_limit: CommitLimit | None = None,
    mixed: Sequence[MixedResults] = (),
) -> str:
    notes = [f"  {row_label(result)}: {note}" for result in results for note in result.notes]
    if commit_limit is not None and commit_limit.tool:
        script = " ".join(line for line in commit_limit.script.splitlines() if line)
        notes.append(f"  commit limit: {commit_limit.tool}: {commit_limit.command}, {script}")
    if notes:
        parts.append("How each system ran:\n" + "\n".join(notes) + "\n")
    failures: list[tuple[str, str | None]] = [
        (row_label(result), result.error) for result in results
    ]
    if commit_limit is not None:
        failures.append(("commit limit (pgbench)", commit_limit.error))
    failures += [(f"mixed load, {result.label}", result.error) for result in mixed]
    errors = [f"  {label}: {error_line(error)}" for label, error in failures if error]
    if errors:
        parts.append(
            "Failed (measured no further; traceback in the JSON):\n" + "\n".join(errors) + "\n"
        )
    return "\n".join(part for part in parts if part)
