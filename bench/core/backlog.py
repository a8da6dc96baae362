"""``run.py --backlog``: does a drain or an enqueue cost more when the table is big?

Two databases side by side, the same schema: A with an empty task table, B
with ``--backlog-rows`` finished rows (1,000,000) and ``--backlog-future``
scheduled ones (100,000: READY, due an hour from now, as a table of deferred
tasks holds). Each turn, in one database: ``--single`` tasks enqueued one per
transaction, the rest of ``--tasks`` in bulk calls of ``--chunk``, then
``runworkers --processes W --burst`` drains them, each of the three timed;
then the turn's rows are deleted and the table vacuumed, analyzed and
checkpointed, so that the next turn finds it as before. The turns go A B B A
A B ... (``--backlog-turns`` of each), so that neither side always comes first
after the other. The figures are medians; B over A for each, with a verdict:
within ``--backlog-tolerance`` (10 %) of the empty table, or not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import psycopg
from systems.base import Context
from systems.rdbtasks import FINISHED_TABLE, TABLE, RDBTasks, ready_sources

from .measure import enqueue_bulk, percentile, time_drain, wait_for_probes
from .pg import CREATE_STARTED_TABLE, PgServer, settle
from .procs import WorkerGroup
from .server_cost import Reading, ServerMeter

#: What is measured in every turn: (label, which way is better, judged). The
#: verdict is on what the server spends per task (the CPU of all its processes,
#: from /proc): the index and heap work that could grow with the table is the
#: server's, and CPU time moves far less than a rate on a shared machine, where
#: a commit's wait alone moved the one-per-transaction rate tenfold between turns.
FIGURES = {
    "drain_server_cpu_us_per_task": ("drain, server CPU µs/task", "lower", True),
    "drain_worker_cpu_us_per_task": ("drain, workers' CPU µs/task", "lower", False),
    "drain_wal_bytes_per_task": ("drain, WAL bytes/task", "lower", False),
    "drain_fpi_per_1000_tasks": ("drain, full-page images per 1,000 tasks", "lower", False),
    "drain_per_second": ("drain, tasks/s, first claim to last finish", "higher", False),
    "drain_wall_per_second": ("drain, tasks/s, processes' start included", "higher", False),
    "single_server_cpu_us_per_task": (
        "enqueue one per transaction, server CPU µs/task",
        "lower",
        True,
    ),
    "single_wal_bytes_per_task": ("enqueue one per transaction, WAL bytes/task", "lower", False),
    "single_fpi_per_1000_tasks": (
        "enqueue one per transaction, full-page images per 1,000 tasks",
        "lower",
        False,
    ),
    "single_per_second": ("enqueue one per transaction, tasks/s", "higher", False),
    "bulk_server_cpu_us_per_task": ("enqueue in bulk, server CPU µs/task", "lower", True),
    "bulk_wal_bytes_per_task": ("enqueue in bulk, WAL bytes/task", "lower", False),
    "bulk_fpi_per_1000_tasks": (
        "enqueue in bulk, full-page images per 1,000 tasks",
        "lower",
        False,
    ),
    "bulk_per_second": ("enqueue in bulk, tasks/s", "higher", False),
    "trickle_server_cpu_us_per_task": ("trickle, server CPU µs/task", "lower", True),
    "trickle_p50_ms": ("trickle, start delay p50 ms", "lower", False),
    "trickle_p99_ms": ("trickle, start delay p99 ms", "lower", False),
}

# Counted by a range of the READY indexes (queue, priority, run_after) that ends at
# now: the scheduled rows lie beyond it, so polling B costs what polling A does.
DUE_DEFAULT = " AND queue_name = 'default' AND priority = 0 AND run_after <= now()"
#: The task table and the finished rows' (which a DELETE of the first reaches
#: too; a VACUUM or ANALYZE does not).
TABLES = [TABLE, FINISHED_TABLE]
UNFINISHED = (*ready_sources(DUE_DEFAULT), f"{TABLE} WHERE status = 'RUNNING'")


NIL = "00000000-0000-0000-0000-000000000000"


class Side(RDBTasks):
    """django-rdbtasks in one of the two databases."""

    unfinished = UNFINISHED

    def __init__(self, context: Context, name: str, database: str, worker_args: list[str]):
        super().__init__(context, name, worker_args)
        self.database = database
        self.baseline_max_id = NIL  # rows keyed above it are a turn's
        #: ``--backlog-lived-in``: the turns' rows stay, finished, as a table in
        #: use keeps them (until retention): the next turn meets the free space
        #: their dead versions left, vacuumed, rather than the baseline's again.
        self.keeps_rows = False


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def insert_copies(
    conn: psycopg.Connection,
    status: str,
    rows: int,
    moved: dict[str, str],
    nibble: str,
    into: str = TABLE,
) -> None:
    """Add ``rows`` copies of the table's task in ``status``, in one statement.

    The copy has the package's shape (the driver enqueued it, a worker ran
    it); ``moved`` gives columns SQL over ``g`` (1 to ``rows``) instead, and
    ``moved["enqueued_at"]`` dates the UUIDv7-like keys too (``nibble`` keeps
    the keys of two calls apart). The times are each row's own: copies that
    shared one would share an index key, and deduplication would pack them
    into a few pages, which no real table does.
    """
    columns = [
        name
        for (name,) in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
            " AND table_schema = current_schema() AND is_generated = 'NEVER'"
            " ORDER BY ordinal_position",
            (TABLE,),
        )
        if name != "id"
    ]
    values = ", ".join(moved.get(name, f"t.{name}") for name in columns)
    ms = f"(extract(epoch FROM {moved['enqueued_at']}) * 1000)::bigint"
    conn.execute(
        f"""
        INSERT INTO {into} (id, {", ".join(columns)})
        SELECT
            (lpad(to_hex({ms}), 12, '0') || '7' || lpad(to_hex(g %% 4096), 3, '0')
                || '{nibble}' || lpad(to_hex(g), 15, '0'))::uuid,
            {values}
        FROM (SELECT * FROM {TABLE} WHERE status = %(status)s LIMIT 1) AS t,
             generate_series(1, %(rows)s) AS g
        """,
        {"status": status, "rows": rows},
    )


def insert_finished(conn: psycopg.Connection, rows: int) -> None:
    """Tasks that ran over the day before, one after the other.

    Of sizes that vary as real ones do (a progress message of 0 to 60
    characters): copies of one size would pack every page alike, leaving
    each the same free space at its end, which either fits a new task on
    every page or on none, as a byte of the template (its worker's pid in the
    history) decides. With room for one, every insert went to an old page of
    its own, with a full-page image in the WAL (20 times the WAL of an empty
    table); without, none did.
    """
    at = "(now() - interval '1 day' + interval '23 hours' * g::float8 / %(rows)s)"
    moved = {
        "progress_message": "repeat('.', (g %% 61)::int)",
        "enqueued_at": at,
        "run_after": at,
        "started_at": f"{at} + interval '1 ms'",
        "last_attempted_at": f"{at} + interval '1 ms'",
        "finished_at": f"{at} + interval '2 ms'",
    }
    # Where the package's workers put the rows they finish.
    insert_copies(conn, "SUCCESSFUL", rows, moved, "8", into=FINISHED_TABLE)


def insert_scheduled(conn: psycopg.Connection, rows: int) -> None:
    """READY tasks enqueued over the last hour, due over the hour after the next."""
    due = "now() + interval '1 hour' * (1 + g::float8 / %(rows)s)"
    moved = {
        "enqueued_at": "(now() - interval '1 hour' * (1 - g::float8 / %(rows)s))",
        "run_after": due,
        "requested_run_after": due,
    }
    insert_copies(conn, "READY", rows, moved, "9")


def prepare(side: Side, conn: psycopg.Connection, finished: int, scheduled: int, log_path: Path):
    """The side's table as the turns start from: empty, or with the old and future rows."""
    side.create_schema()
    if finished or scheduled:
        # One task through the package: enqueued (the template of the scheduled
        # rows), then run by a worker (the template of the finished ones).
        side.drive("enqueue", "--mode", "single", "--count", "1")
        if scheduled:
            insert_scheduled(conn, scheduled)
        time_drain(side, conn, 1, 1, log_path)
        if finished > 1:
            insert_finished(conn, finished - 1)
    # The harness vacuums and analyzes between turns, the same on both sides:
    # autovacuum would visit the empty table (1,000 inserts are its threshold)
    # and not the big one, at moments of its own.
    for table in TABLES:
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    settle(conn, TABLES, vacuum=True)
    row = conn.execute(f"SELECT id::text FROM {TABLE} ORDER BY id DESC LIMIT 1").fetchone()
    side.baseline_max_id = row[0] if row else NIL


