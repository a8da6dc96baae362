"""Where a django-rdbtasks drain's CPU and WAL go, per task: the worker's and the server's.

Two drains of the same ``--tasks`` no-op tasks with ``runworkers --processes W
--burst`` (the benchmark's project, its settings as they are), on a server of your
own (``--pg-port``: its WAL and CPU are the whole cluster's):

1. **measured**: nothing attached. The workers' CPU (``getrusage`` of the reaped
   processes), the server's CPU and WAL (``core.server_cost.ServerMeter``: every
   process of the cluster, less the harness's backends), and on the server side
   - every statement's calls, rows, execution time, blocks and WAL
     (``pg_stat_statements``, when the server preloads it),
   - the WAL by relation (table, index, none) and record type, read back with
     ``pg_walinspect`` (``pg_get_wal_records_info`` over the drain's LSN range;
     each record counted for the relation of its first block reference),
   - rows inserted, updated (HOT or not) and deleted per table
     (``pg_stat_user_tables``);
2. **profiled**: the same drain under ``py-spy record --subprocesses --nonblocking``
   (the supervisor and every worker process it forks, every thread that is not
   idle), whose samples are sorted into the categories of ``CATEGORIES``: the
   share of the worker's CPU each takes, applied to the measured drain's CPU per
   task. py-spy is not a dependency of the project: install it anywhere
   (``python3 -m venv /tmp/pyspy && /tmp/pyspy/bin/pip install py-spy``) and pass
   ``--py-spy``.

The server needs ``pg_stat_statements`` in ``shared_preload_libraries`` for the
statements' table (a restart of that server: use a cluster of your own, never a
shared one); without it the rest is still measured. ``pg_walinspect`` ships with
PostgreSQL 15 and is created in the profile's database.

    .venv/bin/python bench/profile_drain.py --pg-port 5463 --py-spy /tmp/pyspy/bin/py-spy \\
        --tasks 50000 --workers 2

It prints Markdown tables (for docs/benchmarks.md) and writes the figures to
``bench/results/profile-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import psycopg  # noqa: E402
from core.measure import enqueue_bulk, reset  # noqa: E402
from core.pg import PgServer, scalar, settle  # noqa: E402
from core.procs import WorkerGroup  # noqa: E402
from core.server_cost import ServerMeter  # noqa: E402
from systems.base import Context  # noqa: E402
from systems.rdbtasks import RDBTasks  # noqa: E402

DATABASE = "bench_profile"

#: The worker's CPU by what it was doing. A sample (one stack of a thread that was
#: not idle) counts for the first category, in this order, any frame of its stack
#: matches: a record written inside a signal's receiver counts as logging, a JSON
#: encoding inside the round as JSON. Each rule is a regular expression matched
#: against "function (file)" of every frame, the file as py-spy shows it: relative
#: to the ``sys.path`` entry it was imported from (``logging/__init__.py``).
STARTUP = "start-up and exit: imports, django.setup(), checks, the supervisor's forks"
#: A stack with none of these frames is outside the workers' loop and threads:
#: the command's start-up (argument parsing, settings) or the supervisor's watch.
IN_THE_WORKER = re.compile(r"\(django_rdbtasks/worker/(?!supervisor)|\(threading\.py\)")
CATEGORIES: tuple[tuple[str, str], ...] = (
    (
        STARTUP,
        r"^_find_and_load |^setup \(django/__init__\.py\)|\(django/core/checks/|"
        r"^BaseCommand\.check |\(django/apps/",
    ),
    ("logging: records created, formatted and written", r"\(logging/"),
    ("signals: dispatch to the receivers (django.dispatch)", r"\(django/dispatch/"),
    ("JSON: encoding and decoding", r"\(json/|\(psycopg/types/json\.py\)"),
    (
        "the task itself: its lookup and call",
        r"\(django_rdbtasks/loading\.py\)|\(benchapp/tasks\.py\)|"
        r"^Task\.call \(django(?:_tasks|/tasks)/base\.py\)",
    ),
    (
        "framework result objects: TaskResult and its copies",
        r"\(django/tasks/base\.py\)|\(django_tasks/base\.py\)|"
        r"\(django_rdbtasks/results\.py\)|\(dataclasses\.py\)|\(django_rdbtasks/compat\.py\)",
    ),
    (
        "database client: psycopg sending the round, waiting, reading its rows",
        r"\(psycopg/|\(psycopg_c/|\(psycopg_binary/|\(django/db/",
    ),
    (
        "engine: rows and outcomes (decode a claimed row, encode an outcome)",
        r"\(django_rdbtasks/db/",
    ),
    (
        "engine: running a task (context, execution, tracing)",
        r"\(django_rdbtasks/worker/execution\.py\)|\(django_rdbtasks/context\.py\)|"
        r"\(django_rdbtasks/idempotency\.py\)|\(django_rdbtasks/observability/",
    ),
    (
        "engine: reporting (counters, the signal's caller)",
        r"\(django_rdbtasks/worker/reporting\.py\)",
    ),
    (
        "engine: the loop, lanes, rounds, lease keeper",
        r"\(django_rdbtasks/worker/|\(django_rdbtasks/backend\.py\)",
    ),
    ("threads: waits and hand-offs (threading, queue)", r"\(threading\.py\)|\(queue\.py\)"),
)
OTHER = "other"

#: The WAL records of the drain, by relation file (the first block reference of
#: each record: `rel spc/db/relfilenode`), resource manager and record type.
WAL_BY_RELATION = r"""
SELECT (regexp_match(block_ref, 'rel \d+/(\d+)/(\d+)'))[1]::oid AS db,
       (regexp_match(block_ref, 'rel \d+/(\d+)/(\d+)'))[2]::oid AS filenode,
       resource_manager,
       record_type,
       count(*) AS records,
       sum(record_length) AS bytes,
       sum(fpi_length) AS fpi_bytes
