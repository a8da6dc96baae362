"""Limited and unlimited tasks in one queue, and the cost of waiting for a full key.

Run from the repository root with the project's virtualenv, PostgreSQL on
127.0.0.1:5432 (user postgres, trust):

    .venv/bin/python bench/limit_waits.py                        # both measurements
    .venv/bin/python bench/limit_waits.py --only mixed --mode skip-locked
    .venv/bin/python bench/limit_waits.py --only mixed --repeat 5   # medians and ranges
    .venv/bin/python bench/limit_waits.py --only full --processes 2 --threads 10
    .venv/bin/python bench/limit_waits.py --only mixed --supervisors 4x2,2x3,2x2:skip-locked
    .venv/bin/python bench/limit_waits.py --vendor mysql     # MariaDB on 127.0.0.1:3306 (root)

**mixed** (issue 42's scenario): ``--limited`` tasks that sleep 40 ms under
``ConcurrencyLimit(3, key="acc-conc:{group}")`` over 5 groups, then
``--unlimited`` tasks that sleep 10 ms, enqueued with ``bulk_enqueue`` in one
transaction, drained by ``runworkers --burst``. Then the unlimited tasks alone,
the same way. Reported from the bodies' own start and end times (each body
records its run): the unlimited tasks' start delays (deciles, seconds after
the first body started) and the same alone (issue 42's "p90 within 1 s" is to
be read beside what the tasks get with nothing ahead of them on the same
machine), their drain rate beside the rate alone, how many
limited bodies ran at once on average while their backlog lasted (of the 15
the limits allow), the server's CPU and transactions per task, and the tasks
claimed per claim statement (from the workers' log). Each body records its
run by a line in its process's own file (``--record db``: a row in the
benchmark's database instead, as every run before 2026-11-30's evening did;
that INSERT and its commit loaded the server the scenario measures, and fell
inside each body's hold on its lane and slot, after its end was taken). With ``--started-first``
the workers run (idle, their sessions open) before the tasks are enqueued, as
a deployment's do, and are stopped once every body has run: the drain without
the workers' start-up in it. With ``--warm-up`` as well, the same workers drain
the same tasks once before the measured drain, unmeasured: every server
session has then planned every shape of round it runs, as a deployment's
sessions have. ``--supervisors`` runs several ``runworkers`` side by side, as
issue 42 did (``4x2,2x3,2x2:skip-locked``: three supervisors, 18 lanes in 8
processes), in place of the one of ``--processes``, ``--threads`` and ``--mode``.

**full**: the same workers with every key full, 15 holders sleeping through
the window and a backlog of READY rows of their keys behind them, beside the
same workers with an idle queue (15 unlimited sleepers, nothing else): the
server's CPU (its backends' ``/proc`` times) and transactions per second
(``pg_stat_database``) over the same window, and their ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.counters import proc_stat, process_cpu_seconds
from limits import connect, project_env

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_DIR = BENCH_DIR / "rdbtasks_project"
DATABASE = "bench_limit_waits"
#: The workers' logs (gitignored), read for their claim counts.
LOGS = BENCH_DIR / ".logs" / "limit_waits"
GROUPS = 5
#: The limited tasks' limit: per group (``benchapp.tasks.limited_sleep``).
PER_GROUP = 3
CLAIMS = re.compile(
    r"\((\d+) claimed in (\d+) claim statements\)(?:, (\d+) by a slot's hand-over)?"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=["mixed", "full"], help="one measurement only")
    parser.add_argument("--limited", type=int, default=2000)
    parser.add_argument("--unlimited", type=int, default=500)
    parser.add_argument("--processes", type=int, default=2, help="runworkers --processes")
    parser.add_argument("--threads", type=int, default=10, help="runworkers --threads")
    parser.add_argument("--mode", default="optimistic", help="runworkers --mode")
    parser.add_argument(
        "--started-first",
        action="store_true",
        help="mixed: the workers run (idle) before the tasks are enqueued, as a deployment's "
        "do, instead of burst workers started on the backlog",
    )
    parser.add_argument(
        "--warm-up",
        action="store_true",
        help="mixed, with --started-first: the workers drain the same tasks once before "
        "the measured drain, as a deployment's have run such tasks before (each server "
        "session has then planned every form of round it runs)",
    )
    parser.add_argument(
        "--supervisors",
        help="several runworkers side by side, as PxT[:mode] comma-separated (issue 42's: "
        "4x2,2x3,2x2:skip-locked); each --mode's where not given. Overrides --processes "
        "and --threads",
    )
    parser.add_argument(
        "--record",
        choices=["file", "db"],
        default="file",
        help="mixed: where each body records its run: a line in its process's file (default), "
        "or a row in the benchmark's database, an INSERT and its commit in every body",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="mixed: runs, each figure's median reported"
    )
    parser.add_argument("--window", type=float, default=20.0, help="full: seconds measured")
    parser.add_argument(
        "--vendor",
        choices=["postgresql", "mysql"],
        default="postgresql",
        help="the database: PostgreSQL (--pg-*), or MariaDB/MySQL (--mysql-*; MYSQL_PWD)",
    )
    parser.add_argument("--mysql-host", default="127.0.0.1")
    parser.add_argument("--mysql-port", type=int, default=3306)
    parser.add_argument("--mysql-user", default="root")
    parser.add_argument("--pg-host", default=os.environ.get("PGHOST", "127.0.0.1"))
    parser.add_argument("--pg-port", default=os.environ.get("PGPORT", "5432"))
    parser.add_argument("--pg-user", default=os.environ.get("PGUSER", "postgres"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--database", default=DATABASE)
    # Internal: the enqueuing process, given the calls as JSON.
    parser.add_argument("--enqueue", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warm_up and not args.started_first:
        parser.error("--warm-up drains twice with the same workers: it needs --started-first")
    return args


def enqueue(args: argparse.Namespace) -> None:
    """Every batch of ``--enqueue`` (task name, calls) in one transaction."""
    sys.path.insert(0, str(PROJECT_DIR))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
    import django

    django.setup()
    from benchapp import tasks
    from django.db import transaction

    from django_rdbtasks.backend import bulk_enqueue

    with transaction.atomic():
        for name, calls in json.loads(args.enqueue):
            bulk_enqueue(getattr(tasks, name), [(tuple(call), {}) for call in calls])


class BenchDatabase:
    """The benchmark's database on one server: made and dropped, the workers' settings
    for it, and what its server spent (``--vendor``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        raise NotImplementedError

    def create(self) -> None:
        raise NotImplementedError

    def drop(self) -> None:
        raise NotImplementedError

    def sessions(self) -> int:
        """The sessions open on the database."""
        raise NotImplementedError

    def sample(self, seen: dict[int, float]) -> None:
        """The CPU seconds so far of each server process serving the database, into ``seen``."""
        raise NotImplementedError

    def transactions(self) -> int:
        raise NotImplementedError


class PostgreSQL(BenchDatabase):
    """On PostgreSQL: the database's backends' CPU from ``/proc``, ``pg_stat_database``'s
    transactions."""

    def env(self) -> dict[str, str]:
        return project_env(self.args)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with connect(self.args, self.args.database) as conn:
            return conn.execute(sql, params).fetchall()

    def create(self) -> None:
        with connect(self.args, "postgres") as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self.args.database} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {self.args.database}")

    def drop(self) -> None:
        with connect(self.args, "postgres") as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self.args.database} WITH (FORCE)")

    def sessions(self) -> int:
        with connect(self.args, "postgres") as conn:
            return conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [self.args.database]
            ).fetchone()[0]

    def sample(self, seen: dict[int, float]) -> None:
        with connect(self.args, "postgres") as conn:
            pids = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", [self.args.database]
            ).fetchall()
        for (pid,) in pids:
            seconds = process_cpu_seconds(pid)
            if seconds is not None:
                seen[pid] = seconds

    def transactions(self) -> int:
        with connect(self.args, "postgres") as conn:
            return conn.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
                [self.args.database],
            ).fetchone()[0]


