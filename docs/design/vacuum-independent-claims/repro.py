"""Issue 43's growth, reproduced on the real schema with the real round statement.

One process plays producer and worker: each step inserts BATCH fresh READY tasks
(one INSERT) and runs the package's common round (docs/sql/postgresql.sql,
``round_success_then_claim_lean_optimistic``: the last batch's successes moved
to the finished table, the next batch claimed), ~800 READY rows live, as in the
issue. At checkpoints it runs EXPLAIN (ANALYZE, BUFFERS) of the claim's read
(the round's ``pool`` CTE as a SELECT) and reports the buffers of each index
scan. ``--pin`` holds a REPEATABLE READ transaction with an xid from the start.

    python repro.py --dsn postgresql://postgres@127.0.0.1:5432/design43 --tasks 40000 [--pin]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
import uuid

import psycopg

CATALOG = os.path.join(os.path.dirname(__file__), "..", "..", "sql", "postgresql.sql")
QUEUES = ["default"]


def statement(name: str) -> str:
    text = open(CATALOG).read()
    m = re.search(rf"-- name: {name}\n(?:--[^\n]*\n)*(.*?);\n\n-- name:", text, re.S)
    assert m, name
    return m.group(1)


def uuid7() -> uuid.UUID:
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms << 80) | (0x7 << 76) | ((rand >> 62) & 0xFFF) << 64 | (0b10 << 62) | (rand & ((1 << 62) - 1))
    return uuid.UUID(int=value)


INSERT = (
    "INSERT INTO django_rdbtasks_task (id, task_path, queue_name, backend_name, priority, args, "
    "kwargs, max_attempts, status, version, worker_id, attempts, history, job_name) "
    "SELECT unnest(%s::uuid[]), 'bench.tasks.noop', 'default', 'default', 0, '[]', '{}', 1, "
    "'READY', 0, '', 0, '[]', ''"
)


def pool_read(round_sql: str) -> str:
    """The round's ``pool`` CTE (with ``lim``) as a SELECT: the claim's read."""
    lim = re.search(r"lim AS MATERIALIZED\s*\(.*?\) AS limited\)", round_sql, re.S).group(0)
    pool = re.search(r"pool AS MATERIALIZED\s*(\(.*?LIMIT %\(pool\)s\)), go AS", round_sql, re.S).group(1)
    return f"WITH {lim} SELECT * FROM {pool} AS pool"


FRESH_DUE = "AND started_at IS NULL\n                 AND run_after <= STATEMENT_TIMESTAMP()"
LEASE_DUE = "AND lease_expires_at <= STATEMENT_TIMESTAMP()"


def bounded(round_sql: str) -> str:
    """The prototype's read: the fresh arm from the lane's frontier of (queue, priority),
    the expired leases from the previous read's clock, each a range of its index."""
    assert round_sql.count(FRESH_DUE) == 1 and round_sql.count(LEASE_DUE) == 1
    round_sql = round_sql.replace(
        FRESH_DUE,
        "AND started_at IS NULL AND priority = 0 AND run_after >= %(fresh_from)s::timestamptz "
        "AND run_after <= STATEMENT_TIMESTAMP()",
    )
    return round_sql.replace(
        LEASE_DUE, "AND lease_expires_at >= %(lease_from)s::timestamptz " + LEASE_DUE
    )


def scans(plan: dict, out: list) -> list:
    if "Index Name" in plan:
        out.append(
            (plan["Index Name"], plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0),
             plan.get("Actual Rows", 0) * plan.get("Actual Loops", 1))
        )
    for child in plan.get("Plans", []):
        scans(child, out)
    return out


def measure(cur, read: str, params: dict) -> dict:
    times = []
    for _ in range(5):
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + read, params)
        top = cur.fetchone()[0][0]
        times.append(top["Execution Time"])
    plan = top["Plan"]
    per_index: dict[str, int] = {}
    for name, buffers, _rows in scans(plan, []):
        per_index[name] = per_index.get(name, 0) + buffers
    return {
        "ms": round(sorted(times)[2], 2),
        "buffers": plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0),
        "rows": plan.get("Actual Rows"),
        "per_index": per_index,
    }


