"""Option (a) under a pin: a narrow ready table, its rows deleted at claim.

A table shaped as solid_queue's ready executions (queue, priority, run_after,
task id), ~800 rows live; each step inserts BATCH rows and claims BATCH with a
DELETE of the first rows in claim order (FOR UPDATE SKIP LOCKED). At checkpoints,
EXPLAIN (ANALYZE, BUFFERS) of the claim's read. ``--pin`` holds a REPEATABLE
READ transaction with an xid from the start.
"""

from __future__ import annotations

import argparse
import json

import psycopg

READ = (
    "SELECT ctid FROM ready43 WHERE queue_name = 'default' AND run_after <= statement_timestamp() "
    "ORDER BY priority DESC, run_after LIMIT %(batch)s"
)
CLAIM = f"DELETE FROM ready43 WHERE ctid = ANY(ARRAY({READ} FOR UPDATE SKIP LOCKED)) RETURNING task_id"
INSERT = (
    "INSERT INTO ready43 (task_id, queue_name, priority) "
    "SELECT gen_random_uuid(), 'default', 0 FROM generate_series(1, %(batch)s)"
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--tasks", type=int, default=40000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--every", type=int, default=10000)
    ap.add_argument("--pin", action="store_true")
    args = ap.parse_args()
    conn = psycopg.connect(args.dsn, autocommit=True)
    cur = conn.cursor()
    cur.execute("DROP TABLE IF EXISTS ready43")
    cur.execute(
        "CREATE TABLE ready43 (task_id uuid PRIMARY KEY, queue_name varchar(100) NOT NULL, "
        "priority smallint NOT NULL, run_after timestamptz NOT NULL DEFAULT statement_timestamp()) "
        "WITH (autovacuum_enabled = false)"
    )
    cur.execute("CREATE INDEX ready43_claim ON ready43 (queue_name, priority DESC, run_after)")
    for _ in range(8):
        cur.execute(INSERT, {"batch": args.batch})
    cur.execute("VACUUM ANALYZE ready43")
    pin = None
    if args.pin:
        pin = psycopg.connect(args.dsn)
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT txid_current()")
        pin.execute("SELECT count(*) FROM ready43")
    done = 0

    def checkpoint() -> None:
        times, top = [], None
        for _ in range(5):
            cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + READ, {"batch": args.batch})
            top = cur.fetchone()[0][0]
            times.append(top["Execution Time"])
        plan = top["Plan"]
        cur.execute("SELECT pg_relation_size('ready43'), pg_indexes_size('ready43')")
        heap, idx = cur.fetchone()
        print(json.dumps({
            "tasks": done, "ms": round(sorted(times)[2], 2),
            "buffers": plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0),
            "heap_kb": heap // 1024, "indexes_kb": idx // 1024,
        }), flush=True)

    checkpoint()
    while done < args.tasks:
        cur.execute(INSERT, {"batch": args.batch})
        cur.execute(CLAIM, {"batch": args.batch})
        done += cur.rowcount
        if done % args.every == 0:
            checkpoint()
    if pin is not None:
        pin.rollback()
    cur.execute("DROP TABLE ready43")


if __name__ == "__main__":
    main()