class MariaDB(BenchDatabase):
    """On MariaDB/MySQL (``--vendor mysql``), whose server is one process: its
    CPU is the whole server's, and its transactions its commits and rollbacks
    (``Com_commit``, ``Com_rollback``), both server-wide: run it on a server that
    does nothing else."""

    def env(self) -> dict[str, str]:
        return {
            **project_env(self.args),
            "BENCH_DB_ENGINE": "mysql",
            "BENCH_DB_HOST": self.args.mysql_host,
            "BENCH_DB_PORT": str(self.args.mysql_port),
            "BENCH_DB_USER": self.args.mysql_user,
            "BENCH_DB_PASSWORD": os.environ.get("MYSQL_PWD", ""),
        }

    def _query(self, sql: str, params: Sequence[Any] = (), database: str | None = None) -> list:
        # bench/pinned_mysql.py's connection (the same --mysql-* options), imported
        # here so that a PostgreSQL run needs no MySQL driver.
        from pinned_mysql import connect as mysql_connect
        from pinned_mysql import query

        conn = mysql_connect(self.args, database)
        try:
            return query(conn, sql, tuple(params))
        finally:
            conn.close()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return self._query(sql, params, self.args.database)

    def create(self) -> None:
        self.drop()
        self._query(f"CREATE DATABASE {self.args.database}")

    def drop(self) -> None:
        self._query(f"DROP DATABASE IF EXISTS {self.args.database}")

    def sessions(self) -> int:
        return self._query(
            "SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = %s",
            [self.args.database],
        )[0][0]

    def sample(self, seen: dict[int, float]) -> None:
        found = subprocess.run(["pidof", "mariadbd", "mysqld"], capture_output=True, text=True)
        for pid in map(int, found.stdout.split()):
            # All its threads' (``/proc/<pid>/stat``; its schedstat is the first thread's).
            stat = proc_stat(pid)
            if stat is not None:
                seen[pid] = stat.own_ticks / os.sysconf("SC_CLK_TCK")

    def transactions(self) -> int:
        rows = self._query(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_commit', 'Com_rollback')"
        )
        return sum(int(value) for _, value in rows)