FROM pg_get_wal_records_info(%(start)s::pg_lsn, %(end)s::pg_lsn)
GROUP BY 1, 2, 3, 4
"""

STATEMENTS = """
SELECT query, calls, rows, total_exec_time, shared_blks_hit, shared_blks_read,
       shared_blks_dirtied, wal_records, wal_fpi, wal_bytes
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time DESC
"""

#: A round whose outcomes update their rows in place (no finished table to move them to).
OUTCOME_UPDATE = re.compile(r"\bd0 AS \(UPDATE ")

TABLE_WRITES = """
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
FROM pg_stat_user_tables
"""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=2, help="runworkers --processes")
    parser.add_argument(
        "--worker-args", default="", help="more runworkers options, e.g. '--batch 100'"
    )
    parser.add_argument(
        "--settings",
        default="settings",
        help="the bench project's settings module (default: %(default)s, a user's logging;"
        " settings_no_root_handler: Django's default logging alone, for comparison)",
    )
    parser.add_argument("--py-spy", default="py-spy", help="the py-spy executable")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples a second")
    parser.add_argument("--rdbtasks-python", default=None)
    parser.add_argument("--pg-host", default=os.environ.get("PGHOST", "127.0.0.1"))
    parser.add_argument("--pg-port", type=int, default=int(os.environ.get("PGPORT", "5432")))
    parser.add_argument("--pg-user", default=os.environ.get("PGUSER", "postgres"))
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--keep-database", action="store_true")
    return parser.parse_args(argv)


class ProfiledRDBTasks(RDBTasks):
    """django-rdbtasks in the profile's own database, with the settings asked for."""

    database = DATABASE

    def env(self) -> dict[str, str]:
        return {**super().env(), "DJANGO_SETTINGS_MODULE": self.context.options["settings"]}


@dataclass
class Drain:
    seconds: float
    worker_cpu_seconds: float
    server_cpu_seconds: float
    wal_bytes: int
    wal_fpi: int
    start_lsn: str
    end_lsn: str


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fill(system: RDBTasks, conn: psycopg.Connection, tasks: int) -> None:
    reset(system, conn)
    enqueue_bulk(system, tasks, 1000)
    settle(conn, system.job_tables)


def drain(
    system: RDBTasks,
    conn: psycopg.Connection,
    meter: ServerMeter,
    command: list[str],
    tasks: int,
    log: Path,
) -> Drain:
    """Run ``command`` until it exits; what it cost the workers and the server."""
    meter.wait_idle()
    before = meter.read()
    cpu = children_cpu()
    start = time.perf_counter()
    with WorkerGroup([command], cwd=system.project_dir, env=system.env(), log=log) as group:
        if not group.wait_exit(60 + tasks / 200):
            raise RuntimeError(f"the drain did not end; see {log}")
    seconds = time.perf_counter() - start
    worker_cpu = children_cpu() - cpu
    meter.wait_idle()
    server_cpu, wal, fpi = meter.since(before)
    end = meter.read()
    left = scalar(conn, system.unfinished_sql)
    if left:
        raise RuntimeError(f"{left} tasks left after the drain; see {log}")
    return Drain(seconds, worker_cpu, server_cpu, wal, fpi, before.wal_lsn, end.wal_lsn)


