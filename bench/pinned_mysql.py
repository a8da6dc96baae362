"""Issue 43 on MariaDB/MySQL: the pinned load with a long transaction open, purge lag per interval.

PostgreSQL's ``bench/sustained.py --pinned`` beside InnoDB: the same producer
(``bulk_enqueue`` of a tenth of ``--rate`` every 0.1 s), ``runworkers
--processes N``, no-op tasks, in a clean, a pinned and a recovery phase. The
pin is a session in ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` (REPEATABLE
READ) that has read the task table and written a row of its own (so it has a
transaction id, as PostgreSQL's pin has an xid), then stays idle: InnoDB
cannot purge the undo of anything committed after its read view, and the
history list grows. Run from the repository root with the project's
virtualenv (it needs mysqlclient):

    .venv/bin/python bench/pinned_mysql.py --pinned 4 --rate 300

Every ``--interval`` seconds a row: enqueued/s, finished/s, the pickup
latency p50 / p99 (``started_at - enqueued_at`` of the tasks finished in the
interval), the ``bulk_enqueue`` call's p95, the history list length
(``information_schema.INNODB_METRICS`` ``trx_rseg_history_len``: the whole
server's, so another database's transactions count too), the task table's
tablespace (``INNODB_SYS_TABLESPACES``' file size: InnoDB never gives a file
back without a rebuild), unfinished rows, the oldest open transaction's age.
Exits 1 when one of issue 43's checks fails (bench/core/pinned_report.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import MySQLdb

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

from core.measure import percentile  # noqa: E402
from core.pinned_report import LIMIT, SIZE_TOLERANCE, Phase, ms, phase_of, within_limit  # noqa: E402
from core.procs import WorkerGroup  # noqa: E402
from sustained import ProducerLog, per_call  # noqa: E402
from systems.rdbtasks import QUIET, TABLE  # noqa: E402

PROJECT_DIR = BENCH_DIR / "rdbtasks_project"
SUSTAINED = BENCH_DIR / "sustained.py"
#: A row is read this long after its interval ends (the finishing transactions commit).
LAG = 1.0
PIN_TABLE = "bench_pin"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pinned", type=float, default=4.0, help="minutes the pin is held")
    parser.add_argument("--clean-minutes", type=float, default=2.0)
    parser.add_argument("--recovery-minutes", type=float, default=3.0)
    parser.add_argument("--no-pin", action="store_true", help="the same phases, nothing held")
    parser.add_argument("--rate", type=int, default=300, help="tasks enqueued per second")
    parser.add_argument("--processes", type=int, default=2, help="runworkers --processes")
    parser.add_argument("--worker-args", default="", help="more runworkers options")
    parser.add_argument("--keep", default="2min", help="RDBTASKS_RETENTION; 'none' for none")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds per row")
    parser.add_argument("--database", default="bench_pinned", help="dropped and created")
    parser.add_argument("--mysql-host", default="127.0.0.1")
    parser.add_argument("--mysql-port", type=int, default=3306)
    parser.add_argument("--mysql-user", default="root")
    parser.add_argument("--python", default=str(REPO_DIR / ".venv/bin/python"))
    parser.add_argument("--output", type=Path, help="JSON results (default bench/results/)")
    args = parser.parse_args(argv)
    phases = (args.clean_minutes, args.pinned, args.recovery_minutes)
    if min(phases) <= 0 or args.rate < 1 or args.interval <= 0:
        parser.error("the phases, --rate and --interval must be positive")
    for minutes in phases:
        if abs(minutes * 60 / args.interval - round(minutes * 60 / args.interval)) > 1e-6:
            parser.error("each phase must last a whole number of --interval")
    args.intervals = round(sum(phases) * 60 / args.interval)
    return args


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def connect(args: argparse.Namespace, database: str | None = None) -> Any:
    conn = MySQLdb.connect(
        host=args.mysql_host,
        port=args.mysql_port,
        user=args.mysql_user,
        password=os.environ.get("MYSQL_PWD", ""),
        **({"database": database} if database else {}),
    )
    conn.autocommit(True)
    return conn


def query(conn: Any, sql: str, params: tuple = ()) -> list[tuple]:
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())


def project_env(args: argparse.Namespace) -> dict[str, str]:
    env = {
        **os.environ,
        "BENCH_DB_ENGINE": "mysql",
        "BENCH_DB_NAME": args.database,
        "BENCH_DB_HOST": args.mysql_host,
        "BENCH_DB_PORT": str(args.mysql_port),
        "BENCH_DB_USER": args.mysql_user,
        "BENCH_DB_PASSWORD": os.environ.get("MYSQL_PWD", ""),
        "DJANGO_SETTINGS_MODULE": "settings",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(REPO_DIR),
    }
    if args.keep.lower() != "none":
        env["BENCH_RETENTION"] = args.keep
    return env


class MySQLPin:
    """A REPEATABLE READ read view with a transaction id, idle until released."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.conn: Any = None
        self.held_at: float | None = None
        self.released_at: float | None = None

    def hold(self) -> None:
        conn = connect(self.args, self.args.database)
        query(conn, "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        query(conn, "START TRANSACTION WITH CONSISTENT SNAPSHOT")
        query(conn, f"SELECT COUNT(*) FROM {TABLE}")
        query(conn, f"INSERT INTO {PIN_TABLE} (held_at) VALUES (NOW())")
        self.conn = conn
        self.held_at = time.time()

    def release(self) -> None:
        if self.conn is not None:
            self.conn.rollback()
            self.conn.close()
            self.conn = None
            self.released_at = time.time()


def read_row(
    conn: Any, args: argparse.Namespace, since: float, until: float, produced: ProducerLog
) -> dict[str, Any]:
    def utc(epoch: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(epoch, dt.UTC).replace(tzinfo=None)

    delays = [
        float(micro) / 1e6
        for (micro,) in query(
            conn,
            f"SELECT TIMESTAMPDIFF(MICROSECOND, enqueued_at, started_at) FROM {TABLE}"
            " WHERE finished_at >= %s AND finished_at < %s",
            (utc(since), utc(until)),
        )
    ]
    calls = produced.call_seconds(since, until)
    seconds = until - since
    ((history,),) = query(
        conn,
        "SELECT count FROM information_schema.INNODB_METRICS WHERE name = 'trx_rseg_history_len'",
    )
    space = query(
        conn,
        "SELECT file_size, allocated_size FROM information_schema.INNODB_SYS_TABLESPACES"
        " WHERE name = %s",
        (f"{args.database}/{TABLE}",),
    )
    ((unfinished,),) = query(
        conn, f"SELECT COUNT(*) FROM {TABLE} WHERE status IN ('READY', 'RUNNING')"
    )
    ((oldest,),) = query(
        conn,
        "SELECT MAX(TIMESTAMPDIFF(SECOND, trx_started, NOW())) FROM information_schema.INNODB_TRX",
    )
    mb = 2**20
    return {
        "seconds": seconds,
        "enqueued_per_second": (produced.enqueued_by(until) - produced.enqueued_by(since))
        / seconds,
        "finished": len(delays),
        "finished_per_second": len(delays) / seconds,
        "delay_p50_s": percentile(delays, 50) if delays else None,
        "delay_p99_s": percentile(delays, 99) if delays else None,
        "enqueue_calls": len(calls),
        "enqueue_call_p95_s": percentile(calls, 95) if calls else None,
        "history_list_length": int(history),
        "table_file_mb": space[0][0] / mb if space else None,
        "table_allocated_mb": space[0][1] / mb if space else None,
        "unfinished": int(unfinished),
        "oldest_transaction_s": None if oldest is None else int(oldest),
    }


def run(args: argparse.Namespace) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = BENCH_DIR / ".logs" / f"pinned-mysql-{stamp}"
    env = project_env(args)
    with connect(args) as admin:
        query(admin, f"DROP DATABASE IF EXISTS {args.database}")
        query(admin, f"CREATE DATABASE {args.database}")
        ((version,),) = query(admin, "SELECT VERSION()")
    subprocess.run(
        [args.python, "manage.py", "migrate", "--verbosity", "0"],
        cwd=PROJECT_DIR,
        env=env,
        check=True,
    )
    conn = connect(args, args.database)
    query(conn, f"CREATE TABLE {PIN_TABLE} (id INT AUTO_INCREMENT PRIMARY KEY, held_at DATETIME)")
    pin = None if args.no_pin else MySQLPin(args)
    title = describe(args, version)
    log(title)
    command = [
        args.python,
        "manage.py",
        "runworkers",
        "--processes",
        str(args.processes),
        *QUIET,
        *args.worker_args.split(),
    ]
    rows: list[dict[str, Any]] = []
    with WorkerGroup([command], cwd=PROJECT_DIR, env=env, log=logs / "workers.log") as group:
        producer = subprocess.Popen(
            [
                args.python,
                str(SUSTAINED),
                "--produce",
                "--rate",
                str(args.rate),
                "--seconds",
                str(args.intervals * args.interval + 2 * LAG),
            ],
            cwd=PROJECT_DIR,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert producer.stdout is not None
        produced = ProducerLog(producer.stdout)
        try:
            if not produced.first.wait(120) or not produced.points:
                raise RuntimeError("the producer did not start")
            started = produced.points[0][0]
            hold_at = started + args.clean_minutes * 60
            release_at = hold_at + args.pinned * 60
            actions = (
                []
                if pin is None
                else [(hold_at, "held", pin.hold), (release_at, "released", pin.release)]
            )
            for k in range(1, args.intervals + 1):
                since, until = started + (k - 1) * args.interval, started + k * args.interval
                while actions and actions[0][0] < until + LAG:
                    at, what, action = actions.pop(0)
                    time.sleep(max(0.0, at - time.time()))
                    action()
                    log(f"pin {what}")
                time.sleep(max(0.0, until + LAG - time.time()))
                if not group.running():
                    raise RuntimeError(f"runworkers exited; see {group.log_path}")
                row = {"from_s": since - started, **read_row(conn, args, since, until, produced)}
                phase = phase_of(row["from_s"], args.clean_minutes * 60, args.pinned * 60)
                row["phase"] = phase.value
                row["pin_held"] = phase is Phase.PINNED and pin is not None
                rows.append(row)
                log(
                    f"{row['from_s']:5.0f} s {phase.value}: finished "
                    f"{row['finished_per_second']:,.0f}/s, pickup p50/p99 "
                    f"{ms(row['delay_p50_s'])}/{ms(row['delay_p99_s'])} ms, enqueue p95 "
                    f"{ms(row['enqueue_call_p95_s'])} ms, history {row['history_list_length']:,}"
                )
            producer.wait(60)
        finally:
            if pin is not None:
                pin.release()
            if producer.poll() is None:
                producer.terminate()
                producer.wait(30)
        produced.join(10)
    conn.close()
    verdict = judge(rows, args.rate)
    print()
    print(title)
    print()
    print(render(rows))
    print()
    print(render_verdict(verdict))
    output = args.output or BENCH_DIR / "results" / f"pinned-mysql-{stamp}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if not isinstance(v, Path)}
    output.write_text(
        json.dumps(
            {
                "title": title,
                "server_version": version,
                "config": config,
                "producer": produced.summary,
                "intervals": rows,
                "verdict": verdict,
            },
            indent=2,
        )
    )
    log(f"results in {output}; logs in {logs}")
    return 0 if verdict["passed"] else 1


def describe(args: argparse.Namespace, version: str) -> str:
    held = (
        "nothing held (--no-pin)"
        if args.no_pin
        else "a REPEATABLE READ consistent snapshot with a transaction id, idle"
    )
    return (
        f"Pinned load on MariaDB/MySQL {version} (issue 43): {args.rate:,} tasks/s "
        f"(bulk_enqueue of {per_call(args.rate)} every 0.1 s), runworkers --processes "
        f"{args.processes}, no-op tasks, retention {args.keep}; {args.clean_minutes:g} min clean, "
        f"{args.pinned:g} min pinned ({held}), {args.recovery_minutes:g} min recovery; "
        f"a row every {args.interval:g} s"
    )


def judge(rows: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    def part(phase: Phase) -> list[dict[str, Any]]:
        return [row for row in rows if row["phase"] == phase.value]

    def values(part: list[dict[str, Any]], key: str) -> list[float]:
        return [row[key] for row in part if row[key] is not None]

    clean, pinned, recovery = part(Phase.CLEAN), part(Phase.PINNED), part(Phase.RECOVERY)
    checks = [
        within_limit(
            "pickup p99",
            "worst pinned interval's pickup p99 over the clean intervals' median",
            max(values(pinned, "delay_p99_s"), default=None),
            statistics.median(values(clean, "delay_p99_s") or [0]) or None,
        ),
        within_limit(
            "enqueue p95",
            "worst pinned interval's bulk_enqueue call p95 over the clean intervals' median",
            max(values(pinned, "enqueue_call_p95_s"), default=None),
            statistics.median(values(clean, "enqueue_call_p95_s") or [0]) or None,
        ),
    ]
    clean_mb = max(values(clean, "table_file_mb"), default=None)
    end_mb = recovery[-1]["table_file_mb"] if recovery else None
    ratio = end_mb / clean_mb if end_mb is not None and clean_mb else None
    checks.append(
        {
            "name": "back to clean size",
            "description": f"task table's tablespace at the end over its largest clean size: "
            f"{'-' if ratio is None else f'{ratio:.2f}'} (at most {1 + SIZE_TOLERANCE:.2f})",
            "ratio": ratio,
            "passed": ratio is not None and ratio <= 1 + SIZE_TOLERANCE,
        }
    )
    finished = statistics.fmean(values(clean, "finished_per_second") or [0])
    checks.append(
        {
            "name": "keeps up when clean",
            "description": f"finished/s in the clean phase {finished:,.0f} of {rate:,.0f}/s "
            "(at least 95 %)",
            "passed": finished >= 0.95 * rate,
        }
    )
    history = {
        phase.value: max(values(part(phase), "history_list_length"), default=None)
        for phase in Phase
    }
    return {
        "passed": all(check["passed"] for check in checks),
        "limit": LIMIT,
        "history_list_length_max": history,
        "history_list_length_end": rows[-1]["history_list_length"] if rows else None,
        "checks": checks,
    }


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| from (s) | phase | enqueued/s | finished/s | pickup p50 / p99 (ms) "
        "| enqueue call p95 (ms) | history list length | task table file (MB) | unfinished "
        "| oldest transaction (s) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        phase = row["phase"] + (" (held)" if row["pin_held"] else "")
        size = row["table_file_mb"]
        lines.append(
            f"| {row['from_s']:.0f} | {phase} | {row['enqueued_per_second']:,.0f} "
            f"| {row['finished_per_second']:,.0f} "
            f"| {ms(row['delay_p50_s'])} / {ms(row['delay_p99_s'])} "
            f"| {ms(row['enqueue_call_p95_s'])} | {row['history_list_length']:,} "
            f"| {'-' if size is None else f'{size:.1f}'} | {row['unfinished']:,} "
            f"| {'-' if row['oldest_transaction_s'] is None else row['oldest_transaction_s']} |"
        )
    return "\n".join(lines)


def render_verdict(verdict: dict[str, Any]) -> str:
    lines = [f"Issue 43's checks: {'PASSED' if verdict['passed'] else 'FAILED'}", ""]
    for check in verdict["checks"]:
        lines.append(
            f"- {'ok' if check['passed'] else 'FAILED'}: {check['name']}: {check['description']}"
        )
    history = verdict["history_list_length_max"]
    lines.append(
        "- history list length, largest per phase: "
        + ", ".join(f"{phase} {value:,}" for phase, value in history.items() if value is not None)
        + f"; at the end {verdict['history_list_length_end']:,}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
