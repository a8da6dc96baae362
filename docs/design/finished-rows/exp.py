"""Throwaway experiment: WAL and full-page images per task for three table layouts.

S: one table (today's), H: active table + history table (row moved on finish),
P: LIST partitioned by status (active / finished partitions).
Each on an empty side (A) and a big side (B: 1M finished rows of varied size,
100k scheduled rows), phases like bench/core/backlog.py: single enqueues,
bulk enqueue, drain (claim then finish in rounds), then restore.
"""

import json
import os
import sys
import time

import psycopg

DSN = "host=127.0.0.1 port=5499 user=postgres dbname=exp"
BASE = "django_rdbtasks_task"
ACTIVE_ONLY = [
    "rdbtasks_task_ready_fresh", "rdbtasks_task_ready_deferred", "rdbtasks_task_ready_limited",
    "rdbtasks_task_ready_key", "rdbtasks_task_lease", "rdbtasks_task_waiting",
    "rdbtasks_task_one_active",
]
FINISHED_ONLY = ["rdbtasks_task_finished", "rdbtasks_task_failed", "rdbtasks_task_finished_path"]

HIST = json.dumps([{
    "attempt": 1, "worker_id": "bench-host:23456:1a2b3c4d",
    "started_at": "2026-11-27T23:00:00.123456+00:00",
    "finished_at": "2026-11-27T23:00:00.124456+00:00", "outcome": "SUCCESSFUL"}])
ENTRY = json.loads(HIST)[0]


def index_defs(conn, names=None, exclude=()):
    rows = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND indexname <> %s",
        (BASE, f"{BASE}_pkey")).fetchall()
    return [(n, d) for n, d in rows if (names is None or n in names) and n not in exclude]


def columns(conn):
    return [r[0] for r in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name=%s "
        "AND is_generated='NEVER' ORDER BY ordinal_position", (BASE,))]


def create_plain(conn, name, keep):
    conn.execute(f"DROP TABLE IF EXISTS {name} CASCADE")
    conn.execute(f"CREATE TABLE {name} (LIKE {BASE} INCLUDING DEFAULTS INCLUDING GENERATED "
                 "INCLUDING CONSTRAINTS)")
    conn.execute(f"ALTER TABLE {name} ADD PRIMARY KEY (id)")
    for idx, d in index_defs(conn):
        if idx in keep:
            conn.execute(d.replace(f" ON public.{BASE} ", f" ON public.{name} ")
                         .replace(f"INDEX {idx} ", f"INDEX {name}_{idx[14:]} "))
    conn.execute(f"ALTER TABLE {name} SET (autovacuum_enabled = off)")


def create_layout(conn, layout, side):
    every = {n for n, _ in index_defs(conn)}
    if layout == "S":
        create_plain(conn, f"s_{side}", every)
        return {"insert": f"s_{side}", "all": [f"s_{side}"]}
    if layout == "H":
        create_plain(conn, f"h_{side}_act", every - set(FINISHED_ONLY))
        create_plain(conn, f"h_{side}_hist", every - set(ACTIVE_ONLY))
        return {"insert": f"h_{side}_act", "hist": f"h_{side}_hist",
                "all": [f"h_{side}_act", f"h_{side}_hist"]}
    if layout == "M":
        create_plain(conn, f"m_{side}_act", every)
        create_plain(conn, f"m_{side}_hist", every - set(ACTIVE_ONLY))
        return {"insert": f"m_{side}_act", "hist": f"m_{side}_hist",
                "all": [f"m_{side}_act", f"m_{side}_hist"]}
    if layout == "P":
        name = f"p_{side}"
        conn.execute(f"DROP TABLE IF EXISTS {name} CASCADE")
        conn.execute(f"CREATE TABLE {name} (LIKE {BASE} INCLUDING DEFAULTS INCLUDING GENERATED "
                     "INCLUDING CONSTRAINTS) PARTITION BY LIST (status)")
        conn.execute(f"CREATE TABLE {name}_act PARTITION OF {name} FOR VALUES IN "
                     "('READY','RUNNING','WAITING')")
        conn.execute(f"CREATE TABLE {name}_fin PARTITION OF {name} FOR VALUES IN "
                     "('SUCCESSFUL','FAILED','CANCELLED')")
        # The partition key must be in a parent's unique index: (id, status).
        conn.execute(f"ALTER TABLE {name} ADD PRIMARY KEY (id, status)")
        for idx, d in index_defs(conn):
            if idx == "rdbtasks_task_one_active":
                continue  # would have to include status on the parent
            conn.execute(d.replace(f" ON public.{BASE} ", f" ON public.{name} ")
                         .replace(f"INDEX {idx} ", f"INDEX {name}_{idx[14:]} "))
        for part in ("act", "fin"):
            conn.execute(f"ALTER TABLE {name}_{part} SET (autovacuum_enabled = off)")
        return {"insert": name, "all": [name, f"{name}_act", f"{name}_fin"], "vac": [
            f"{name}_act", f"{name}_fin"]}
    raise ValueError(layout)