def wal_by_relation(conn: psycopg.Connection, start: str, end: str) -> list[dict[str, Any]]:
    """The drain's WAL records by relation and type, most bytes first."""
    rows = conn.execute(WAL_BY_RELATION, {"start": start, "end": end}).fetchall()
    own_db = scalar(conn, "SELECT oid FROM pg_database WHERE datname = current_database()")
    names: dict[int, str] = {}
    result = []
    for db, filenode, rmgr, record_type, records, nbytes, fpi_bytes in rows:
        if filenode is None:
            relation = "(no relation: commits, xacts, checkpoints)"
        elif db == 0:
            relation = "(shared catalog)"
        elif db != own_db:
            relation = "(another database)"
        else:
            if filenode not in names:
                row = conn.execute(
                    "SELECT coalesce(pg_filenode_relation(0, %s)::regclass::text, '?')",
                    (filenode,),
                ).fetchone()
                names[filenode] = str(row[0]) if row else "?"
            relation = names[filenode]
        result.append(
            {
                "relation": relation,
                "resource_manager": rmgr,
                "record_type": record_type,
                "records": int(records),
                "bytes": int(nbytes),
                "fpi_bytes": int(fpi_bytes or 0),
            }
        )
    result.sort(key=lambda r: r["bytes"], reverse=True)
    return result


def table_writes(conn: psycopg.Connection) -> dict[str, tuple[int, ...]]:
    conn.execute("SELECT pg_stat_force_next_flush() FROM pg_catalog.pg_am LIMIT 1")
    return {row[0]: tuple(int(v) for v in row[1:]) for row in conn.execute(TABLE_WRITES)}


def difference(after: tuple[int, ...], before: tuple[int, ...] | None) -> list[int]:
    return [a - b for a, b in zip(after, before or (0,) * len(after), strict=True)]


def has_statements(conn: psycopg.Connection) -> bool:
    preload = str(conn.execute("SHOW shared_preload_libraries").fetchone()[0])
    if "pg_stat_statements" not in preload:
        return False
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return True


def statement_label(query: str) -> str:
    """What a statement does: a round's parts by its CTEs, else its first words."""
    parts = []
    if "INSERT INTO django_rdbtasks_finishedtask" in query and "DELETE FROM" in query:
        parts.append("outcomes written, rows moved to the finished table")
    elif OUTCOME_UPDATE.search(query):
        parts.append("outcomes written in place")
    if "claimed AS (UPDATE" in query:
        form = "pooled candidates" if "pool AS MATERIALIZED" in query else "SKIP LOCKED per arm"
        parts.append(f"claim ({form})")
    if parts:
        return "round: " + " + ".join(parts)
    return " ".join(query.split())[:80]


# -- py-spy --------------------------------------------------------------------------

FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def categorize(stack: Sequence[str]) -> str:
    """The first category of ``CATEGORIES`` any frame of ``stack`` matches."""
    frames = [normalize_frame(frame) for frame in stack]
    if frames and not any(IN_THE_WORKER.search(frame) for frame in frames):
        return STARTUP
    for name, pattern in COMPILED:
        if any(pattern.search(frame) for frame in frames):
            return name
    return OTHER


def normalize_frame(frame: str) -> str:
    """``function (file:line)`` as ``function (file)``: rules do not see line numbers."""
    match = FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    return f"{match['function']} ({match['file']})"


COMPILED = [(name, re.compile(pattern)) for name, pattern in CATEGORIES]


@dataclass
class Samples:
    """py-spy's raw (collapsed) stacks, sorted."""

    categories: collections.Counter[str]
    #: Within each category, samples by the deepest frame of the engine's and the leaf.
    details: dict[str, collections.Counter[str]]
    #: Samples with no Python frame at all (a process py-spy could not read).
    unreadable: int