def restore(side: Side, conn: psycopg.Connection) -> None:
    """Delete the turn's rows (keyed after every row of the baseline) and settle."""
    if side.keeps_rows:
        settle(conn, TABLES, vacuum=True)
        row = conn.execute(f"SELECT id::text FROM {TABLE} ORDER BY id DESC LIMIT 1").fetchone()
        side.baseline_max_id = row[0] if row else NIL
        return
    # The same statement on both sides: an empty table's baseline is the nil UUID.
    conn.execute(f"DELETE FROM {TABLE} WHERE id > %s::uuid", (side.baseline_max_id,))
    settle(conn, TABLES, vacuum=True)


def turn(
    side: Side,
    conn: psycopg.Connection,
    meter: ServerMeter,
    args: argparse.Namespace,
    log_path: Path,
) -> dict[str, Any]:
    single = args.single
    bulk = args.tasks - single
    figures: dict[str, Any] = {}

    def cost(name: str, before: Reading, tasks: int) -> None:
        meter.wait_idle()  # the phase's backends gone, their CPU reaped
        cpu, wal, images = meter.since(before)
        figures[f"{name}_server_cpu_us_per_task"] = cpu / tasks * 1e6
        figures[f"{name}_wal_bytes_per_task"] = wal / tasks
        figures[f"{name}_fpi_per_1000_tasks"] = images / tasks * 1000

    before = meter.read()
    seconds = float(side.drive("enqueue", "--mode", "single", "--count", str(single))["seconds"])
    figures["single_per_second"] = single / seconds
    cost("single", before, single)
    before = meter.read()
    figures["bulk_per_second"] = bulk / enqueue_bulk(side, bulk, args.chunk)
    cost("bulk", before, bulk)
    settle(conn, TABLES)  # as every drain of run.py starts: analyzed and checkpointed
    before = meter.read()
    drain = time_drain(side, conn, args.tasks, args.workers[0], log_path).as_dict()
    cost("drain", before, args.tasks)
    # By the database clock, from the first claim to the last finish: the
    # processes' start (the same on both sides) left out.
    row = conn.execute(
        f"SELECT extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM {TABLE}"
        " WHERE id > %s::uuid",
        (side.baseline_max_id,),
    ).fetchone()
    assert row is not None
    restore(side, conn)
    trickle(side, conn, meter, args, log_path, figures)
    figures["drain_per_second"] = args.tasks / row[0]
    figures["drain_wall_per_second"] = drain["tasks_per_second"]
    figures["drain_worker_cpu_us_per_task"] = drain["worker_cpu_us_per_task"]
    return {**figures, "drain": drain}


