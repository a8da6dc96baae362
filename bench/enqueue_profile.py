"""Enqueue micro-benchmark and profiler for django-rdbtasks, against PostgreSQL.

Prints tasks/s for three ways of enqueueing a no-op task:

- ``single``: ``task.enqueue()`` in autocommit, one transaction per call (what a web
  request that starts one task pays);
- ``txn``: many ``task.enqueue()`` calls inside one ``transaction.atomic()``;
- ``bulk``: ``bulk_enqueue()``, ``--chunk`` tasks per call, each call its own transaction.

and, to show how close they are to what the server allows, four floors on the
same connection, each statement its own transaction, no Django in the loop:

- ``roundtrip``: ``SELECT 1``, a round trip without a commit;
- ``insert``: a one-column ``INSERT``, the cheapest durable commit;
- ``function``: the enqueue function's call with ``single``'s row, from psycopg;
- ``copy``: ``bulk``'s rows, their COPY text made beforehand, ``--chunk`` rows a
  COPY and a commit: what the server takes to write our rows with their indexes.

With the server on this machine, each mode also shows its CPU per task (from
``/proc``): a floor's is the server's least for that work.

It uses a database of its own (``bench_enqueue`` by default, created and migrated if
missing, emptied between runs), never the test database. Examples::

    .venv/bin/python bench/enqueue_profile.py
    .venv/bin/python bench/enqueue_profile.py --count 5000 --repeat 5
    .venv/bin/python bench/enqueue_profile.py --modes roundtrip,insert,function,single
    .venv/bin/python bench/enqueue_profile.py --modes single --profile /tmp/single.prof
    .venv-dj61/bin/python bench/enqueue_profile.py     # the Django 6.1 line

``--profile FILE`` runs the first mode under cProfile and writes the stats there
(``python -m pstats FILE``) after printing the 25 most expensive calls.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def database_settings(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise SystemExit(f"--db-url must be a postgres:// URL, not {url!r}")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/") or "bench_enqueue",
        "HOST": parts.hostname or "127.0.0.1",
        "PORT": str(parts.port or 5432),
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or os.environ.get("PGPASSWORD", "")),
    }


def create_database(db: dict[str, Any]) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(
        host=db["HOST"],
        port=db["PORT"],
        user=db["USER"],
        password=db["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    ) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]])
        if not exists.fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))


def setup(url: str) -> None:
    import django
    from django.conf import settings

    db = database_settings(url)
    if db["NAME"] in {"test", "postgres"} or db["NAME"].startswith("test_"):
        raise SystemExit(f"refusing to benchmark in the shared database {db['NAME']!r}")
    create_database(db)
    settings.configure(
        DEBUG=False,  # DEBUG would record every query
        USE_TZ=True,
        SECRET_KEY="bench-only",
        INSTALLED_APPS=["django_rdbtasks"],
        RDBTASKS_TASK_MODULES=["bench.enqueue_task"],
        DATABASES={"default": db},
        TASKS={
            "default": {
                "BACKEND": "django_rdbtasks.backend.RDBTaskBackend",
                "QUEUES": ["default"],
            }
        },
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        LOGGING_CONFIG=None,
    )
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def server_cpu() -> float | None:
    """CPU seconds of this connection's server process so far, if it runs on this machine.

    From ``/proc/<pid>/stat`` (user + system time, in clock ticks): what the
    enqueue costs the server, beside the client's own ``process_time()``.
    """
    from django.db import connection

    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:  # another machine's, or behind a pooler
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: The floors' table: one column, its primary key.
FLOOR_TABLE = "rdbtasks_bench_floor"


def empty_table() -> None:
    from django.db import connection

    from django_rdbtasks.models import Task

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {connection.ops.quote_name(Task._meta.db_table)} CASCADE")
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} (id uuid PRIMARY KEY)")
        cursor.execute(f"TRUNCATE {FLOOR_TABLE}")
        cursor.execute("CHECKPOINT")


def modes(task: Any, count: int, chunk: int) -> dict[str, Callable[[], None]]:
    from django.db import transaction

    from django_rdbtasks.backend import bulk_enqueue

    def single() -> None:
        for _ in range(count):
            task.enqueue()

    def txn() -> None:
        with transaction.atomic():
            for _ in range(count):
                task.enqueue()

    calls = [((), {})] * chunk

    def bulk() -> None:
        for _ in range(max(1, count * 10 // chunk)):
            bulk_enqueue(task, calls, batch_size=chunk)

    return {"single": single, "txn": txn, "bulk": bulk, **floors(count, chunk)}


def floors(count: int, chunk: int) -> dict[str, Callable[[], None]]:
    import uuid

    import psycopg
    from django.db import connection

    from django_rdbtasks.db import dialect_for
    from django_rdbtasks.db.rows import new_ids
    from django_rdbtasks.models import Task, TaskStatus, uuid7

    def cursor() -> psycopg.Cursor:
        # Parameters bound on the server, as the enqueue's kept cursor binds them.
        connection.ensure_connection()
        return psycopg.Cursor(connection.connection)

    def roundtrip() -> None:
        with cursor() as cur:
            for _ in range(count):
                cur.execute("SELECT 1")

    def insert() -> None:
        with cursor() as cur:
            for _ in range(count):
                cur.execute(f"INSERT INTO {FLOOR_TABLE} (id) VALUES (%s)", [uuid.uuid4()])

    def function() -> None:
        sql = dialect_for(connection).inserts.enqueue_call_sql
        path = "bench.enqueue_task.noop"
        row = [path, "default", "default", 0, "[]", "{}", 1, None, TaskStatus.READY]
        rest = ["", None, 0, TaskStatus.CANCELLED, None, True]
        with cursor() as cur:
            for _ in range(count):
                cur.execute(sql, [uuid7(), *row, *rest])

    # The columns and values bulk_enqueue's COPY writes for bench.enqueue_task.noop.
    columns = (
        "id, args, kwargs, task_path, queue_name, backend_name, priority, max_attempts, "
        "status, version, worker_id, attempts, history, job_name, waiting_on, "
        "on_parent_failure, trace_context"
    )
    values = ["bench.enqueue_task.noop", "default", "default", "0", "3", "READY", "0", ""]
    values += ["0", "[]", "", "0", "CANCELLED", "\\N"]
    shared = "\t" + "\t".join(values) + "\n"
    blocks = [
        "".join(f"{row_id}\t[]\t{{}}{shared}" for row_id in new_ids(chunk))
        for _ in range(max(1, count * 10 // chunk))
    ]
    statement = f"COPY {connection.ops.quote_name(Task._meta.db_table)} ({columns}) FROM STDIN"

    def copy() -> None:
        with cursor() as cur:
            for block in blocks:
                with cur.connection.transaction(), cur.copy(statement) as copying:
                    copying.write(block)

    return {"roundtrip": roundtrip, "insert": insert, "function": function, "copy": copy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--db-url",
        default=os.environ.get(
            "BENCH_ENQUEUE_URL", "postgres://postgres@127.0.0.1:5432/bench_enqueue"
        ),
    )
    parser.add_argument("--count", type=int, default=2000, help="tasks per run (bulk: 10x)")
    parser.add_argument("--chunk", type=int, default=1000, help="tasks per bulk_enqueue call")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode; the median is shown")
    parser.add_argument("--modes", default="single,txn,bulk")
    parser.add_argument("--profile", metavar="FILE", help="cProfile the first mode into FILE")
    args = parser.parse_args()

    setup(args.db_url)
    import django

    from bench.enqueue_task import noop as noop_task

    runs = modes(noop_task, args.count, args.chunk)
    selected = [m.strip() for m in args.modes.split(",") if m.strip()]
    print(f"Django {django.get_version()}, Python {sys.version.split()[0]}, {args.db_url}")

    # Warm up: the connection, the dialect's statements, the first planning.
    empty_table()
    for _ in range(50):
        noop_task.enqueue()

    if args.profile:
        mode = selected[0]
        empty_table()
        profiler = cProfile.Profile()
        profiler.enable()
        runs[mode]()
        profiler.disable()
        profiler.dump_stats(args.profile)
        stats = pstats.Stats(args.profile)
        stats.sort_stats("cumulative").print_stats(25)
        stats.sort_stats("tottime").print_stats(25)
        return

    # Wall time is what a producer waits; this process's CPU time per task is
    # the Python side alone, and holds still when other work loads the machine;
    # the server's, where it runs here, the database's side (commits' fsync
    # excluded: that is the disk's time, in the wall time only).
    # The modes take turns, so that a slow minute of the disk hits all of them.
    rates: dict[str, list[float]] = {mode: [] for mode in selected}
    cpu: dict[str, list[float]] = {mode: [] for mode in selected}
    server: dict[str, list[float]] = {mode: [] for mode in selected}
    for _ in range(args.repeat):
        for mode in selected:
            empty_table()
            tasks = (
                args.count * 10 // args.chunk * args.chunk
                if mode in {"bulk", "copy"}
                else args.count
            )
            start_server = server_cpu()
            start, start_cpu = time.perf_counter(), time.process_time()
            runs[mode]()
            rates[mode].append(tasks / (time.perf_counter() - start))
            cpu[mode].append((time.process_time() - start_cpu) / tasks * 1e6)
            end_server = server_cpu()
            if start_server is not None and end_server is not None:
                server[mode].append((end_server - start_server) / tasks * 1e6)
    for mode in selected:
        rate = statistics.median(rates[mode])
        shown = ", ".join(f"{r:,.0f}" for r in rates[mode])
        on_server = (
            f"server CPU {statistics.median(server[mode]):5.1f} us   " if server[mode] else ""
        )
        print(
            f"{mode:>9}: {rate:>8,.0f}/s  {1e6 / rate:6.0f} us each   "
            f"client CPU {statistics.median(cpu[mode]):5.1f} us   {on_server}(runs: {shown})"
        )
    empty_table()


if __name__ == "__main__":
    main()
