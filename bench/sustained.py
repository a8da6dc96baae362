"""Sustained load: producers at a fixed rate while ``runworkers`` drains, for minutes.

A burst drain shows the peak; this shows whether the peak holds while the
table's statistics, its dead rows and autovacuum change under the workers
(issue 23: a drain that kept up stalled for a minute once ANALYZE had seen
few runnable rows). Run from the repository root with the project's virtualenv:

    .venv/bin/python bench/run.py --sustained 10                  # 10 minutes at 5,000/s
    .venv/bin/python bench/sustained.py --minutes 10 --rate 5000 --processes 2

One producer process enqueues ``--rate`` no-op tasks per second with
``bulk_enqueue`` (a call every 0.1 s, on an absolute schedule), ``runworkers
--processes N`` (no other flags) drains, autovacuum keeps the server's
defaults. Every ``--interval`` seconds the harness reports the tasks finished
per second, the backlog (READY rows due), the start delay (p50/p99 of
``started_at - enqueued_at`` of the tasks finished in the interval), the task
table's size with its indexes and its dead rows. It exits non-zero when an
interval after the warm-up finished fewer than ``--floor`` of the producer
rate while work was waiting, or when the backlog at the end is over ``--max-backlog``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path.insert(0, str(REPO_DIR))

from django_rdbtasks.states import TaskStatus  # noqa: E402

PROJECT_DIR = BENCH_DIR / "rdbtasks_project"
DATABASE = "bench_sustained"
TABLE = "django_rdbtasks_task"
#: How often the producer enqueues: rate / TICKS_PER_SECOND tasks a call.
TICKS_PER_SECOND = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=5000, help="tasks enqueued per second")
    parser.add_argument("--processes", type=int, default=2, help="runworkers --processes")
    parser.add_argument("--interval", type=float, default=15.0, help="seconds per row")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds not judged")
    parser.add_argument(
        "--floor", type=float, default=0.8, help="least share of the rate an interval must finish"
    )
    parser.add_argument(
        "--max-backlog",
        type=int,
        default=None,
        help="most READY rows left at the end (default: 10 seconds of production)",
    )
    parser.add_argument("--output", type=Path, help="JSON results (default bench/results/)")
    parser.add_argument("--pg-host", default=os.environ.get("PGHOST", "127.0.0.1"))
    parser.add_argument("--pg-port", default=os.environ.get("PGPORT", "5432"))
    parser.add_argument("--pg-user", default=os.environ.get("PGUSER", "postgres"))
    parser.add_argument("--python", default=str(REPO_DIR / ".venv/bin/python"))
    parser.add_argument(
        "--allow-autovacuum-off",
        action="store_true",
        help="run even where the server has autovacuum off (a CI server, say)",
    )
    # Internal: the producer process.
    parser.add_argument("--produce", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def project_env(args: argparse.Namespace) -> dict[str, str]:
    return {
        **os.environ,
        "BENCH_DB_NAME": DATABASE,
        "BENCH_DB_HOST": args.pg_host,
        "BENCH_DB_PORT": str(args.pg_port),
        "BENCH_DB_USER": args.pg_user,
        "PYTHONPATH": str(REPO_DIR),
    }


# -- the producer (a process of its own, so its CPU is not the harness's) ----------------


def produce(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(PROJECT_DIR))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
    import django

    django.setup()
    from benchapp import tasks

    from django_rdbtasks.backend import bulk_enqueue

    per_tick = max(1, round(args.rate / TICKS_PER_SECOND))
    deadline = time.monotonic() + args.minutes * 60
    start = time.monotonic()
    tick = 0
    behind = 0.0
    while time.monotonic() < deadline:
        bulk_enqueue(tasks.noop, [((), {})] * per_tick, batch_size=per_tick)
        tick += 1
        pause = start + tick / TICKS_PER_SECOND - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        else:
            behind = max(behind, -pause)
    print(json.dumps({"enqueued": tick * per_tick, "most_behind_seconds": behind}), flush=True)


# -- the harness ---------------------------------------------------------------------


def recreate_database(args: argparse.Namespace) -> None:
    with psycopg.connect(
        host=args.pg_host, port=args.pg_port, user=args.pg_user, dbname="postgres", autocommit=True
    ) as conn:
        autovacuum = conn.execute("SHOW autovacuum").fetchone()[0]
        if autovacuum != "on" and not args.allow_autovacuum_off:
            # A queue table under sustained load lives by autovacuum: without
            # it the dead rows only grow, and that is all a run would show.
            sys.exit(
                f"{args.pg_host}:{args.pg_port} runs with autovacuum off: run on a server "
                "with its defaults (e.g. pg_createcluster 15 bench -p 5441 --start, then "
                "--pg-port 5441), or pass --allow-autovacuum-off"
            )
        conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DATABASE}")
    subprocess.run(
        [args.python, "manage.py", "migrate", "--verbosity", "0"],
        cwd=PROJECT_DIR,
        env=project_env(args),
        check=True,
    )


def sample(conn: psycopg.Connection, since: float, until: float) -> dict[str, Any]:
    """One interval: finished per second, backlog, start delays, the table's size."""
    finished = conn.execute(
        f"SELECT count(*) FROM {TABLE} WHERE finished_at >= to_timestamp(%s) "
        "AND finished_at < to_timestamp(%s)",
        [since, until],
    ).fetchone()[0]
    delays = [
        row[0]
        for row in conn.execute(
            f"SELECT extract(epoch FROM started_at - enqueued_at) FROM {TABLE} "
            "WHERE finished_at >= to_timestamp(%s) AND finished_at < to_timestamp(%s) "
            "ORDER BY finished_at DESC LIMIT 5000",
            [since, until],
        ).fetchall()
    ]
    backlog = conn.execute(
        f"SELECT count(*) FROM {TABLE} WHERE status = %s", [TaskStatus.READY.value]
    ).fetchone()[0]
    size, dead, analyzed = conn.execute(
        f"SELECT pg_total_relation_size('{TABLE}'), n_dead_tup, "
        "greatest(last_analyze, last_autoanalyze) FROM pg_stat_user_tables "
        f"WHERE relname = '{TABLE}'"
    ).fetchone()
    delays.sort()
    return {
        "finished_per_second": finished / (until - since),
        "backlog": backlog,
        "delay_p50_s": percentile(delays, 0.5),
        "delay_p99_s": percentile(delays, 0.99),
        "table_mb": size / 2**20,
        "dead_rows": dead,
        "last_analyze": analyzed.isoformat(timespec="seconds") if analyzed else None,
    }


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return float(values[min(len(values) - 1, int(q * len(values)))])


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"Sustained load: {args.rate:,} tasks/s enqueued, runworkers --processes "
        f"{args.processes} (no other flags), {args.minutes:g} min, autovacuum on its defaults",
        "",
        "| from (s) | finished/s | share of rate | backlog | start delay p50 / p99 (s) "
        "| table + indexes (MB) | dead rows | last ANALYZE |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        p50, p99 = row["delay_p50_s"], row["delay_p99_s"]
        delays = "-" if p50 is None else f"{p50:.3f} / {p99:.3f}"
        lines.append(
            f"| {row['from_s']:.0f} | {row['finished_per_second']:,.0f} "
            f"| {row['finished_per_second'] / args.rate:.0%} | {row['backlog']:,} | {delays} "
            f"| {row['table_mb']:,.0f} | {row['dead_rows']:,} | {row['last_analyze'] or '-'} |"
        )
    return "\n".join(lines)