def trickle(
    side: Side,
    conn: psycopg.Connection,
    meter: ServerMeter,
    args: argparse.Namespace,
    log_path: Path,
    figures: dict[str, Any],
) -> None:
    """Tasks enqueued one at a time to an idle worker that keeps up, as most of a day is.

    Then every claim round finds fewer tasks due than it asks for, and a read
    that walks past the due ones into the scheduled rows pays for all of them.
    The server's CPU per task covers the enqueues and the worker's rounds.
    """
    count = args.backlog_trickle
    conn.execute(CREATE_STARTED_TABLE)
    conn.execute("TRUNCATE bench_started")
    settle(conn, TABLES)
    with WorkerGroup(
        side.idle_worker_commands(1), cwd=side.project_dir, env=side.env(), log=log_path
    ) as group:
        # Key 0 is a warm-up: once it has run, the worker is up, connected and idle.
        side.drive("latency", "--first-key", "0", "--count", "1", "--pause", "0")
        wait_for_probes(side, conn, group, 1, timeout=60, log=log_path)
        time.sleep(0.5)
        before = meter.read()
        result = side.drive(
            "latency",
            "--first-key",
            "1",
            "--count",
            str(count),
            "--pause",
            repr(1 / args.backlog_trickle_rate),
        )
        wait_for_probes(side, conn, group, count + 1, timeout=120, log=log_path)
        time.sleep(0.5)  # the last outcome written
    meter.wait_idle()  # every backend of the phase (the driver's, the workers') reaped
    cpu, _, _ = meter.since(before)
    started = dict(conn.execute("SELECT key, started_at FROM bench_started WHERE key >= 1"))
    delays = [(started[int(key)] - at) * 1000 for key, at in result["enqueued"].items()]
    figures["trickle_server_cpu_us_per_task"] = cpu / count * 1e6
    figures["trickle_p50_ms"] = percentile(delays, 50)
    figures["trickle_p99_ms"] = percentile(delays, 99)
    restore(side, conn)


