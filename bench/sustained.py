"""Sustained load: a producer at a fixed rate, ``runworkers`` draining, retention pruning.

A burst drain shows the peak; this shows whether the peak holds for an hour
while the task table's dead rows, its indexes, its statistics and autovacuum
change under the workers, with retention deleting finished rows as a user
would have it. Run from the repository root with the project's virtualenv,
on a server with autovacuum on (bench/README.md: a cluster of your own):

    .venv/bin/python bench/run.py --sustained 30 --pg-port 5451   # 70 % of the peak, 30 min
    .venv/bin/python bench/sustained.py --minutes 10 --rate 4000 --keep 2min

1. A fresh database (``--database``), migrated.
2. Unless ``--rate`` is given, the peak: ``--peak-tasks`` no-op tasks
   bulk-enqueued, drained by ``runworkers --processes N --burst`` (with
   ``--worker-args``), timed; the rate is ``--share`` of it. The table is
   then emptied and its statistics reset.
3. ``runworkers --processes N`` (with ``--worker-args``; its scheduler applies
   ``RDBTASKS_RETENTION``, every status kept ``--keep``) and one producer
   process that ``bulk_enqueue``-s the rate on an absolute timetable, for
   ``--minutes``.
4. Every ``--probe`` seconds the queue's depth; every ``--interval`` seconds a
   row (bench/core/steady_sample.py); at the end the verdict
   (bench/core/steady_verdict.py), the tables, and the JSON.

With ``--pinned MINUTES`` (issue 43; also ``run.py --pinned``) the load runs
in three phases, clean, pinned and recovery (``--clean-minutes``,
``--recovery-minutes``), and the harness holds a REPEATABLE READ snapshot with
an xid through the pinned one (bench/core/pin.py); the rows then say what
issue 43 asks (the enqueue call's p95, the task table's own dead tuples and
size) and bench/core/pinned_report.py judges them instead of the thirds.

Exits 1 when the verdict fails.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import psycopg

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path.insert(0, str(REPO_DIR))
sys.path.insert(0, str(BENCH_DIR))

from core import measure  # noqa: E402
from core.pg import PgServer, settle, truncate  # noqa: E402
from core.pin import Pin  # noqa: E402
from core.pinned_report import (  # noqa: E402
    Phase,
    judge_pinned,
    phase_of,
    render_phases,
    render_pinned,
    render_pinned_verdict,
)
from core.procs import WorkerGroup  # noqa: E402
from core.steady_sample import TABLE, TABLES, Sampler, server_settings  # noqa: E402
from core.steady_verdict import (  # noqa: E402
    judge,
    render_indexes,
    render_intervals,
    render_verdict,
)
from systems.base import Context  # noqa: E402
from systems.rdbtasks import RDBTasks  # noqa: E402

from django_rdbtasks.durations import parse_age  # noqa: E402

PROJECT_DIR = BENCH_DIR / "rdbtasks_project"
#: An interval's row is read this long after it ends, so that the transactions
#: that finished tasks inside it have committed.
LAG = 1.0
#: The producer enqueues at most this many times a second.
TICKS_PER_SECOND = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the load")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--rate", type=int, help="tasks enqueued per second (no peak measured)")
    load.add_argument(
        "--share",
        type=float,
        default=0.7,
        help="the rate as a share of the peak measured first (default: %(default)s)",
    )
    parser.add_argument(
        "--peak-tasks",
        type=int,
        default=30_000,
        help="tasks of the burst drain that measures the peak (default: %(default)s)",
    )
    parser.add_argument("--processes", type=int, default=2, help="runworkers --processes")
    parser.add_argument(
        "--worker-args",
        default="",
        help="more runworkers options, for the peak and the load (e.g. '--mode skip-locked')",
    )
    parser.add_argument(
        "--keep",
        default="2min",
        help="RDBTASKS_RETENTION for every finished status: how long finished tasks are "
        "kept (default: %(default)s); 'none' for no retention",
    )
    pinned = parser.add_argument_group(
        "pinned (issue 43)",
        "--pinned MINUTES: a clean phase, then the harness holds a snapshot and an xid "
        "(idle in transaction) for MINUTES, then a recovery phase; judged as issue 43 asks "
        "(bench/core/pinned_report.py). --minutes and the thirds' verdict do not apply.",
    )
    pinned.add_argument(
        "--pinned", type=float, metavar="MINUTES", help="hold a REPEATABLE READ snapshot this long"
    )
    pinned.add_argument(
        "--clean-minutes", type=float, default=2.0, help="before the pin (default: %(default)s)"
    )
    pinned.add_argument(
        "--recovery-minutes", type=float, default=3.0, help="after it (default: %(default)s)"
    )
    pinned.add_argument(
        "--pin-readers",
        type=int,
        default=0,
        help="sessions that also hold a REPEATABLE READ snapshot and scan the task table "
        "(default: %(default)s)",
    )
    pinned.add_argument(
        "--pin-read-every",
        type=float,
        default=5.0,
        help="seconds between a reader's scans (default: %(default)s)",
    )
    pinned.add_argument(
        "--no-pin",
        action="store_true",
        help="the same phases with nothing held: the clean run to read a pinned one against",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=None,
        help="seconds per row (default: 60; 10 with --pinned)",
    )
    parser.add_argument("--probe", type=float, default=5.0, help="seconds between depth probes")
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds not judged (default: --keep plus 2 minutes, the table filling up to "
        "its steady size; 60 without retention)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.10,
        help="how far the last third may drift from the first (middle, for the size)",
    )
    parser.add_argument(
        "--delay-slack-ms",
        type=float,
        default=0.0,
        help="a start delay p50 this close to the first third's passes whatever its ratio",
    )
    parser.add_argument(
        "--floor",
        type=float,
        default=0.8,
        help="least share of its enqueues an interval must finish while work waits",
    )
    parser.add_argument(
        "--max-backlog",
        type=int,
        default=None,
        help="most READY rows due at the end (default: 10 seconds of production)",
    )
    parser.add_argument("--database", default="bench_sustained", help="dropped and created")
    parser.add_argument("--output", type=Path, help="JSON results (default bench/results/)")
    parser.add_argument("--pg-host", default=os.environ.get("PGHOST", "127.0.0.1"))
    parser.add_argument("--pg-port", type=int, default=int(os.environ.get("PGPORT", "5432")))
    parser.add_argument("--pg-user", default=os.environ.get("PGUSER", "postgres"))
    parser.add_argument("--python", default=str(REPO_DIR / ".venv/bin/python"))
    parser.add_argument(
        "--allow-autovacuum-off",
        action="store_true",
        help="run even where the server has autovacuum off (a CI server, say)",
    )
    # Internal: the producer process.
    parser.add_argument("--produce", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.produce:
        return args
    if args.interval is None:
        args.interval = 10.0 if args.pinned is not None else 60.0
    if args.pinned is not None:
        phases = (args.clean_minutes, args.pinned, args.recovery_minutes)
        if min(phases) <= 0 or args.pin_readers < 0 or args.pin_read_every <= 0:
            parser.error("--pinned, --clean-minutes, --recovery-minutes must be positive")
        for minutes in phases:
            if abs(minutes * 60 / args.interval - round(minutes * 60 / args.interval)) > 1e-6:
                parser.error("each phase must last a whole number of --interval")
        args.minutes = sum(phases)
    elif args.no_pin:
        parser.error("--no-pin goes with --pinned MINUTES")
    if args.interval <= 0 or args.probe <= 0 or args.minutes <= 0:
        parser.error("--minutes, --interval and --probe must be positive")
    args.intervals = math.floor(args.minutes * 60 / args.interval + 1e-9)
    if args.intervals < 1:
        parser.error("--minutes must cover at least one --interval")
    if args.keep.lower() == "none":
        args.keep_seconds = None
    else:
        try:
            args.keep_seconds = parse_age(args.keep).total_seconds()
        except ValueError as exc:
            parser.error(f"--keep: {exc}")
        # A row is counted in its interval's row, read LAG after the interval
        # ends: retention must not have deleted it by then.
        if args.keep_seconds <= args.interval + LAG + 5:
            parser.error("--keep must be longer than --interval by more than 6 seconds")
    if args.warmup is None:
        # Retention first deletes once the oldest tasks are --keep old, and
        # applies every minute: until then the table only grows.
        args.warmup = 60.0 if args.keep_seconds is None else args.keep_seconds + 120.0
    if args.rate is not None and args.rate < 1:
        parser.error("--rate must be at least 1")
    if args.rate is None and not 0 < args.share <= 2:
        parser.error("--share must be above 0 (and at most 2)")
    if args.rate is None and args.processes < 1:
        parser.error("a peak needs workers: --processes 0 only with --rate")
    return args


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- the producer (a process of its own, so its CPU is not the harness's) ----------------


def per_call(rate: int) -> int:
    """Tasks per ``bulk_enqueue`` call: the rate in ``TICKS_PER_SECOND`` calls."""
    return max(1, round(rate / TICKS_PER_SECOND))


def produce(args: argparse.Namespace) -> None:
    """Enqueue ``--rate`` tasks a second for ``--seconds``; print a line per call."""
    sys.path.insert(0, str(PROJECT_DIR))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
    import django

    django.setup()
    from benchapp import tasks

    from django_rdbtasks.backend import bulk_enqueue

    batch = per_call(args.rate)
    period = batch / args.rate
    start = time.time()
    report(start, 0)
    calls = 0
    behind = 0.0
    while time.time() - start < args.seconds:
        began = time.perf_counter()
        bulk_enqueue(tasks.noop, [((), {})] * batch, batch_size=batch)
        took = time.perf_counter() - began
        calls += 1
        report(time.time(), calls * batch, took)
        pause = start + calls * period - time.time()
        if pause > 0:
            time.sleep(pause)
        else:
            behind = max(behind, -pause)
    print(json.dumps({"enqueued": calls * batch, "most_behind_seconds": behind}), flush=True)


def report(at: float, enqueued: int, call_seconds: float | None = None) -> None:
    line: dict[str, float] = {"t": at, "n": enqueued}
    if call_seconds is not None:
        line["call"] = call_seconds
    print(json.dumps(line), flush=True)


class ProducerLog:
    """The producer's lines as they come: (time, tasks enqueued so far), and its summary.

    A line after a call also says how long the ``bulk_enqueue`` call took.
    """

    def __init__(self, stream: IO[str]) -> None:
        self.points: list[tuple[float, int]] = []
        #: (when the call returned, how long it took), seconds.
        self.calls: list[tuple[float, float]] = []
        self.summary: dict[str, Any] = {}
        self.first = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if "t" in item:
                self.points.append((item["t"], item["n"]))
                if "call" in item:
                    self.calls.append((item["t"], item["call"]))
                self.first.set()
            else:
                self.summary = item
        self.first.set()  # ended: nobody waits for a first line that will not come

    def enqueued_by(self, at: float) -> int:
        """Tasks enqueued (committed) by the time ``at``."""
        count = 0
        for when, n in self.points:  # appended in order by one thread
            if when > at:
                break
            count = n
        return count

    def call_seconds(self, since: float, until: float) -> list[float]:
        """How long each ``bulk_enqueue`` call that returned in ``[since, until)`` took."""
        return [took for when, took in list(self.calls) if since <= when < until]

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


# -- the harness ---------------------------------------------------------------------


def make_system(args: argparse.Namespace, stamp: str) -> RDBTasks:
    server = PgServer(
        host=args.pg_host,
        port=args.pg_port,
        user=args.pg_user,
        password=os.environ.get("PGPASSWORD", ""),
    )
    context = Context(
        server=server,
        envs_dir=BENCH_DIR / ".envs",
        logs_dir=BENCH_DIR / ".logs" / f"sustained-{stamp}",
        options={"rdbtasks_python": args.python, "rdbtasks_worker_args": args.worker_args},
    )
    system = RDBTasks(context)
    # The run's own database, so as not to touch run.py's bench_rdbtasks.
    system.database = args.database
    system.prepare_env()
    return system


def recreate_database(args: argparse.Namespace, system: RDBTasks) -> None:
    server = system.context.server
    with server.connect("postgres") as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
        if row is not None and row[0] != "on" and not args.allow_autovacuum_off:
            # A queue table under sustained load lives by autovacuum: without
            # it the dead rows only grow, and that is all a run would show.
            sys.exit(
                f"{args.pg_host}:{args.pg_port} runs with autovacuum off: run on a server "
                "with its defaults (bench/README.md: pg_createcluster 15 sustained -p 5451, "
                "then --pg-port 5451), or pass --allow-autovacuum-off"
            )
    server.recreate_database(args.database)
    system.create_schema()


def measure_peak(
    args: argparse.Namespace, system: RDBTasks, conn: psycopg.Connection
) -> dict[str, Any]:
    """The burst drain's rate from its first claim to its last finish (database clock).

    The harness's own timing includes starting the processes (a second of a
    drain of a few seconds), which the sustained load does not pay again.
    """
    log(f"peak: {args.peak_tasks:,} tasks, runworkers --processes {args.processes} --burst")
    drain = measure.measure_drain(
        system,
        conn,
        tasks=args.peak_tasks,
        workers=args.processes,
        chunk=1000,
        log=system.context.logs_dir / "peak.log",
    )
    row = conn.execute(
        f"SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at))::float8"
        f" FROM {TABLE} WHERE status = 'SUCCESSFUL'"
    ).fetchone()
    assert row is not None
    done, span = row
    peak = {**drain.as_dict(), "span_seconds": span, "rate": done / span}
    log(
        f"peak: {peak['rate']:,.0f} tasks/s from the first claim to the last finish"
        f" ({drain.rate:,.0f}/s with the processes' start)"
    )
    return peak


def empty_table(conn: psycopg.Connection) -> None:
    """Start the load from an empty table, and its counters (autovacuum's) from zero."""
    truncate(conn, TABLES)
    for table in TABLES:
        conn.execute("SELECT pg_stat_reset_single_table_counters(%s::regclass)", [table])
    settle(conn, TABLES)


def start_producer(args: argparse.Namespace, system: RDBTasks, rate: int) -> subprocess.Popen:
    seconds = args.intervals * args.interval + 2 * LAG  # past the last row's reading
    return subprocess.Popen(
        [
            system.interpreter,
            str(Path(__file__).resolve()),
            "--produce",
            "--rate",
            str(rate),
            "--seconds",
            str(seconds),
        ],
        cwd=PROJECT_DIR,
        env={**system.env(), "PYTHONPATH": str(REPO_DIR)},
        stdout=subprocess.PIPE,
        text=True,
    )


def sample_load(
    args: argparse.Namespace,
    conn: psycopg.Connection,
    group: WorkerGroup,
    producer: subprocess.Popen,
    produced: ProducerLog,
    pin: Pin | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """The interval rows, from when the producer's first call was about to start.

    With ``--pinned``, ``pin`` is held from the end of the clean phase to the
    start of the recovery phase (unless ``--no-pin``: the same phases, nothing
    held).
    """
    if not produced.first.wait(120) or not produced.points:
        raise RuntimeError("the producer did not start")
    started = produced.points[0][0]
    actions: list[tuple[float, str, Callable[[], None]]] = []
    if pin is not None:
        hold_at = started + args.clean_minutes * 60
        actions = [
            (hold_at, "pin held", pin.hold),
            (hold_at + args.pinned * 60, "pin released", pin.release),
        ]
    sampler = Sampler(conn, workers_session=group.processes[0].pid)
    sampler.start()
    rows: list[dict[str, Any]] = []
    lag = min(LAG, args.interval / 4)
    next_probe = started + args.probe
    for k in range(1, args.intervals + 1):
        since, until = started + (k - 1) * args.interval, started + k * args.interval
        # Probes go on to the reading, a little after the interval's end.
        while True:
            if not group.running():
                raise RuntimeError(f"runworkers exited; see {group.log_path}")
            if producer.poll() is not None and producer.returncode != 0:
                raise RuntimeError(f"the producer exited with {producer.returncode}")
            wake = min(next_probe, until + lag, *(at for at, _, _ in actions[:1]))
            time.sleep(max(0.0, wake - time.time()))
            if actions and wake == actions[0][0]:
                _, what, action = actions.pop(0)
                action()
                log(what)
            elif wake == next_probe:
                sampler.probe()
                next_probe += args.probe
            else:
                break
        enqueued = produced.enqueued_by(until) - produced.enqueued_by(since)
        row = {"from_s": since - started, **sampler.interval(since, until, enqueued)}
        calls = produced.call_seconds(since, until)
        row["enqueue_calls"] = len(calls)
        row["enqueue_call_p50_s"] = measure.percentile(calls, 50) if calls else None
        row["enqueue_call_p95_s"] = measure.percentile(calls, 95) if calls else None
        if args.pinned is not None:
            phase = phase_of(row["from_s"], args.clean_minutes * 60, args.pinned * 60)
            row["phase"] = phase.value
            row["pin_held"] = phase is Phase.PINNED and pin is not None
        rows.append(row)
        log(
            f"{row['from_s']:6.0f} s: enqueued {row['enqueued_per_second']:7,.0f}/s, "
            f"finished {row['finished_per_second']:7,.0f}/s, depth {row['depth_max']:,}, "
            f"delay p50 {fmt_ms(row['delay_p50_s'])}, table {row['total_mb']:,.0f} MB, "
            f"dead {row['dead_tuples']:,}, pruned {row['pruned_per_second']:,.0f}/s"
            + (
                f"; {row['phase']}: delay p99 {fmt_ms(row['delay_p99_s'])}, enqueue call p95 "
                f"{fmt_ms(row['enqueue_call_p95_s'])}, task table dead "
                f"{row['hot_table']['dead_tuples']:,}, "
                f"{row['hot_table']['heap_mb'] + row['hot_table']['indexes_mb']:.1f} MB"
                if "phase" in row
                else ""
            )
        )
    return rows, started


def fmt_ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def describe(args: argparse.Namespace, rate: int, peak: dict[str, Any] | None) -> str:
    keep = "no retention" if args.keep_seconds is None else f"RDBTASKS_RETENTION {args.keep}"
    source = f"{args.share:.0%} of a peak of {peak['rate']:,.0f}/s" if peak else "--rate"
    flags = f" {args.worker_args}" if args.worker_args else " (no other flags)"
    return (
        f"Sustained load: {rate:,} tasks/s ({source}) for {args.minutes:g} min, "
        f"runworkers --processes {args.processes}{flags}, {keep} for every finished status; "
        f"a row every {args.interval:g} s, the first {args.warmup:g} s not judged"
    )


def run(args: argparse.Namespace) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    system = make_system(args, stamp)
    load_before = os.getloadavg()
    log(f"creating {args.database} (load average {load_before[0]:.1f})")
    recreate_database(args, system)
    server = system.context.server
    with server.connect(args.database) as conn:
        settings = server_settings(conn)
        peak = None
        rate = args.rate
        if rate is None:
            peak = measure_peak(args, system, conn)
            rate = max(1, round(args.share * peak["rate"]))
        empty_table(conn)
        keep = {} if args.keep_seconds is None else {"BENCH_RETENTION": args.keep}
        log(describe(args, rate, peak) if args.pinned is None else describe_pinned(args, rate))
        commands = system.idle_worker_commands(args.processes)
        group = WorkerGroup(
            commands,
            cwd=system.project_dir,
            env={**system.env(), **keep},
            log=system.context.logs_dir / "workers.log",
        )
        pin = (
            Pin(server, args.database, readers=args.pin_readers, read_every=args.pin_read_every)
            if args.pinned is not None and not args.no_pin
            else None
        )
        with group:
            producer = start_producer(args, system, rate)
            assert producer.stdout is not None
            produced = ProducerLog(producer.stdout)
            try:
                rows, started = sample_load(args, conn, group, producer, produced, pin)
                producer.wait(60)
            finally:
                if pin is not None:
                    pin.release()
                if producer.poll() is None:
                    producer.terminate()
                    producer.wait(30)
            produced.join(10)
    if args.pinned is not None:
        return report_pinned(args, stamp, system, rate, rows, started, pin, settings, produced)
    max_backlog = args.max_backlog if args.max_backlog is not None else rate * 10
    verdict = judge(
        rows,
        warmup=args.warmup,
        rate=rate,
        tolerance=args.tolerance,
        delay_slack_s=args.delay_slack_ms / 1000,
        floor=args.floor,
        max_backlog=max_backlog,
    )
    title = describe(args, rate, peak)
    print()
    print(title)
    print()
    print(render_intervals(rows, started))
    print()
    print("Each index's size (MB):")
    print()
    print(render_indexes(rows))
    print()
    print(render_verdict(verdict))
    output = args.output or BENCH_DIR / "results" / f"sustained-{stamp}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(
        json.dumps(
            {
                "title": title,
                "started_at": started,
                "rate": rate,
                "share": None if args.rate is not None else args.share,
                "peak": peak,
                "processes": args.processes,
                "worker_commands": commands,
                "retention": None if args.keep_seconds is None else args.keep,
                "config": {
                    key: value
                    for key, value in vars(args).items()
                    if key not in ("produce", "seconds") and not isinstance(value, Path)
                },
                "server": settings,
                "producer": produced.summary,
                "intervals": rows,
                "verdict": verdict,
                "load_average_before": load_before,
                "load_average_after": os.getloadavg(),
            },
            indent=2,
        )
    )
    log(f"producer: {produced.summary}; results in {output}; logs in {system.context.logs_dir}")
    return 0 if verdict["passed"] else 1


def describe_pinned(args: argparse.Namespace, rate: int) -> str:
    held = (
        "nothing held (--no-pin: the clean run)"
        if args.no_pin
        else "a REPEATABLE READ transaction with an xid idle in transaction"
        + (
            f" and {args.pin_readers} REPEATABLE READ readers scanning the task table every "
            f"{args.pin_read_every:g} s"
            if args.pin_readers
            else ""
        )
    )
    keep = "no retention" if args.keep_seconds is None else f"RDBTASKS_RETENTION {args.keep}"
    flags = f" {args.worker_args}" if args.worker_args else ""
    return (
        f"Pinned load (issue 43): {rate:,} tasks/s (bulk_enqueue of {per_call(rate)} every "
        f"{per_call(rate) / rate:.2g} s), runworkers --processes {args.processes}{flags}, "
        f"no-op tasks, {keep}; {args.clean_minutes:g} min clean, {args.pinned:g} min pinned "
        f"({held}), {args.recovery_minutes:g} min recovery; a row every {args.interval:g} s"
    )


def report_pinned(
    args: argparse.Namespace,
    stamp: str,
    system: RDBTasks,
    rate: int,
    rows: list[dict[str, Any]],
    started: float,
    pin: Pin | None,
    settings: dict[str, Any],
    produced: ProducerLog,
) -> int:
    verdict = judge_pinned(rows, rate=rate)
    title = describe_pinned(args, rate)
    print()
    print(title)
    print()
    print(render_pinned(rows))
    print()
    print(render_phases(rows))
    print()
    print(render_pinned_verdict(verdict))
    output = args.output or BENCH_DIR / "results" / f"pinned-{stamp}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(
        json.dumps(
            {
                "title": title,
                "started_at": started,
                "rate": rate,
                "processes": args.processes,
                "retention": None if args.keep_seconds is None else args.keep,
                "pin": None if pin is None else pin.as_dict(),
                "config": {
                    key: value
                    for key, value in vars(args).items()
                    if key not in ("produce", "seconds") and not isinstance(value, Path)
                },
                "server": settings,
                "producer": produced.summary,
                "intervals": rows,
                "verdict": verdict,
                "load_average_after": os.getloadavg(),
            },
            indent=2,
        )
    )
    log(f"producer: {produced.summary}; results in {output}; logs in {system.context.logs_dir}")
    if pin is not None and pin.as_dict()["errors"]:
        log(f"WARNING: the pin's readers failed: {pin.as_dict()['errors']}")
    return 0 if verdict["passed"] else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.produce:
        produce(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
