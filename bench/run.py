"""Compare django-rdbtasks with its peers on the local PostgreSQL.

The peers: django-tasks-db, Procrastinate, PgQueuer and Chancy (Python),
graphile-worker and pg-boss (Node); and the two-commit SQL floor, the ceiling
line of the drain (not a queue).

Run from the repository root with the project's virtualenv (the harness needs
psycopg; each peer gets a throwaway environment of its own under bench/.envs/, a
virtualenv for a Python peer, an npm prefix with Node 22 for a Node one):

    .venv/bin/python bench/run.py                   # everything, all systems
    .venv/bin/python bench/run.py --tasks 2000      # a quick run
    .venv/bin/python bench/run.py --tasks 100000    # longer drains (the slow peers: --slow-tasks)
    .venv/bin/python bench/run.py --rdbtasks-variants "default=;batch1=--batch 1"
    .venv/bin/python bench/run.py --repeat 3        # medians of three runs
    .venv/bin/python bench/run.py --backlog         # django-rdbtasks: empty table vs a big one
    .venv/bin/python bench/run.py --sustained 10    # a fixed enqueue rate for 10 minutes
                                                    # (bench/sustained.py --help: its options)
    .venv/bin/python bench/run.py --pinned 4 --rate 300 --pg-port 5461
                                                    # the same, with a snapshot held 4 minutes
                                                    # between a clean and a recovery phase

See bench/README.md for what is measured and how.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
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
from core.pgbench import COMMAND, SCRIPT, PgBench, find_pgbench  # noqa: E402
from core.report import (  # noqa: E402
    CommitLimit,
    MixedResults,
    SystemResults,
    render,
    write_json,
)
from systems import ALL, RDBTasks, System  # noqa: E402
from systems.base import Context  # noqa: E402

MEASUREMENTS = ("pgbench", "drain", "enqueue", "latency", "mixed")
# "metrics" shows what serving metrics costs the drain (docs/observability.md).
DEFAULT_VARIANTS = "default=;metrics=--metrics-port 0;batch100=--batch 100"
DEFAULT_MIXED_VARIANTS = "default=;batch1=--batch 1;batch100=--batch 100"


def parse_variants(spec: str) -> list[tuple[str, list[str]]]:
    """``"name=ARGS;name=ARGS"`` into ``[(name, [arg, ...]), ...]``; ARGS may be empty."""
    variants: list[tuple[str, list[str]]] = []
    for part in spec.split(";"):
        if not part.strip():
            continue
        name, sep, args = part.partition("=")
        name = name.strip()
        if not sep or not name or ":" in name or " " in name:
            raise ValueError(f"expected NAME=ARGS, got {part!r}")
        if name in (known for known, _ in variants):
            raise ValueError(f"variant {name!r} given twice")
        variants.append((name, shlex.split(args)))
    if not variants:
        raise ValueError("no variant given")
    return variants


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="instead: django-rdbtasks' drain and enqueue on an empty table and on one with"
        " --backlog-rows finished and --backlog-future scheduled rows, in turns",
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
        "--slow-tasks",
        type=int,
        default=None,
        help="tasks per drain of the slow peers, django-tasks-db and Procrastinate"
        " (default: --tasks, at most 20000)",
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
        "--enqueue-rounds",
        type=int,
        default=5,
        help="rounds the one-per-transaction enqueues are split into, the systems taking "
        "turns in each (default: %(default)s)",
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
        default="1000000",
        help="--backlog: finished rows in the big table (default: %(default)s)",
    )
    parser.add_argument(
        "--backlog-future",
        type=int,
        default=100_000,
        help="--backlog: READY rows due an hour ahead in the big table (default: %(default)s)",
    )
    parser.add_argument(
        "--backlog-turns",
        type=int,
        default=5,
        help="--backlog: turns on each table, in the order A B B A ... (default: %(default)s)",
    )
    parser.add_argument(
        "--backlog-lived-in",
        action="store_true",
        help="--backlog: B keeps each turn's rows, finished, instead of deleting them: the"
        " free space the next turn meets is what a table in use leaves, not the baseline's",
    )
    parser.add_argument(
        "--backlog-trickle",
        type=int,
        default=1000,
        help="--backlog: tasks enqueued one at a time to an idle worker (default: %(default)s)",
    )
    parser.add_argument(
        "--backlog-trickle-rate",
        type=float,
        default=200.0,
        help="--backlog: how many a second, at most (default: %(default)s)",
    )
    parser.add_argument(
        "--backlog-tolerance",
        type=float,
        default=0.10,
        help="--backlog: how much slower the big table may be (default: %(default)s)",
    )
    parser.add_argument(
        "--skip",
        default="",
        help=f"comma-separated measurements to leave out: {','.join(MEASUREMENTS)}",
    )
    parser.add_argument(
        "--rdbtasks-variants",
        default=None,
        help="django-rdbtasks configurations measured side by side, each its own row:"
        " 'NAME=RUNWORKERS ARGS;NAME=...', an empty ARGS meaning no flags"
        f" (default: '{DEFAULT_VARIANTS}'; --backlog: 'default=')",
    )
    parser.add_argument(
        "--pgbench", default=None, help="the pgbench executable (default: pgbench on PATH)"
    )
    parser.add_argument(
        "--pgbench-seconds",
        type=float,
        default=10.0,
        help="length of each pgbench run, one per worker count (default: %(default)s)",
    )
    parser.add_argument(
        "--mixed-variants",
        default=DEFAULT_MIXED_VARIANTS,
        help="django-rdbtasks configurations under the mixed load (default: '%(default)s')",
    )
    parser.add_argument(
        "--mixed-peers",
        action="store_true",
        help="put the peers under the mixed load too (about 30 s each)",
    )
    parser.add_argument(
        "--mixed-workers",
        type=int,
        default=2,
        help="worker processes under the mixed load (default: %(default)s)",
    )
    parser.add_argument(
        "--mixed-seconds",
        type=float,
        default=24.0,
        help="how long the mixed load is enqueued for (default: %(default)s)",
    )
    parser.add_argument(
        "--mixed-burst",
        type=int,
        default=100,
        help="mixed load, tasks per enqueue call, in one transaction; 1 for one enqueue"
        " call per task (default: %(default)s)",
    )
    parser.add_argument(
        "--mixed-interval",
        type=float,
        default=3.0,
        help="mixed load, seconds from one enqueue call to the next (default: %(default)s)",
    )
    parser.add_argument(
        "--long-every",
        type=int,
        default=100,
        help="mixed load, one task in this many is long (default: %(default)s)",
    )
    parser.add_argument(
        "--long-seconds",
        type=float,
        default=2.0,
        help="mixed load, how long a long task sleeps (default: %(default)s)",
    )
    parser.add_argument(
        "--rdbtasks-python",
        default=None,
        help="interpreter with django-rdbtasks' dependencies (default: .venv/bin/python)",
    )
    parser.add_argument(
        "--rdbtasks-worker-args",
        default="",
        help="runworkers options added to every variant, e.g. '--mode skip-locked'",
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
    if args.slow_tasks is None:
        args.slow_tasks = min(args.tasks, 20_000)
    args.skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    unknown = sorted(args.skip - set(MEASUREMENTS))
    if unknown:
        parser.error(f"unknown measurements in --skip: {', '.join(unknown)}")
    if args.rdbtasks_variants is None:
        args.rdbtasks_variants = "default=" if args.backlog else DEFAULT_VARIANTS
    try:
        args.variants = parse_variants(args.rdbtasks_variants)
        args.mixed_variant_list = parse_variants(args.mixed_variants)
    except ValueError as exc:
        parser.error(str(exc))
    if args.mixed_interval <= 0 or args.mixed_burst < 1 or args.long_every < 1:
        parser.error("--mixed-interval, --mixed-burst and --long-every must be positive")
    calls = max(1, round(args.mixed_seconds / args.mixed_interval))
    args.mixed_tasks = calls * args.mixed_burst
    args.mixed_rate = args.mixed_burst / args.mixed_interval
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
        self.systems: list[System] = []
        for key in args.systems:
            if key == RDBTasks.key:
                self.systems += [
                    RDBTasks(self.context, name, variant_args)
                    for name, variant_args in args.variants
                ]
            else:
                self.systems += ALL[key].configurations(self.context)
        self.results = {
            system.ident: SystemResults(
                system.ident,
                system.label,
                variant=system.variant_title,
                reference=system.reference,
                ceiling=system.floor,
                worker_args=system.worker_args if isinstance(system, RDBTasks) else None,
            )
            for system in self.systems
        }
        self.commit_limit: CommitLimit | None = None
        self.pgbench: PgBench | None = None
        if not args.backlog and "pgbench" not in args.skip:
            self.commit_limit = CommitLimit(command=COMMAND, script=SCRIPT)
        self.mixed: list[tuple[System, list[str] | None, MixedResults]] = []
        self.set_up_databases: set[str] = set()

    def log_path(self, system: System, what: str) -> Path:
        return self.context.logs_dir / f"{system.ident}-{what}.log".replace(":", "-")

    def first_of_database(self, system: System) -> bool:
        """Whether ``system`` is the first configuration measured in its database."""
        return next(s for s in self.systems if s.database == system.database) is system

    def attempt(self, system: System, what: str, step: Callable[[System], None]) -> None:
        """Run one step; on failure record it and measure this system no further."""
        result = self.results[system.ident]
        if result.error is not None:
            return
        try:
            step(system)
        except Exception:
            result.error = f"{what}: {traceback.format_exc()}"
            log(
                f"{system.title}: {what} FAILED, measuring it no further:\n{traceback.format_exc()}"
            )

    # -- set-up ------------------------------------------------------------------------

    def set_up(self, system: System) -> None:
        system.prepare_env()
        # django-rdbtasks' variants share one database, created once.
        if system.database not in self.set_up_databases:
            log(f"{system.label}: environment and fresh database {system.database}")
            self.server.recreate_database(system.database)
            system.create_schema()
            self.set_up_databases.add(system.database)
        result = self.results[system.ident]
        result.version = system.version()
        result.notes = system.notes()
        result.bulk_api = system.bulk_api

    # -- measurements ------------------------------------------------------------------

    def measure_enqueues(self) -> None:
        """Every system's enqueue, before anything else of the run, the systems taking turns.

        A single enqueue waits on one commit, so its figure is the disk's as
        much as the code's, and this machine's disk changes pace from minute
        to minute. So the one-per-transaction enqueues are timed in
        ``--enqueue-rounds`` rounds, each system enqueueing its share in turn,
        and added up; none of them just after a drain or pgbench.
        """
        if "enqueue" in self.args.skip or self.args.backlog:
            return
        # Enqueueing does not depend on the worker's options: once per database. The SQL
        # floor is no enqueue API.
        systems = [
            s
            for s in self.systems
            if self.first_of_database(s) and not s.floor and not self.results[s.ident].error
        ]
        rounds = max(1, self.args.enqueue_rounds)
        share = max(1, self.args.single // rounds)
        single = {system: [0.0, 0.0] for system in systems}  # seconds, driver CPU seconds
        for _ in range(rounds):
            for system in systems:
                self.attempt(system, "enqueue", lambda s: self._time_single(s, share, single))
        for system in systems:
            self.attempt(system, "enqueue", lambda s: self._time_bulk(s, share * rounds, single))

    def _time_single(self, system: System, count: int, spent: dict[System, list[float]]) -> None:
        with self.server.connect(system.database) as conn:
            seconds, cpu = measure.time_single_enqueues(system, conn, count)
        spent[system][0] += seconds
        spent[system][1] += cpu

    def _time_bulk(
        self, system: System, single_count: int, single: dict[System, list[float]]
    ) -> None:
        args = self.args
        with self.server.connect(system.database) as conn:
            transaction_seconds, transaction_cpu = measure.time_transaction_enqueues(
                system, conn, args.bulk, args.chunk
            )
            bulk_seconds = measure.time_bulk_enqueues(system, conn, args.bulk, args.chunk)
        run = measure.EnqueueRun(
            single_count,
            single[system][0],
            args.bulk,
            bulk_seconds,
            args.chunk,
            transaction_count=args.bulk,
            transaction_seconds=transaction_seconds,
            single_cpu_seconds=single[system][1],
            transaction_cpu_seconds=transaction_cpu,
        ).as_dict()
        self.results[system.ident].enqueue.append(run)
        log(
            f"{system.title}: enqueue {run['single_per_second']:,.0f}/s one per transaction,"
            f" {run['transaction_per_second']:,.0f}/s {args.chunk:,} calls per transaction,"
            f" {run['bulk_per_second']:,.0f}/s bulk; client CPU per task"
            f" {run['single_client_cpu_us']:.0f} / {run['transaction_client_cpu_us']:.0f} us"
        )

    def measure_all(self, system: System) -> None:
        with self.server.connect(system.database) as conn:
            if "drain" not in self.args.skip:
                for workers in self.args.workers:
                    self.measure_drain(system, conn, workers)
            # The SQL floor runs no task: there is no start to measure.
            if "latency" not in self.args.skip and not system.floor:
                self.measure_latency(system, conn)

    def measure_drain(self, system: System, conn: psycopg.Connection, workers: int) -> None:
        log_path = self.log_path(system, "drain")
        args = self.args
        tasks = args.slow_tasks if system.slow else args.tasks
        drain = measure.measure_drain(
            system, conn, tasks=tasks, workers=workers, chunk=args.chunk, log=log_path
        )
        run = drain.as_dict()
        self.results[system.ident].drain.setdefault(workers, []).append(run)
        machine, server = run["machine_cpu_us_per_task"], run["server_cpu_us_per_task"]
        log(
            f"{system.title}: drain of {tasks:,} with {workers} worker(s) {drain.rate:,.0f}"
            f" tasks/s ({drain.seconds:.2f} s, first done after {drain.first_done_seconds:.2f} s;"
            f" per task: workers' CPU {run['worker_cpu_us_per_task']:.0f} us, server's CPU"
            f" {'-' if server is None else f'{server:.0f}'} us, machine's CPU"
            f" {'-' if machine is None else f'{machine:.0f}'} us, WAL"
            f" {run['wal_bytes_per_task']:,.0f} B, {run['transactions_per_task']:.3f}"
            " transactions)"
        )
        if drain.other_transactions:
            log(
                f"{system.title}: {drain.other_transactions} transactions in other databases"
                " during the drain: its WAL may include theirs"
            )

    def measure_latency(self, system: System, conn: psycopg.Connection) -> None:
        log_path = self.log_path(system, "latency")
        args = self.args
        run = measure.measure_latency(
            system, conn, count=args.latency_count, pause=args.latency_pause, log=log_path
        ).as_dict()
        self.results[system.ident].latency.append(run)
        log(f"{system.title}: latency p50 {run['p50_ms']:.1f} ms, p99 {run['p99_ms']:.1f} ms")

    # -- the commit limit ------------------------------------------------------------

    def set_up_pgbench(self) -> None:
        limit = self.commit_limit
        assert limit is not None
        try:
            self.pgbench = PgBench(
                self.server, find_pgbench(self.args.pgbench), self.context.logs_dir
            )
            limit.tool = self.pgbench.version()
            log(f"commit limit: {limit.tool}, fresh database bench_pgbench")
            self.pgbench.set_up()
        except Exception:
            limit.error = f"set-up: {traceback.format_exc()}"
            log(f"commit limit: set-up FAILED:\n{traceback.format_exc()}")

    def measure_commit_limit(self) -> None:
        limit = self.commit_limit
        if limit is None or limit.error is not None or self.pgbench is None:
            return
        try:
            for clients in self.args.workers:
                run = self.pgbench.measure(clients, self.args.pgbench_seconds)
                limit.runs.setdefault(clients, []).append(run.as_dict())
                log(f"commit limit: pgbench, {clients} client(s), {run.tps:,.0f} transactions/s")
        except Exception:
            limit.error = f"measuring: {traceback.format_exc()}"
            log(f"commit limit: FAILED:\n{traceback.format_exc()}")

    # -- the mixed load ----------------------------------------------------------------

    def set_up_mixed(self) -> None:
        """One row per django-rdbtasks mixed variant, then the peers if asked for."""
        args = self.args
        for system in self.systems:
            if isinstance(system, RDBTasks):
                for name, variant_args in args.mixed_variant_list:
                    flags = " ".join(variant_args) or "no flags"
                    key = f"{system.key}:{name}"
                    label = f"{system.label} {name} ({flags})"
                    self.mixed.append(
                        (system, variant_args, MixedResults(key, label, variant_args))
                    )
                break  # one set of rows, whatever the drain variants
        if args.mixed_peers:
            for system in self.systems:
                if not system.reference and not system.floor:
                    result = MixedResults(system.ident, system.title)
                    self.mixed.append((system, None, result))

    def measure_mixed(self) -> None:
        args = self.args
        for system, worker_args, result in self.mixed:
            if result.error is not None:
                continue
            set_up_error = self.results[system.ident].error
            if set_up_error is not None and set_up_error.startswith("set-up"):
                result.error = set_up_error
                continue
            try:
                with self.server.connect(system.database) as conn:
                    run = measure.measure_mixed(
                        system,
                        conn,
                        commands=system.idle_worker_commands(args.mixed_workers, worker_args),
                        workers=args.mixed_workers,
                        tasks=args.mixed_tasks,
                        rate=args.mixed_rate,
                        burst=args.mixed_burst,
                        long_every=args.long_every,
                        long_seconds=args.long_seconds,
                        log=self.context.logs_dir / f"{result.key.replace(':', '-')}-mixed.log",
                    ).as_dict()
            except Exception:
                result.error = f"mixed load: {traceback.format_exc()}"
                log(f"{result.label}: mixed load FAILED:\n{traceback.format_exc()}")
                continue
            result.runs.append(run)
            log(
                f"{result.label}: mixed load, short tasks' start delay p50"
                f" {run['short_p50_ms']:.1f} ms, p99 {run['short_p99_ms']:.1f} ms,"
                f" max {run['short_max_ms']:.1f} ms"
            )

    def main(self) -> None:
        if self.commit_limit is not None:
            self.set_up_pgbench()
        for system in self.systems:
            self.attempt(system, "set-up", self.set_up)
        if not self.args.backlog and "mixed" not in self.args.skip:
            self.set_up_mixed()
        for repeat in range(self.args.repeat):
            if self.args.repeat > 1:
                log(f"-- run {repeat + 1} of {self.args.repeat}")
            self.measure_enqueues()
            self.measure_commit_limit()
            for system in self.systems:
                self.attempt(system, "measuring", self.measure_all)
            self.measure_mixed()

    def drop_databases(self) -> None:
        databases = dict.fromkeys(system.database for system in self.systems)
        if self.pgbench is not None:
            databases["bench_pgbench"] = None
        for database in databases:
            try:
                self.server.drop_database(database)
            except Exception as exc:
                log(f"could not drop {database}: {exc}")


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
        "slow_tasks": args.slow_tasks,
        "slow_systems": sorted(key for key in args.systems if ALL[key].slow),
        "workers": args.workers,
        "repeat": args.repeat,
        "single": args.single,
        "enqueue_rounds": args.enqueue_rounds,
        "bulk": args.bulk,
        "chunk": args.chunk,
        "latency_count": args.latency_count,
        "latency_pause": args.latency_pause,
        "backlog_rows": args.backlog_rows,
        "skip": sorted(args.skip),
        "rdbtasks_variants": {name: variant_args for name, variant_args in args.variants},
        "rdbtasks_worker_args": args.rdbtasks_worker_args,
        "rdbtasks_python": args.rdbtasks_python,
        "pgbench_seconds": args.pgbench_seconds,
        "mixed_variants": {name: variant_args for name, variant_args in args.mixed_variant_list},
        "mixed_peers": args.mixed_peers,
        "mixed_workers": args.mixed_workers,
        "mixed_tasks": args.mixed_tasks,
        "mixed_rate": args.mixed_rate,
        "mixed_burst": args.mixed_burst,
        "mixed_interval": args.mixed_interval,
        "long_every": args.long_every,
        "long_seconds": args.long_seconds,
        "drain_poll_interval": [measure.DRAIN_POLL_MIN, measure.DRAIN_POLL_MAX],
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--sustained" in argv:
        # A harness of its own (bench/sustained.py): --sustained MINUTES, then its options.
        import sustained

        at = argv.index("--sustained")
        return sustained.main(["--minutes", *argv[at + 1 : at + 2], *argv[:at], *argv[at + 2 :]])
    if "--pinned" in argv:
        # Issue 43: the sustained harness with a pin the harness holds (--pinned MINUTES).
        import sustained

        return sustained.main(argv)
    args = parse_args(argv)
    started = datetime.datetime.now().astimezone()
    stamp = started.strftime("%Y%m%d-%H%M%S")
    if args.backlog:
        # Two databases side by side, in turns: a harness of its own (core/backlog.py).
        from core import backlog

        return backlog.run(args, stamp, args.rdbtasks_python)
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
    mixed = [result for _, _, result in runner.mixed]
    write_json(output, info, results, runner.commit_limit, mixed)
    print()
    print(render(results, config(args), runner.commit_limit, mixed))
    if restarted:
        log("WARNING: PostgreSQL restarted during the run; its figures are not to be trusted")
    log(f"took {time.perf_counter() - clock:.0f} s; results in {output}")
    log(f"worker logs in {runner.context.logs_dir}")
    failed = [result.error for result in [*results, *mixed]]
    if runner.commit_limit is not None:
        failed.append(runner.commit_limit.error)
    return 1 if restarted or any(failed) else 0


if __name__ == "__main__":
    sys.exit(main())