def read_raw_profile(path: Path) -> Samples:
    categories: collections.Counter[str] = collections.Counter()
    details: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    unreadable = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        # The first frames name the process and the thread; the rest are Python's.
        frames = [frame for frame in stack.split(";") if "(" in frame]
        if not frames:
            unreadable += int(count)
            continue
        category = categorize(frames)
        categories[category] += int(count)
        names = [normalize_frame(frame) for frame in frames]
        engine = [name for name in names if "(django_rdbtasks/" in name]
        details[category][f"{engine[-1] if engine else '-'} > {names[-1]}"] += int(count)
    return Samples(categories, details, unreadable)


def profile(
    system: RDBTasks, command: list[str], args: argparse.Namespace, out: Path, log: Path
) -> None:
    spy = [
        args.py_spy,
        "record",
        "--subprocesses",
        "--nonblocking",
        # Only a thread holding the GIL runs Python: its samples are the
        # process's Python CPU. Without it, threads waiting on a condition or
        # for the GIL count as busy (py-spy's idle guess misses them).
        "--gil",
        "--rate",
        str(args.rate),
        "--format",
        "raw",
        "--output",
        str(out),
        "--",
        *command,
    ]
    with log.open("ab") as sink:
        subprocess.run(
            spy,
            cwd=system.project_dir,
            env=system.env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=120 + args.tasks / 100,
            check=True,
        )


# -- report ----------------------------------------------------------------------------


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    server = PgServer(args.pg_host, args.pg_port, args.pg_user, os.environ.get("PGPASSWORD", ""))
    logs = BENCH_DIR / ".logs" / f"profile-{stamp}"
    logs.mkdir(parents=True, exist_ok=True)
    context = Context(
        server=server,
        envs_dir=BENCH_DIR / ".envs",
        logs_dir=logs,
        options={"rdbtasks_python": args.rdbtasks_python, "settings": args.settings},
    )
    system = ProfiledRDBTasks(context, "profile", args.worker_args.split())
    system.prepare_env()
    server.recreate_database(DATABASE)
    system.create_schema()
    command = system.drain_commands(args.workers)[0]
    report: dict[str, Any] = {
        "started_at": stamp,
        "tasks": args.tasks,
        "workers": args.workers,
        "command": command,
        "settings": args.settings,
        "python": str(system.python),
        "server": server.describe(),
        "load_average_before": os.getloadavg(),
    }
    try:
        with server.connect(DATABASE) as conn, server.connect("postgres") as other:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            statements = has_statements(conn)
            meter = ServerMeter([conn, other])

            # 1. measured
            fill(system, conn, args.tasks)
            writes_before = table_writes(conn)
            if statements:
                conn.execute("SELECT pg_stat_statements_reset()")
            measured = drain(system, conn, meter, command, args.tasks, logs / "measured.log")
            writes_after = table_writes(conn)
            report["measured"] = measured.__dict__
            report["statements"] = (
                [
                    dict(
                        zip(
                            (
                                "query",
                                "calls",
                                "rows",
                                "total_exec_ms",
                                "shared_blks_hit",
                                "shared_blks_read",
                                "shared_blks_dirtied",
                                "wal_records",
                                "wal_fpi",
                                "wal_bytes",
                            ),
                            (
                                row[0],
                                *(
                                    float(value) if isinstance(value, float) else int(value)
                                    for value in row[1:]
                                ),
                            ),
                            strict=True,
                        )
                    )
                    for row in conn.execute(STATEMENTS)
                ]
                if statements
                else None
            )
            report["wal"] = wal_by_relation(conn, measured.start_lsn, measured.end_lsn)
            report["table_writes"] = {
                table: difference(after, writes_before.get(table))
                for table, after in writes_after.items()
                if table.startswith("django_rdbtasks")
            }

            # 2. profiled
            fill(system, conn, args.tasks)
            raw = logs / "py-spy.txt"
            profile(system, command, args, raw, logs / "profiled.log")
            samples = read_raw_profile(raw)
            report["profile"] = {
                "rate": args.rate,
                "samples": sum(samples.categories.values()),
                "unreadable_samples": samples.unreadable,
                "categories": dict(samples.categories.most_common()),
                "details": {
                    category: dict(counter.most_common(12))
                    for category, counter in samples.details.items()
                },
            }
    finally:
        if not args.keep_database:
            server.drop_database(DATABASE)
    report["load_average_after"] = os.getloadavg()
    output = args.output or BENCH_DIR / "results" / f"profile-{stamp}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(render(report))
    print(f"\nfigures in {output}; logs and py-spy's stacks in {logs}")
    return 0