def uuid_sql(ms_expr, nibble, g="g"):
    return (f"(lpad(to_hex({ms_expr}), 12, '0') || '7' || lpad(to_hex({g} % 4096), 3, '0') "
            f"|| '{nibble}' || lpad(to_hex({g}), 15, '0'))::uuid")


FRESH_VALUES = dict(
    task_path="'rdbtasks_project.tasks.noop'", queue_name="'default'", backend_name="'default'",
    priority="0", args="'[]'::jsonb", kwargs="'{}'::jsonb", status="'READY'", version="0",
    worker_id="''", attempts="0", max_attempts="1", history="'[]'::jsonb",
    progress_message="''", cancel_requested="false", waiting_on="0",
    on_parent_failure="'CANCELLED'", has_children="false", job_name="''",
)


def fill_b(conn, t, finished_target, rows_fin, rows_sched):
    """As bench/core/backlog.py: finished rows of varied size, scheduled rows of one size."""
    at = f"(now() - interval '1 day' + interval '23 hours' * g::float8 / {rows_fin})"
    ms = f"(extract(epoch FROM {at}) * 1000)::bigint"
    vals = dict(FRESH_VALUES, status="'SUCCESSFUL'", version="2", attempts="1",
                worker_id="'bench-host:23456:1a2b3c4d'",
                history=f"'{HIST}'::jsonb", progress_message="repeat('.', (g % 61)::int)",
                enqueued_at=at, run_after=at, started_at=f"{at} + interval '1 ms'",
                last_attempted_at=f"{at} + interval '1 ms'",
                finished_at=f"{at} + interval '2 ms'")
    cols = ", ".join(vals)
    conn.execute(f"INSERT INTO {finished_target} (id, {cols}) SELECT {uuid_sql(ms, '8')}, "
                 f"{', '.join(vals.values())} FROM generate_series(1, {rows_fin}) AS g")
    due = f"now() + interval '1 hour' * (1 + g::float8 / {rows_sched})"
    enq = f"(now() - interval '1 hour' * (1 - g::float8 / {rows_sched}))"
    ms = f"(extract(epoch FROM {enq}) * 1000)::bigint"
    vals = dict(FRESH_VALUES, enqueued_at=enq, run_after=due, requested_run_after=due)
    cols = ", ".join(vals)
    conn.execute(f"INSERT INTO {t} (id, {cols}) SELECT {uuid_sql(ms, '9')}, "
                 f"{', '.join(vals.values())} FROM generate_series(1, {rows_sched}) AS g")


class Meter:
    def __init__(self, conn):
        self.conn = conn
        self.pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]

    def cpu(self):
        with open(f"/proc/{self.pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")

    def read(self):
        self.conn.execute("SELECT pg_stat_force_next_flush()")
        lsn, fpi, recs = self.conn.execute(
            "SELECT pg_current_wal_insert_lsn(), wal_fpi, wal_records FROM pg_stat_wal").fetchone()
        return lsn, fpi, recs, self.cpu()

    def since(self, before):
        after = self.read()
        wal = self.conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (after[0], before[0])).fetchone()[0]
        return float(wal), after[1] - before[1], after[2] - before[2], after[3] - before[3]


def settle(conn, names, vacuum=False):
    for n in names:
        conn.execute(f"{'VACUUM ' if vacuum else ''}ANALYZE {n}")
    conn.execute("CHECKPOINT")


READY_FRESH = ("status = 'READY' AND limit_key IS NULL AND requested_run_after IS NULL "
               "AND started_at IS NULL")


def finish_sql(layout, tables):
    t = tables["insert"]
    hist = ("history || jsonb_build_array(jsonb_build_object('attempt', 1, 'worker_id', "
            "worker_id, 'started_at', last_attempted_at, 'finished_at', statement_timestamp(), "
            "'outcome', 'SUCCESSFUL'))")
    sets = (f"status = 'SUCCESSFUL', version = version + 1, lease_expires_at = NULL, "
            f"return_value = 'null'::jsonb, finished_at = statement_timestamp(), history = {hist}")
    fence = "id = ANY(%(ids)s::uuid[]) AND version = 1 AND status = 'RUNNING' AND worker_id = 'w1'"
    if layout in ("S", "P", "M"):
        return f"UPDATE {t} SET {sets} WHERE {fence}"
    cols = COLS
    moved = {"status": "'SUCCESSFUL'", "version": "version + 1", "lease_expires_at": "NULL",
             "return_value": "'null'::jsonb", "finished_at": "statement_timestamp()",
             "history": hist}
    sel = ", ".join(moved.get(c, c) for c in cols)
    return (f"WITH d AS (DELETE FROM {t} WHERE {fence} RETURNING *) "
            f"INSERT INTO {tables['hist']} ({', '.join(cols)}) SELECT {sel} FROM d")