def table_size(conn: psycopg.Connection) -> dict[str, Any]:
    row = conn.execute(
        f"SELECT count(*) FILTER (WHERE status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')),"
        f" count(*) FILTER (WHERE status = 'READY' AND run_after > now()),"
        f" pg_total_relation_size('{TABLE}') + pg_total_relation_size('{FINISHED_TABLE}')"
        f" FROM {TABLE}"
    ).fetchone()
    assert row is not None
    return {"finished": row[0], "scheduled": row[1], "total_mb": row[2] / 2**20}


def order(turns: int) -> list[int]:
    """A B B A A B ...: 0 for A, 1 for B, each ``turns`` times."""
    pairs = [(0, 1) if i % 2 == 0 else (1, 0) for i in range(turns)]
    return [side for pair in pairs for side in pair]


def summarize(runs: list[list[dict[str, Any]]], tolerance: float) -> dict[str, Any]:
    empty, full = runs
    figures: dict[str, Any] = {}
    failures: list[str] = []
    for key, (label, better, judged) in FIGURES.items():
        a = statistics.median(run[key] for run in empty)
        b = statistics.median(run[key] for run in full)
        ratio = b / a if a else None
        pairs = [f[key] / e[key] for e, f in zip(empty, full, strict=True) if e[key]]
        # How much worse B is, as a fraction: slower (rates) or dearer (CPU).
        worse = None if ratio is None else (1 - ratio if better == "higher" else ratio - 1)
        passed = None if not judged else (worse is not None and worse <= tolerance)
        if passed is False:
            failures.append(f"{label}: B is {worse:.1%} worse than A (at most {tolerance:.0%})")
        figures[key] = {
            "label": label,
            "empty": a,
            "full": b,
            "ratio": ratio,
            "pair_ratios": pairs,
            "judged": judged,
            "passed": passed,
        }
    return {"figures": figures, "passed": not failures, "failures": failures}