def render(report: dict[str, Any]) -> str:
    tasks = report["tasks"]
    measured = report["measured"]
    worker_us = measured["worker_cpu_seconds"] / tasks * 1e6
    parts = [
        f"Drain of {tasks:,} no-op tasks, `{' '.join(report['command'][1:])}`"
        f" (settings `{report['settings']}`, {report['python']}):"
        f" {tasks / measured['seconds']:,.0f} tasks/s (start-up included); per task:"
        f" workers' CPU {worker_us:.0f} µs, server's CPU"
        f" {measured['server_cpu_seconds'] / tasks * 1e6:.0f} µs, WAL"
        f" {measured['wal_bytes'] / tasks:,.0f} B ({measured['wal_fpi']:,} full-page images)."
    ]
    profile = report["profile"]
    categories = profile["categories"]
    samples = sum(categories.values()) or 1
    running = samples - categories.get(STARTUP, 0) or 1
    parts.append(
        f"\nWorker CPU by category (py-spy, {samples:,} samples of threads holding the GIL"
        f" at {profile['rate']} a second, {samples / profile['rate']:.1f} s against the"
        f" measured drain's {measured['worker_cpu_seconds']:.1f} s of CPU;"
        f" {profile['unreadable_samples']:,} samples with no Python frame left out). Each"
        " share of the samples is applied to the measured CPU per task; the last column"
        " is its share once started:\n"
    )
    parts.append(
        markdown_table(
            ["what", "share", "µs per task", "share once started"],
            [
                (
                    name,
                    f"{count / samples:.1%}",
                    f"{count / samples * worker_us:.1f}",
                    "" if name == STARTUP else f"{count / running:.1%}",
                )
                for name, count in categories.items()
            ],
        )
    )
    statements = report.get("statements")
    if statements:
        total_ms = sum(s["total_exec_ms"] for s in statements) or 1
        parts.append("\nServer: statements (pg_stat_statements), per task:\n")
        parts.append(
            markdown_table(
                ["statement", "calls", "exec time share", "exec µs", "WAL B", "blocks dirtied"],
                [
                    (
                        statement_label(s["query"]),
                        f"{s['calls']:,}",
                        f"{s['total_exec_ms'] / total_ms:.1%}",
                        f"{s['total_exec_ms'] * 1000 / tasks:.1f}",
                        f"{s['wal_bytes'] / tasks:.0f}",
                        f"{s['shared_blks_dirtied'] / tasks:.3f}",
                    )
                    for s in statements[:12]
                ],
            )
        )
    by_relation: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for row in report["wal"]:
        totals = by_relation[row["relation"]]
        totals[0] += row["records"]
        totals[1] += row["bytes"]
        totals[2] += row["fpi_bytes"]
    wal_total = sum(t[1] for t in by_relation.values()) or 1
    parts.append("\nServer: WAL by relation (pg_walinspect), per task:\n")
    parts.append(
        markdown_table(
            ["relation", "records", "bytes", "of which full-page images", "share"],
            [
                (
                    relation,
                    f"{records / tasks:.2f}",
                    f"{nbytes / tasks:.0f}",
                    f"{fpi / tasks:.0f}",
                    f"{nbytes / wal_total:.1%}",
                )
                for relation, (records, nbytes, fpi) in sorted(
                    by_relation.items(), key=lambda item: -item[1][1]
                )
            ],
        )
    )
    parts.append("\nServer: WAL records by relation and type, per task (the largest):\n")
    parts.append(
        markdown_table(
            ["relation", "record", "records", "bytes"],
            [
                (
                    row["relation"],
                    f"{row['resource_manager']}/{row['record_type']}",
                    f"{row['records'] / tasks:.2f}",
                    f"{row['bytes'] / tasks:.0f}",
                )
                for row in report["wal"][:16]
            ],
        )
    )
    parts.append("\nRows written per task (pg_stat_user_tables):\n")
    parts.append(
        markdown_table(
            ["table", "inserted", "updated", "of which HOT", "deleted"],
            [
                (table, *(f"{value / tasks:.2f}" for value in values))
                for table, values in report["table_writes"].items()
            ],
        )
    )
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
