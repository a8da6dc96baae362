"""The drain rate under concurrency limits, beside the same drain unlimited.

Run from the repository root with the project's virtualenv, PostgreSQL on
127.0.0.1:5432 (user postgres, trust):

    .venv/bin/python bench/limits.py                      # 20,000 tasks, 2 processes
    .venv/bin/python bench/limits.py --tasks 5000 --processes 4 --mode skip-locked

Each variant enqueues ``--tasks`` no-op tasks into a fresh database and times
``runworkers --burst`` draining them: ``unlimited`` (no limit), ``limit50``
(``ConcurrencyLimit(50)`` over 5 keys: a slot taken and freed per task, the
limit rarely reached) and ``limit3`` (``ConcurrencyLimit(3)`` over 5 keys: at
most 15 running, every key full most of the time). The rate is the tasks over
the span from the first claim to the last finish (database clock), so the
workers' start-up is left out. CPU per task is the worker processes' (their
rusage) and the database server's (its backends' ``/proc`` times, when the
server runs on this machine): on a shared machine, compare these side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
from core.counters import process_cpu_seconds

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
PROJECT_DIR = BENCH_DIR / "rdbtasks_project"
DATABASE = "bench_limits"
VARIANTS = {"unlimited": "noop", "limit50": "limited50", "limit3": "limited3"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--processes", type=int, default=2, help="runworkers --processes")
    parser.add_argument("--mode", default="optimistic", help="runworkers --mode")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--pg-host", default=os.environ.get("PGHOST", "127.0.0.1"))
    parser.add_argument("--pg-port", default=os.environ.get("PGPORT", "5432"))
    parser.add_argument("--pg-user", default=os.environ.get("PGUSER", "postgres"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument(
        "--database", default=DATABASE, help="the scratch database to make, drain and drop"
    )
    # Internal: the enqueuing process.
    parser.add_argument("--enqueue", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def project_env(args: argparse.Namespace) -> dict[str, str]:
    return {
        **os.environ,
        "BENCH_DB_NAME": args.database,
        "BENCH_DB_HOST": args.pg_host,
        "BENCH_DB_PORT": str(args.pg_port),
        "BENCH_DB_USER": args.pg_user,
        "PYTHONPATH": str(REPO_DIR),
    }


def enqueue(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(PROJECT_DIR))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
    import django

    django.setup()
    from benchapp import tasks

    from django_rdbtasks.backend import bulk_enqueue

    task = getattr(tasks, args.enqueue)
    calls = (
        [((), {})] * args.tasks
        if args.enqueue == "noop"
        else [((i % 5,), {}) for i in range(args.tasks)]
    )
    bulk_enqueue(task, calls)


def connect(args: argparse.Namespace, dbname: str) -> psycopg.Connection:
    return psycopg.connect(
        host=args.pg_host, port=args.pg_port, user=args.pg_user, dbname=dbname, autocommit=True
    )


class ServerCPU(threading.Thread):
    """CPU seconds the database's server processes spent for the drain (Linux, local server).

    Samples the backends connected to ``database`` every 50 ms and keeps each
    one's last CPU time (``/proc/<pid>/stat``): the workers hold their
    connections for their whole life, so what a backend spent after its last
    sample is at most 50 ms of it. None where /proc cannot tell (a remote
    server, another OS).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(daemon=True)
        self.args = args
        self.stop = threading.Event()
        self.seen: dict[int, float] = {}
        self.readable = True

    def run(self) -> None:
        with connect(self.args, "postgres") as conn:
            while not self.stop.wait(0.05):
                pids = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = %s", [self.args.database]
                ).fetchall()
                for (pid,) in pids:
                    seconds = process_cpu_seconds(pid)
                    if seconds is None:
                        self.readable = self.readable and pid in self.seen
                        continue
                    self.seen[pid] = seconds

    def seconds(self) -> float | None:
        return sum(self.seen.values()) if self.readable and self.seen else None


def run_variant(args: argparse.Namespace, task: str) -> dict[str, float | None]:
    with connect(args, "postgres") as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {args.database} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {args.database}")
    env = project_env(args)
    manage = [args.python, "manage.py"]
    subprocess.run([*manage, "migrate", "--verbosity", "0"], cwd=PROJECT_DIR, env=env, check=True)
    subprocess.run(
        [
            args.python,
            __file__,
            "--enqueue",
            task,
            "--tasks",
            str(args.tasks),
            "--database",
            args.database,
        ],
        cwd=PROJECT_DIR,
        env=env,
        check=True,
    )
    started = time.monotonic()
    workers_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server = ServerCPU(args)
    server.start()
    subprocess.run(
        [*manage, "runworkers", "--burst", "--processes", str(args.processes),
         "--mode", args.mode, "--log-level", "WARNING"],
        cwd=PROJECT_DIR,
        env=env,
        check=True,
    )  # fmt: skip
    wall = time.monotonic() - started
    server.stop.set()
    server.join()
    workers_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = (workers_after.ru_utime + workers_after.ru_stime) - (
        workers_before.ru_utime + workers_before.ru_stime
    )
    server_cpu = server.seconds()
    with connect(args, args.database) as conn:
        done, span = conn.execute(
            "SELECT count(*), EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) "
            "FROM django_rdbtasks_task WHERE status = 'SUCCESSFUL'"
        ).fetchone()
    with connect(args, "postgres") as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {args.database} WITH (FORCE)")
    return {
        "tasks": done,
        "seconds": float(span),
        "per_second": done / float(span),
        "wall": wall,
        # CPU per task, in microseconds: the worker processes', the server's.
        "worker_cpu_us": worker_cpu / done * 1e6,
        "server_cpu_us": None if server_cpu is None else server_cpu / done * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.enqueue:
        enqueue(args)
        return 0
    results: dict[str, dict[str, float | None]] = {}
    for name in args.variants.split(","):
        results[name] = run_variant(args, VARIANTS[name])
        r = results[name]
        server = r["server_cpu_us"]
        print(
            f"{name:>10}: {r['tasks']:,} tasks in {r['seconds']:.1f} s, "
            f"{r['per_second']:,.0f}/s (runworkers --processes {args.processes} "
            f"--mode {args.mode}); CPU per task: workers {r['worker_cpu_us']:,.0f} us, "
            f"server {'?' if server is None else f'{server:,.0f} us'}",
            flush=True,
        )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