def render(result: dict[str, Any]) -> str:
    config, summary = result["config"], result["summary"]
    b = result["tables"][1]
    head = (
        f"Backlog: {config['tasks']:,} tasks ({config['single']:,} enqueued one per transaction,"
        f" the rest in bulk calls of {config['chunk']:,}) drained by runworkers --processes"
        f" {config['workers']} --burst {' '.join(config['worker_args'])}".rstrip()
        + f"; A: an empty table, B: {b['finished']:,} finished and {b['scheduled']:,} scheduled"
        f" rows ({b['total_mb']:,.0f} MB)"
        + ("; B keeps each turn's rows (lived in)" if config.get("lived_in") else "")
        + f"; {config['turns']} turns each, in the order"
        f" {' '.join('AB'[i] for i in order(config['turns']))}; medians"
    )
    lines = [
        head,
        "",
        "| measure | A: empty | B: backlog | B / A | B / A by pair (min-max) | within"
        f" {config['tolerance']:.0%} |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for figure in summary["figures"].values():
        pairs = figure["pair_ratios"]
        spread = f"{min(pairs):.3f}-{max(pairs):.3f}" if pairs else "-"
        verdict = (
            "(not judged)"
            if figure["passed"] is None
            else ("yes" if figure["passed"] else "**no**")
        )
        ratio = "-" if figure["ratio"] is None else f"{figure['ratio']:.3f}"
        lines.append(
            f"| {figure['label']} | {figure['empty']:,.0f} | {figure['full']:,.0f} "
            f"| {ratio} | {spread} | {verdict} |"
        )
    lines += ["", f"Verdict: {'PASSED' if summary['passed'] else 'FAILED'}"]
    lines += [f"- {failure}" for failure in summary["failures"]]
    return "\n".join(lines)


def run(args: argparse.Namespace, stamp: str, python: str | None) -> int:
    if len(args.workers) != 1 or len(args.variants) != 1 or len(args.backlog_rows) != 1:
        raise SystemExit("--backlog takes one --workers count, one variant, one --backlog-rows")
    if not 0 < args.single < args.tasks:
        raise SystemExit("--backlog needs 0 < --single < --tasks")
    server = PgServer(
        host=args.pg_host,
        port=args.pg_port,
        user=args.pg_user,
        password=os.environ.get("PGPASSWORD", ""),
    )
    bench_dir = Path(__file__).resolve().parents[1]
    context = Context(
        server=server,
        envs_dir=bench_dir / ".envs",
        logs_dir=bench_dir / ".logs" / stamp,
        options={"rdbtasks_python": python, "rdbtasks_worker_args": args.rdbtasks_worker_args},
    )
    name, variant_args = args.variants[0]
    sides = [
        Side(context, "empty", "bench_backlog_empty", variant_args),
        Side(context, "full", "bench_backlog_full", variant_args),
    ]
    sides[1].keeps_rows = args.backlog_lived_in
    load_before = os.getloadavg()
    log(f"load average {load_before[0]:.1f}")
    runs: list[list[dict[str, Any]]] = [[], []]
    conns: list[psycopg.Connection] = []
    try:
        for side, (finished, scheduled) in zip(
            sides, [(0, 0), (args.backlog_rows[0], args.backlog_future)], strict=True
        ):
            side.prepare_env()
            log(f"{side.database}: {finished:,} finished and {scheduled:,} scheduled rows")
            server.recreate_database(side.database)
            conns.append(server.connect(side.database))
            prepare(side, conns[-1], finished, scheduled, _log_path(context, side))
        tables = [table_size(conn) for conn in conns]
        meter = ServerMeter(conns)
        for i, index in enumerate(order(args.backlog_turns)):
            side = sides[index]
            result = turn(side, conns[index], meter, args, _log_path(context, side))
            runs[index].append(result)
            log(
                f"turn {i + 1}, {'AB'[index]} ({side.database}): drain"
                f" {result['drain_per_second']:,.0f}/s, server"
                f" {result['drain_server_cpu_us_per_task']:,.0f} µs/task, workers"
                f" {result['drain_worker_cpu_us_per_task']:,.0f} µs/task; enqueue single"
                f" {result['single_per_second']:,.0f}/s, server"
                f" {result['single_server_cpu_us_per_task']:,.0f} µs/task; bulk"
                f" {result['bulk_per_second']:,.0f}/s, server"
                f" {result['bulk_server_cpu_us_per_task']:,.0f} µs/task; trickle, server"
                f" {result['trickle_server_cpu_us_per_task']:,.0f} µs/task, start delay p50"
                f" {result['trickle_p50_ms']:,.1f} ms"
            )
    finally:
        for conn in conns:
            conn.close()
        if not args.keep_databases:
            for side in sides:
                server.drop_database(side.database)
    summary = summarize(runs, args.backlog_tolerance)
    if meter.strangers:
        log(
            f"WARNING: up to {meter.strangers} sessions of other databases were seen on the"
            " server: the server's CPU and WAL figures include their work (run on a cluster"
            " of its own, bench/README.md)"
        )
    result = {
        "config": {
            "tasks": args.tasks,
            "single": args.single,
            "chunk": args.chunk,
            "workers": args.workers[0],
            "variant": name,
            "worker_args": [*variant_args, *args.rdbtasks_worker_args.split()],
            "turns": args.backlog_turns,
            "finished_rows": args.backlog_rows[0],
            "scheduled_rows": args.backlog_future,
            "tolerance": args.backlog_tolerance,
            "lived_in": args.backlog_lived_in,
            "trickle": args.backlog_trickle,
            "trickle_rate": args.backlog_trickle_rate,
        },
        "tables": tables,
        "runs": {"empty": runs[0], "full": runs[1]},
        "summary": summary,
        "server": server.describe(),
        "other_sessions_seen": meter.strangers,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
    output = args.output or bench_dir / "results" / f"backlog-{stamp}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2, default=str))
    print()
    print(render(result))
    log(f"results in {output}; worker logs in {context.logs_dir}")
    return 0 if summary["passed"] else 1


def _log_path(context: Context, side: Side) -> Path:
    return context.logs_dir / f"backlog-{side.variant}.log"