def table_stats(cur) -> dict:
    cur.execute(
        "SELECT n_dead_tup, n_live_tup, pg_relation_size('django_rdbtasks_task'), "
        "pg_indexes_size('django_rdbtasks_task') FROM pg_stat_user_tables "
        "WHERE relname = 'django_rdbtasks_task'"
    )
    dead, live, heap, idx = cur.fetchone()
    return {"dead": dead, "heap_kb": heap // 1024, "indexes_kb": idx // 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--tasks", type=int, default=40000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--backlog", type=int, default=800)
    ap.add_argument("--pin", action="store_true")
    ap.add_argument("--every", type=int, default=10000)
    ap.add_argument("--lease", type=float, default=1.0)
    ap.add_argument("--lanes", type=int, default=1, help="lanes taking turns, each with its own bounds")
    ap.add_argument("--frontier", action="store_true", help="the prototype: fresh and lease reads bounded below")
    args = ap.parse_args()

    round_sql = statement("round_success_then_claim_lean_optimistic")
    if args.frontier:
        round_sql = bounded(round_sql)
    read = pool_read(round_sql)
    conn = psycopg.connect(args.dsn, autocommit=True)
    cur = conn.cursor()
    cur.execute("TRUNCATE django_rdbtasks_task, django_rdbtasks_finishedtask")
    for table in ("django_rdbtasks_task", "django_rdbtasks_finishedtask"):
        cur.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    cur.execute(INSERT, [[uuid7() for _ in range(args.backlog)]])
    cur.execute("VACUUM ANALYZE django_rdbtasks_task")
    pin = None
    if args.pin:
        pin = psycopg.connect(args.dsn)
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT txid_current()")
        pin.execute("SELECT count(*) FROM django_rdbtasks_task")
    lanes = [
        {"worker": f"repro:1:{n}:x", "held": [], "fresh_from": "-infinity", "lease_from": "-infinity"}
        for n in range(args.lanes)
    ]
    common = {"queues": QUEUES, "pool": 4 * args.batch, "want": args.batch, "finishing": [],
              "lease": args.lease}

    def params_of(lane: dict) -> dict:
        return {**common, "claimer": lane["worker"], "worker": lane["worker"],
                "fresh_from": lane["fresh_from"], "lease_from": lane["lease_from"]}

    report = []
    done = 0
    step = 0
    round_ms: list[float] = []

    def checkpoint() -> None:
        # The read as the first lane would make it now.
        m = measure(cur, read, params_of(lanes[0]))
        m.update(table_stats(cur))
        m["tasks"] = done
        last = sorted(round_ms[-50:]) or [0.0]
        m["round_ms"] = round(last[len(last) // 2], 2)
        report.append(m)
        print(json.dumps(m), flush=True)

    checkpoint()
    while done < args.tasks:
        lane = lanes[step % len(lanes)]
        step += 1
        cur.execute(INSERT, [[uuid7() for _ in range(args.batch)]])
        params = params_of(lane)
        held = lane["held"]
        params["ids"] = [i for i, _ in held]
        params["versions"] = [v for _, v in held]
        params["rows0"] = json.dumps([{"id": i, "version": v, "rv": None, "entry": {"o": "s"}, "delay": None} for i, v in held])
        if args.frontier:
            cur.execute("SELECT statement_timestamp()")
            read_at = cur.fetchone()[0]
        t0 = time.perf_counter()
        cur.execute(round_sql, params)
        round_ms.append((time.perf_counter() - t0) * 1000)
        rows = cur.fetchall()
        before = done
        done += sum(1 for r in rows if r[0] == "d")
        lane["held"] = [(str(r[1]), r[2]) for r in rows if r[0] == "c"]
        if args.frontier:
            # One priority, lanes taking turns: a lane wins the first live
            # rows of its pool in order (the rows below them are the other
            # lanes' claims), so the rows it did not take start at its last
            # claim's run_after. (The build returns the least run_after of the
            # pool's rows not claimed, section 4.)
            claimed_at = [r[14] for r in rows if r[0] == "c"]
            if claimed_at:
                lane["fresh_from"] = max(claimed_at)
            lane["lease_from"] = read_at
        if done // args.every > before // args.every:
            checkpoint()
    checkpoint()
    if pin is not None:
        pin.rollback()
        pin.close()
    for table in ("django_rdbtasks_task", "django_rdbtasks_finishedtask"):
        cur.execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")


if __name__ == "__main__":
    main()