def judge(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """What breaks the promise: a slow interval while work waited, or a backlog left."""
    failures = []
    for row in rows:
        if row["from_s"] < args.warmup:
            continue
        share = row["finished_per_second"] / args.rate
        if share < args.floor and row["backlog"] > args.rate:
            failures.append(
                f"interval from {row['from_s']:.0f} s finished {share:.0%} of the rate "
                f"with {row['backlog']:,} waiting"
            )
    most = args.max_backlog if args.max_backlog is not None else args.rate * 10
    if rows and rows[-1]["backlog"] > most:
        failures.append(f"{rows[-1]['backlog']:,} waiting at the end (at most {most:,})")
    return failures


def run(args: argparse.Namespace) -> int:
    log(f"creating {DATABASE}")
    recreate_database(args)
    env = project_env(args)
    workers = subprocess.Popen(
        [
            args.python,
            "manage.py",
            "runworkers",
            "--processes",
            str(args.processes),
            "--log-level",
            "WARNING",
        ],
        cwd=PROJECT_DIR,
        env=env,
    )
    producer = subprocess.Popen(
        [
            args.python,
            str(Path(__file__).resolve()),
            "--produce",
            "--minutes",
            str(args.minutes),
            "--rate",
            str(args.rate),
        ],
        cwd=PROJECT_DIR,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    rows: list[dict[str, Any]] = []
    started = time.time()
    try:
        with psycopg.connect(
            host=args.pg_host,
            port=args.pg_port,
            user=args.pg_user,
            dbname=DATABASE,
            autocommit=True,
        ) as conn:
            since = started
            while producer.poll() is None:
                time.sleep(max(0.0, since + args.interval - time.time()))
                until = time.time()
                row = {"from_s": since - started, **sample(conn, since, until)}
                rows.append(row)
                log(
                    f"{row['from_s']:5.0f} s: {row['finished_per_second']:7,.0f}/s, "
                    f"backlog {row['backlog']:,}, delay p50 {row['delay_p50_s']}, "
                    f"table {row['table_mb']:,.0f} MB, dead {row['dead_rows']:,}"
                )
                since = until
                if workers.poll() is not None:
                    raise RuntimeError("runworkers exited")
        produced = json.loads(producer.stdout.read() or "{}") if producer.stdout else {}
    finally:
        for process in (producer, workers):
            if process.poll() is None:
                process.terminate()
        for process in (producer, workers):
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    report = render(rows, args)
    print()
    print(report)
    output = (
        args.output or BENCH_DIR / "results" / f"sustained-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    judged = rows[:-1] if len(rows) > 1 else rows  # the last interval ends with the producer
    failures = judge(judged, args)
    finished = [r["finished_per_second"] for r in judged if r["from_s"] >= args.warmup]
    output.write_text(
        json.dumps(
            {
                "rate": args.rate,
                "processes": args.processes,
                "minutes": args.minutes,
                "producer": produced,
                "intervals": rows,
                "median_finished_per_second": statistics.median(finished) if finished else None,
                "failures": failures,
                "load_average_after": os.getloadavg(),
            },
            indent=2,
        )
    )
    log(f"producer: {produced}; results in {output}")
    for failure in failures:
        log(f"FAILED: {failure}")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.produce:
        produce(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