def claim_sql(t):
    return (f"UPDATE {t} SET status = 'RUNNING', version = version + 1, worker_id = 'w1', "
            "lease_expires_at = statement_timestamp() + interval '5 minutes', "
            "attempts = attempts + 1, started_at = COALESCE(started_at, statement_timestamp()), "
            "last_attempted_at = statement_timestamp() "
            f"WHERE id IN (SELECT id FROM {t} WHERE {READY_FRESH} AND queue_name = 'default' "
            "AND run_after <= statement_timestamp() ORDER BY priority DESC, run_after "
            "LIMIT %(n)s FOR UPDATE SKIP LOCKED) RETURNING id")


KEEP = []


def turn(conn, meter, layout, tables, baseline, single=2000, bulk=18000, rnd=400):
    t = tables["insert"]
    vac = tables.get("vac", tables["all"])
    out = {}
    vals = dict(FRESH_VALUES)
    cols = ", ".join(vals)
    seq = [0]

    def ins(n):
        start = seq[0]
        seq[0] += n
        ms = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
        conn.execute(f"INSERT INTO {t} (id, {cols}) SELECT {uuid_sql(ms, 'a')}, "
                     f"{', '.join(vals.values())} FROM generate_series({start + 1}, {start + n}) AS g")

    before = meter.read()
    for _ in range(single):
        with conn.transaction():
            ins(1)
    out["single"] = meter.since(before)
    before = meter.read()
    for _ in range(bulk // 1000):
        with conn.transaction():
            ins(1000)
    out["bulk"] = meter.since(before)
    settle(conn, vac)
    before = meter.read()
    fin, claim = finish_sql(layout, tables), claim_sql(t)
    done, pending = 0, []
    while True:
        with conn.transaction():
            if pending:
                conn.execute(fin, {"ids": pending})
                done += len(pending)
            pending = [r[0] for r in conn.execute(claim, {"n": rnd}).fetchall()]
        if layout == "M" and (not pending or len(pending) and done % 2000 == 0):
            with conn.transaction():
                conn.execute(MOVE.format(t=t, h=tables["hist"], cols=", ".join(COLS)))
        if not pending:
            break
    out["drain"] = meter.since(before)
    out["drained"] = done
    # restore: the turn's rows go
    for name in ([] if KEEP else tables["all"][-2:] if layout == "P" else tables["all"]):
        conn.execute(f"DELETE FROM {name} WHERE id > %s::uuid", (baseline,))
    settle(conn, vac, vacuum=True)
    return out


COLS = []
MOVE = ("WITH d AS (DELETE FROM {t} WHERE id IN (SELECT id FROM {t} WHERE finished_at IS NOT NULL "
        "AND finished_at < statement_timestamp() ORDER BY finished_at LIMIT 5000) RETURNING *) "
        "INSERT INTO {h} ({cols}) SELECT {cols} FROM d")


def main():
    layouts = sys.argv[1].split(",")
    turns = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    if len(sys.argv) > 3 and sys.argv[3] == "keep":
        KEEP.append(True)
    conn = psycopg.connect(DSN, autocommit=True)
    conn.execute("SET synchronous_commit = off")
    conn.execute("SET max_parallel_workers_per_gather = 0")
    COLS.extend(columns(conn))
    meter = Meter(conn)
    results = {}
    for layout in layouts:
        sides = {}
        for side in (("b",) if KEEP else ("a", "b")):
            tables = create_layout(conn, layout, side)
            if side == "b":
                fill_b(conn, tables["insert"], tables.get("hist", tables["insert"]),
                       1_000_000, 100_000)
            settle(conn, tables.get("vac", tables["all"]), vacuum=True)
            base = conn.execute(f"SELECT coalesce((SELECT id::text FROM {tables['insert']} "
                                "ORDER BY id DESC LIMIT 1), '00000000-0000-0000-0000-000000000000')").fetchone()[0]
            if "hist" in tables:
                hb = conn.execute(f"SELECT id::text FROM {tables['hist']} ORDER BY id DESC LIMIT 1").fetchone()
                hb = hb[0] if hb else None
                if hb and hb > base:
                    base = hb
            sides[side] = (tables, base)
            sizes = {n: conn.execute("SELECT pg_size_pretty(pg_total_relation_size(%s))",
                                     (n,)).fetchone()[0] for n in tables.get("vac", tables["all"])}
            print(layout, side, "sizes", sizes, flush=True)
        order = ["a", "b", "b", "a", "a", "b", "b", "a"][: 2 * turns]
        if KEEP:
            order = ["b"] * turns
        for side in order:
            tables, base = sides[side]
            r = turn(conn, meter, layout, tables, base)
            results.setdefault(f"{layout}{side}", []).append(r)
            print(layout, side, json.dumps({k: (v if k == "drained" else
                  {"wal_per_task": round(v[0] / (2000 if k == 'single' else 18000 if k == 'bulk' else r['drained'])),
                   "fpi_per_task": round(v[1] / (2000 if k == 'single' else 18000 if k == 'bulk' else r['drained']), 3),
                   "cpu_us_per_task": round(v[3] * 1e6 / (2000 if k == 'single' else 18000 if k == 'bulk' else r['drained']))})
                  for k, v in r.items()}), flush=True)
    with open(f"/tmp/histexp/results-{'-'.join(layouts)}-{int(time.time())}.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