def database(args: argparse.Namespace) -> BenchDatabase:
    return MariaDB(args) if args.vendor == "mysql" else PostgreSQL(args)


def fresh_database(args: argparse.Namespace) -> None:
    server = database(args)
    server.create()
    manage = [args.python, "manage.py", "migrate", "--verbosity", "0"]
    subprocess.run(manage, cwd=PROJECT_DIR, env=server.env(), check=True)
    if args.record == "db":
        server.execute(
            "CREATE TABLE bench_runs (kind varchar(32), n int, started double precision, "
            "finished double precision)"
        )


def drop_database(args: argparse.Namespace) -> None:
    database(args).drop()


def enqueue_in_one_transaction(args: argparse.Namespace, batches: list) -> None:
    subprocess.run(
        [args.python, __file__, "--enqueue", json.dumps(batches), "--database", args.database],
        cwd=PROJECT_DIR,
        env=database(args).env(),
        check=True,
    )


class Runs:
    """Where the bodies record their runs (``--record``): files in a directory of the
    drain's own, or the ``bench_runs`` table."""

    def __init__(self, args: argparse.Namespace, name: str) -> None:
        self.args = args
        self.directory = LOGS / f"{name}-runs" if args.record == "file" else None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory.mkdir(parents=True)

    def env(self) -> dict[str, str]:
        return {"BENCH_RUNS_DIR": str(self.directory)} if self.directory is not None else {}

    def read(self) -> list[tuple[str, int, float, float]]:
        if self.directory is None:
            return database(self.args).execute("SELECT kind, n, started, finished FROM bench_runs")
        runs = []
        for path in self.directory.glob("*.txt"):
            for line in path.read_text().splitlines():
                kind, n, started, finished = line.split()
                runs.append((kind, int(n), float(started), float(finished)))
        return runs

    def count(self) -> int:
        if self.directory is None:
            return database(self.args).execute("SELECT count(*) FROM bench_runs")[0][0]
        return sum(len(path.read_text().splitlines()) for path in self.directory.glob("*.txt"))


