"""Compare django-rdbtasks with django-tasks-db and Procrastinate on the local PostgreSQL.

Run from the repository root with the project's virtualenv (the harness needs
psycopg; each peer gets a throwaway virtualenv of its own under bench/.envs/):

    .venv/bin/python bench/run.py                   # drain, enqueue and latency, all systems
    .venv/bin/python bench/run.py --tasks 2000      # a quick run
    .venv/bin/python bench/run.py --repeat 3        # medians of three runs
    .venv/bin/python bench/run.py --backlog         # django-rdbtasks, 1,000 vs 1,000,000 old rows

See bench/README.md for what is measured and how.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

try:
    import psycopg
except ImportError:  # pragma: no cover - a hint, not a feature
    sys.exit(
        "run.py needs psycopg: run it with the project's virtualenv, .venv/bin/python bench/run.py"
    )

from core import measure  # noqa: E402
from core.pg import PgServer  # noqa: E402
from core.report import SystemResults, render, write_json  # noqa: E402
from systems import ALL, System  # noqa: E402
from systems.base import Context  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="measure django-rdbtasks' drain with old finished rows in the table instead",
    )
    parser.add_argument(
        "--systems",
        default=None,
        help=f"comma-separated, from: {','.join(ALL)} (default: all; --backlog: rdbtasks only)",
    )
    parser.add_argument(
        "--tasks", type=int, default=20_000, help="tasks per drain (default: %(default)s)"
    )
    parser.add_argument(
        "--workers",
        default=None,
        help="worker process counts to drain with (default: 1,2,4; --backlog: 1)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each measurement; the report shows medians (default: %(default)s)",
    )
    parser.add_argument(
        "--single",
        type=int,
        default=2_000,
        help="tasks enqueued one per transaction (default: %(default)s)",
    )
    parser.add_argument(
        "--bulk", type=int, default=20_000, help="tasks enqueued in bulk (default: %(default)s)"
    )
    parser.add_argument(
        "--chunk", type=int, default=1_000, help="tasks per bulk call (default: %(default)s)"
    )
    parser.add_argument(
        "--latency-count", type=int, default=200, help="latency probes (default: %(default)s)"
    )
    parser.add_argument(
        "--latency-pause",
        type=float,
        default=0.02,
        help="seconds between latency probes (default: %(default)s)",
    )
    parser.add_argument(
        "--backlog-rows",
        default="1000,1000000",
        help="finished rows in the table, for --backlog (default: %(default)s)",
    )
    parser.add_argument(
        "--skip",
        default="",
        help="comma-separated measurements to leave out: drain,enqueue,latency",
    )
    parser.add_argument(
        "--rdbtasks-python",
        default=None,
        help="interpreter with django-rdbtasks' dependencies (default: .venv/bin/python)",
    )
    parser.add_argument(
        "--rdbtasks-worker-args",
        default="",
        help="extra runworkers options, e.g. '--batch 50 --mode skip-locked'",
    )
    parser.add_argument("--pg-host", default=os.environ.get("PGHOST", "127.0.0.1"))
    parser.add_argument("--pg-port", type=int, default=int(os.environ.get("PGPORT", "5432")))
    parser.add_argument("--pg-user", default=os.environ.get("PGUSER", "postgres"))
    parser.add_argument(
        "--reinstall-envs", action="store_true", help="rebuild the peers' virtualenvs"
    )
    parser.add_argument(
        "--keep-databases", action="store_true", help="do not drop the bench_* databases at the end"
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="JSON file to write (default: bench/results/<timestamp>.json)",
    )
    args = parser.parse_args(argv)
    default_systems = "rdbtasks" if args.backlog else ",".join(ALL)
    args.systems = [
        key.strip() for key in (args.systems or default_systems).split(",") if key.strip()
    ]
    unknown = [key for key in args.systems if key not in ALL]
    if unknown:
        parser.error(f"unknown systems: {', '.join(unknown)}")
    if args.backlog and args.systems != ["rdbtasks"]:
        parser.error("--backlog measures django-rdbtasks only")
    args.workers = [int(n) for n in (args.workers or ("1" if args.backlog else "1,2,4")).split(",")]
    args.backlog_rows = [int(n) for n in args.backlog_rows.split(",")]
    args.skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    return args


#: A 1-minute load average above this before a run means something else is using the
#: cores the systems are measured on (the harness itself adds little).
BUSY_LOAD = 0.5


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class Runner:
    """Runs each measurement for each system, recording results or the first error."""

    def __init__(self, args: argparse.Namespace, stamp: str) -> None:
        self.args = args
        self.server = PgServer(
            host=args.pg_host,
            port=args.pg_port,
            user=args.pg_user,
            password=os.environ.get("PGPASSWORD", ""),
        )
        self.context = Context(
            server=self.server,
            envs_dir=BENCH_DIR / ".envs",
            logs_dir=BENCH_DIR / ".logs" / stamp,
            reinstall_envs=args.reinstall_envs,
            options={
                "rdbtasks_python": args.rdbtasks_python,
                "rdbtasks_worker_args": args.rdbtasks_worker_args,
            },
        )
        self.systems: list[System] = [ALL[key](self.context) for key in args.systems]
        self.results = {
            system.key: SystemResults(system.key, system.label) for system in self.systems
        }

    def log_path(self, system: System, what: str) -> Path:
        return self.context.logs_dir / f"{system.key}-{what}.log"

    def attempt(self, system: System, what: str, step: Callable[[System], None]) -> None:
        """Run one step; on failure record it and measure this system no further."""
        result = self.results[system.key]
        if result.error is not None:
            return
        try:
            step(system)
        except Exception:
            result.error = f"{what}: {traceback.format_exc()}"
            log(
                f"{system.label}: {what} FAILED, measuring it no further:\n{traceback.format_exc()}"
            )

    # -- set-up ------------------------------------------------------------------------

    def set_up(self, system: System) -> None:
        log(f"{system.label}: environment and fresh database {system.database}")
        system.prepare_env()
        self.server.recreate_database(system.database)
        system.create_schema()
        result = self.results[system.key]
        result.version = system.version()
        result.notes = system.notes()
        result.bulk_api = system.bulk_api

    # -- measurements ------------------------------------------------------------------

    def measure_all(self, system: System) -> None:
        with self.server.connect(system.database) as conn:
            if "enqueue" not in self.args.skip:
                self.measure_enqueue(system, conn)
            if "drain" not in self.args.skip:
                for workers in self.args.workers:
                    self.measure_drain(system, conn, workers)
            if "latency" not in self.args.skip:
                self.measure_latency(system, conn)

    def measure_enqueue(self, system: System, conn: psycopg.Connection) -> None:
        args = self.args
        run = measure.measure_enqueue(
            system, conn, single=args.single, bulk=args.bulk, chunk=args.chunk
        ).as_dict()
        self.results[system.key].enqueue.append(run)
        log(
            f"{system.label}: enqueue {run['single_per_second']:,.0f}/s one per transaction,"
            f" {run['bulk_per_second']:,.0f}/s bulk"
        )

    def measure_drain(self, system: System, conn: psycopg.Connection, workers: int) -> None:
        log_path = self.log_path(system, "drain")
        args = self.args
        drain = measure.measure_drain(
            system, conn, tasks=args.tasks, workers=workers, chunk=args.chunk, log=log_path
        )
        self.results[system.key].drain.setdefault(workers, []).append(drain.as_dict())
        log(
            f"{system.label}: drain with {workers} worker(s) {drain.rate:,.0f} tasks/s"
            f" ({drain.seconds:.2f} s, first done after {drain.first_done_seconds:.2f} s)"
        )

    def measure_latency(self, system: System, conn: psycopg.Connection) -> None:
        log_path = self.log_path(system, "latency")
        args = self.args
        run = measure.measure_latency(
            system, conn, count=args.latency_count, pause=args.latency_pause, log=log_path
        ).as_dict()
        self.results[system.key].latency.append(run)
        log(f"{system.label}: latency p50 {run['p50_ms']:.1f} ms, p99 {run['p99_ms']:.1f} ms")

    def measure_backlog(self, system: System) -> None:
        args = self.args
        by_rows = self.results[system.key].backlog
        with self.server.connect(system.database) as conn:
            for rows in args.backlog_rows:
                for workers in args.workers:
                    log(f"{system.label}: {rows:,} finished rows in the table, {workers} worker(s)")
                    drain = measure.measure_backlog_drain(
                        system,
                        conn,
                        backlog=rows,
                        tasks=args.tasks,
                        workers=workers,
                        chunk=args.chunk,
                        log=self.log_path(system, "backlog"),
                    )
                    by_rows.setdefault(rows, {}).setdefault(workers, []).append(drain.as_dict())
                    log(f"{system.label}: {drain.rate:,.0f} tasks/s ({drain.seconds:.2f} s)")

    def main(self) -> None:
        for system in self.systems:
            self.attempt(system, "set-up", self.set_up)
        step = self.measure_backlog if self.args.backlog else self.measure_all
        for repeat in range(self.args.repeat):
            if self.args.repeat > 1:
                log(f"-- run {repeat + 1} of {self.args.repeat}")
            for system in self.systems:
                self.attempt(system, "measuring", step)

    def drop_databases(self) -> None:
        for system in self.systems:
            try:
                self.server.drop_database(system.database)
            except Exception as exc:
                log(f"could not drop {system.database}: {exc}")


def meta(
    args: argparse.Namespace, server: PgServer, started: datetime.datetime, seconds: float
) -> dict[str, Any]:
    return {
        "started_at": started.isoformat(timespec="seconds"),
        "duration_seconds": round(seconds, 1),
        "host": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "postgresql": describe_server(server),
        "config": config(args),
    }


def describe_server(server: PgServer) -> dict[str, str]:
    try:
        return server.describe()
    except psycopg.Error as exc:  # the results are still worth writing
        return {"error": str(exc)}


def config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "mode": "backlog" if args.backlog else "compare",
        "systems": args.systems,
        "tasks": args.tasks,
        "workers": args.workers,
        "repeat": args.repeat,
        "single": args.single,
        "bulk": args.bulk,
        "chunk": args.chunk,
        "latency_count": args.latency_count,
        "latency_pause": args.latency_pause,
        "backlog_rows": args.backlog_rows,
        "skip": sorted(args.skip),
        "rdbtasks_worker_args": args.rdbtasks_worker_args,
        "drain_poll_interval": [measure.DRAIN_POLL_MIN, measure.DRAIN_POLL_MAX],
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.datetime.now().astimezone()
    stamp = started.strftime("%Y%m%d-%H%M%S")
    runner = Runner(args, stamp)
    clock = time.perf_counter()
    server_started = runner.server.started_at()
    load_before = os.getloadavg()
    if load_before[0] > BUSY_LOAD:
        log(f"WARNING: load average {load_before[0]:.1f} before starting: the machine is busy")
    try:
        runner.main()
    finally:
        if not args.keep_databases:
            runner.drop_databases()
    # Something else on the machine (a test suite's outage tests, say) may restart the server.
    restarted = runner.server.started_at() != server_started
    results = list(runner.results.values())
    output = args.output or BENCH_DIR / "results" / f"{stamp}.json"
    info = meta(args, runner.server, started, time.perf_counter() - clock)
    info["postgresql"]["restarted_during_run"] = restarted
    info["host"]["load_average_before"] = load_before
    info["host"]["load_average_after"] = os.getloadavg()
    write_json(output, info, results)
    print()
    print(render(results, config(args)))
    if restarted:
        log("WARNING: PostgreSQL restarted during the run; its figures are not to be trusted")
    log(f"took {time.perf_counter() - clock:.0f} s; results in {output}")
    log(f"worker logs in {runner.context.logs_dir}")
    return 1 if restarted or any(result.error for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
