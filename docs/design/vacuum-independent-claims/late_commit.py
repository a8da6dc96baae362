"""A late commit under a bounded read, and the notification that finds it.

On the real schema: producer A enqueues in a transaction it keeps open;
producer B enqueues and commits; a lane's bounded read claims B's task and its
bound passes A's ``run_after``; A commits. The bounded read from the lane's
bound misses A's task; from the start A's notification carries
(``transaction_timestamp()``) it finds it.

    python late_commit.py --dsn postgresql://postgres@127.0.0.1:5432/design43
"""

from __future__ import annotations

import argparse
import time
import uuid

import psycopg

INSERT = (
    "INSERT INTO django_rdbtasks_task (id, task_path, queue_name, backend_name, priority, args, "
    "kwargs, max_attempts, status, version, worker_id, attempts, history, job_name) "
    "VALUES (%s, 'late', 'late', 'default', 0, '[]', '{}', 1, 'READY', 0, '', 0, '[]', '') "
    "RETURNING run_after"
)
NOTIFY = (
    "SELECT pg_notify('rdbtasks_ready', concat_ws(chr(31), 'late', '0', "
    "(extract(epoch FROM transaction_timestamp()) * 1000000)::bigint))"
)
BOUNDED = (
    "SELECT id, run_after FROM ONLY django_rdbtasks_task WHERE status = 'READY' "
    "AND queue_name = 'late' AND limit_key IS NULL AND requested_run_after IS NULL "
    "AND started_at IS NULL AND priority = 0 AND run_after >= %s "
    "AND run_after <= statement_timestamp() ORDER BY run_after LIMIT 10"
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    dsn = ap.parse_args().dsn
    lane = psycopg.connect(dsn, autocommit=True)
    lane.execute("DELETE FROM django_rdbtasks_task WHERE queue_name = 'late'")
    listener = psycopg.connect(dsn, autocommit=True)
    listener.execute("LISTEN rdbtasks_ready")
    a = psycopg.connect(dsn)
    (a_run_after,) = a.execute(INSERT, [uuid.uuid4()]).fetchone()
    a.execute(NOTIFY)
    time.sleep(0.05)
    b = psycopg.connect(dsn)
    b.execute(INSERT, [uuid.uuid4()])
    b.execute(NOTIFY)
    b.commit()
    rows = lane.execute(BOUNDED, ["-infinity"]).fetchall()
    print(f"read 1 (unbounded at start): {len(rows)} row(s), B's only; A's run_after {a_run_after}")
    bound = rows[-1][1]  # the lane won B's row: its bound passes A's run_after
    lane.execute(
        "UPDATE django_rdbtasks_task SET status = 'RUNNING', started_at = now() WHERE id = %s",
        [rows[-1][0]],
    )
    a.commit()
    print(f"A committed; the lane's bound {bound}")
    rows = lane.execute(BOUNDED, [bound]).fetchall()
    print(f"read 2 from the lane's bound: {len(rows)} row(s)")
    low = None
    for note in listener.notifies(timeout=0.5):
        queue, priority, micros = note.payload.split("\x1f")
        low = min(low or int(micros), int(micros))
    start = lane.execute("SELECT to_timestamp(%s / 1e6)", [low]).fetchone()[0]
    rows = lane.execute(BOUNDED, [min(bound, start)]).fetchall()
    print(f"read 3 from min(bound, lowest notified start {start}): {len(rows)} row(s)")
    lane.execute("DELETE FROM django_rdbtasks_task WHERE queue_name = 'late'")


if __name__ == "__main__":
    main()