@dataclasses.dataclass(frozen=True)
class Supervisor:
    """One ``runworkers`` of the drain: its ``--processes``, ``--threads`` and ``--mode``."""

    processes: int
    threads: int
    mode: str

    @property
    def lanes(self) -> int:
        return self.processes * self.threads

    def __str__(self) -> str:
        return f"--processes {self.processes} --threads {self.threads} --mode {self.mode}"


def supervisors(args: argparse.Namespace) -> list[Supervisor]:
    """``--supervisors`` (``PxT[:mode]``, comma-separated; the mode ``--mode``'s where
    not given), or the one of ``--processes``, ``--threads`` and ``--mode``."""
    if not args.supervisors:
        return [Supervisor(args.processes, args.threads, args.mode)]
    made = []
    for spec in args.supervisors.split(","):
        shape, _, mode = spec.strip().partition(":")
        processes, _, threads = shape.partition("x")
        made.append(Supervisor(int(processes), int(threads), mode or args.mode))
    return made


class Workers:
    """The drain's ``runworkers`` supervisors, side by side, each with its own log."""

    def __init__(self, args: argparse.Namespace, *, burst: bool, log: Path, env: dict) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        shapes = supervisors(args)
        self.logs = [
            log if len(shapes) == 1 else log.with_name(f"{log.stem}-{i}{log.suffix}")
            for i in range(len(shapes))
        ]
        self.processes = []
        for shape, path in zip(shapes, self.logs, strict=True):
            command = [
                args.python, "manage.py", "runworkers", "--processes", str(shape.processes),
                "--threads", str(shape.threads), "--mode", shape.mode, "--log-level", "INFO",
                *(["--burst"] if burst else []),
            ]  # fmt: skip
            with open(path, "w") as out:
                self.processes.append(
                    subprocess.Popen(
                        command,
                        cwd=PROJECT_DIR,
                        env={**database(args).env(), **env},
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )

    def poll(self) -> int | None:
        """None while any supervisor runs; else the first non-zero exit, or 0."""
        codes = [process.poll() for process in self.processes]
        if any(code is None for code in codes):
            return None
        return next((code for code in codes if code), 0)

    def terminate(self) -> None:
        for process in self.processes:
            process.terminate()

    def wait(self, timeout: float) -> None:
        for process in self.processes:
            process.wait(timeout)


def workers(
    args: argparse.Namespace, *, burst: bool, log: Path, env: dict[str, str] | None = None
) -> Workers:
    return Workers(args, burst=burst, log=log, env=env or {})


def server_counters(args: argparse.Namespace) -> tuple[float, int]:
    """The server's CPU seconds so far for the database (``BenchDatabase.sample``), and
    its transactions."""
    server = database(args)
    seen: dict[int, float] = {}
    server.sample(seen)
    return sum(seen.values()), server.transactions()


def claims(logs: list[Path]) -> tuple[int, int, int]:
    """Tasks claimed, claim statements made, and tasks claimed by a slot's hand-over
    alone, summed over the workers' last lines."""
    claimed = statements = handed = 0
    for log in logs:
        for match in CLAIMS.finditer(log.read_text()):
            claimed += int(match[1])
            statements += int(match[2])
            handed += int(match[3] or 0)
    return claimed, statements, handed


def drain(args: argparse.Namespace, batches: list, name: str) -> dict:
    """Enqueue ``batches`` in one transaction, drain them with burst workers, read the runs.

    With ``--started-first`` the workers run first (their sessions open, idle) and
    are stopped once every task has run."""
    fresh_database(args)
    log = LOGS / f"{name}.log"
    recorded = Runs(args, name)
    cpu_seen: dict[int, float] = {}
    measured_from = 0.0
    if args.started_first:
        process = workers(args, burst=False, log=log, env=recorded.env())
        wait_for_sessions(args, sum(shape.lanes for shape in supervisors(args)))
        drained = sum(len(calls) for _, calls in batches)
        expected = 0  # the runs recorded once the drain is over
        if args.warm_up:
            # The same tasks drained once first, not measured: every session
            # has run every form of round the measured drain runs.
            expected += drained
            enqueue_in_one_transaction(args, batches)
            while recorded.count() < expected:
                time.sleep(0.05)
        time.sleep(1)  # their first rounds (found nothing) are behind them
        measured_from = time.time()
        cpu_before = dict(cpu_seen)
        sample_backends(args, cpu_before)
        before_xacts = server_counters(args)[1]
        enqueue_in_one_transaction(args, batches)
        expected += drained
        while recorded.count() < expected:
            sample_backends(args, cpu_seen)
            time.sleep(0.05)
        after_xacts = server_counters(args)[1]
        process.terminate()
        process.wait(90)
        # Only what the backends spent from the enqueue on.
        cpu_seen = {pid: cpu - cpu_before.get(pid, 0.0) for pid, cpu in cpu_seen.items()}
    else:
        enqueue_in_one_transaction(args, batches)
        # Backends come and go with the workers: CPU read while they live (sampled),
        # less what a process that was there before had spent (MariaDB's server).
        cpu_before = {}
        sample_backends(args, cpu_before)
        before_xacts = server_counters(args)[1]
        process = workers(args, burst=True, log=log, env=recorded.env())
        while process.poll() is None:
            sample_backends(args, cpu_seen)
            time.sleep(0.05)
        after_xacts = server_counters(args)[1]
        cpu_seen = {pid: cpu - cpu_before.get(pid, 0.0) for pid, cpu in cpu_seen.items()}
    runs = recorded.read()
    if args.started_first:
        runs = [run for run in runs if run[2] >= measured_from]
    drop_database(args)
    claimed, statements, handed = claims(process.logs)
    return {
        "runs": runs,
        "server_cpu": sum(cpu_seen.values()),
        "xacts": after_xacts - before_xacts,
        "claimed": claimed,
        "claim_statements": statements,
        "handed_over": handed,
    }


def wait_for_sessions(args: argparse.Namespace, count: int, timeout: float = 60) -> None:
    """Until at least ``count`` sessions are open on the database."""
    deadline = time.monotonic() + timeout
    server = database(args)
    while time.monotonic() < deadline:
        if server.sessions() >= count:
            return
        time.sleep(0.1)
    raise SystemExit(f"the workers did not open {count} sessions in {timeout:.0f} s")


def sample_backends(args: argparse.Namespace, seen: dict[int, float]) -> None:
    database(args).sample(seen)


def deciles(values: list[float]) -> list[float]:
    cuts = statistics.quantiles(values, n=10)
    return [round(v, 2) for v in (values[0], cuts[0], cuts[4], cuts[8], values[-1])]


def mixed(args: argparse.Namespace) -> dict:
    limited = [[i % GROUPS, i, 0.04] for i in range(args.limited)]
    unlimited = [[i, 0.01] for i in range(args.unlimited)]
    both = drain(args, [["limited_sleep", limited], ["unlimited_sleep", unlimited]], "mixed")
    alone = drain(args, [["unlimited_sleep", unlimited]], "alone")
    runs = both["runs"]
    first = min(started for _, _, started, _ in runs)
    free = sorted(started - first for kind, _, started, _ in runs if kind == "free")
    first_alone = min(started for _, _, started, _ in alone["runs"])
    free_alone = sorted(started - first_alone for _, _, started, _ in alone["runs"])
    limited_runs = [(s, f) for kind, _, s, f in runs if kind != "free"]
    # While the backlog lasts: from the first limited start to the last.
    a = min(s for s, _ in limited_runs)
    b = max(s for s, _ in limited_runs)
    busy = sum(max(0.0, min(f, b) - max(s, a)) for s, f in limited_runs)
    tasks = len(runs)
    rate = (len(free) - 1) / (free[-1] - free[0])
    rate_alone = (len(free_alone) - 1) / (free_alone[-1] - free_alone[0])
    return {
        "tasks": tasks,
        "unlimited_start_deciles_s": deciles(free),
        "unlimited_start_deciles_alone_s": deciles(free_alone),
        "unlimited_rate": round(rate, 1),
        "unlimited_rate_alone": round(rate_alone, 1),
        "unlimited_rate_ratio": round(rate / rate_alone, 2),
        "limited_running_on_average": round(busy / (b - a), 2),
        "limited_allowed": GROUPS * PER_GROUP,
        "limited_rate": round(len(limited_runs) / (b - a), 1),
        "server_cpu_us_per_task": round(both["server_cpu"] / tasks * 1e6),
        "transactions_per_task": round(both["xacts"] / tasks, 2),
        "tasks_per_claim_statement": round(both["claimed"] / max(1, both["claim_statements"]), 2),
        "claimed_by_hand_over": both["handed_over"],
    }


def medians(runs: list[dict]) -> dict:
    """Each figure's median over ``runs`` (the machine's noise moves single runs by a
    third: docs/limits.md), with its range beside it; deciles decile by decile."""
    summary: dict = {"runs": len(runs)}
    for name, first in runs[0].items():
        values = [run[name] for run in runs]
        if isinstance(first, list):
            summary[name] = [statistics.median(column) for column in zip(*values, strict=True)]
        elif isinstance(first, int | float) and not isinstance(first, bool):
            summary[name] = statistics.median(values)
            summary[f"{name}_range"] = [min(values), max(values)]
    return summary


def hold(args: argparse.Namespace, batches: list, name: str) -> dict:
    """Workers serving ``batches`` once 15 tasks run: the server's cost over ``--window``."""
    fresh_database(args)
    log = LOGS / f"{name}.log"
    process = workers(args, burst=False, log=log)
    try:
        enqueue_in_one_transaction(args, batches)
        server = database(args)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            running = server.execute(
                "SELECT count(*) FROM django_rdbtasks_task WHERE status = 'RUNNING'"
            )[0][0]
            if running >= GROUPS * PER_GROUP:
                break
            time.sleep(0.1)
        time.sleep(2)  # the rounds that found the keys full are behind us
        cpu0, xacts0 = server_counters(args)
        time.sleep(args.window)
        cpu1, xacts1 = server_counters(args)
    finally:
        process.terminate()  # the holders are given back after the grace
        process.wait(90)
        drop_database(args)
    return {
        "server_cpu_ms_per_s": round((cpu1 - cpu0) / args.window * 1e3, 1),
        "transactions_per_s": round((xacts1 - xacts0) / args.window, 1),
    }


def full(args: argparse.Namespace) -> dict:
    seconds = args.window + 30
    holders = [[i % GROUPS, i, seconds] for i in range(GROUPS * PER_GROUP)]
    backlog = [[i % GROUPS, i, 0.04] for i in range(GROUPS * PER_GROUP, 1000)]
    keys_full = hold(args, [["limited_sleep", holders], ["limited_sleep", backlog]], "full")
    sleepers = [[i, seconds] for i in range(GROUPS * PER_GROUP)]
    idle = hold(args, [["unlimited_sleep", sleepers]], "idle")
    return {
        "keys_full": keys_full,
        "idle": idle,
        "cpu_ratio": round(
            keys_full["server_cpu_ms_per_s"] / max(idle["server_cpu_ms_per_s"], 0.1), 2
        ),
        "transactions_ratio": round(
            keys_full["transactions_per_s"] / max(idle["transactions_per_s"], 0.1), 2
        ),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.enqueue:
        enqueue(args)
        return 0
    shape = " + ".join(str(supervisor) for supervisor in supervisors(args))
    results: dict[str, dict] = {}
    if args.only in (None, "mixed"):
        runs = []
        for _ in range(args.repeat):
            runs.append(mixed(args))
            print(f"mixed ({shape}): {json.dumps(runs[-1])}", flush=True)
        results["mixed"] = runs[0] if len(runs) == 1 else medians(runs)
        if len(runs) > 1:
            print(f"mixed, medians of {len(runs)}: {json.dumps(results['mixed'])}", flush=True)
    if args.only in (None, "full"):
        results["full"] = full(args)
        print(f"full ({shape}): {json.dumps(results['full'])}", flush=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
