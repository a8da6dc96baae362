"""How fast the operators' pages answer on a table of 1,000,000 tasks (PostgreSQL).

    .venv/bin/python bench/admin_timing.py                       # 1,000,000 rows
    .venv/bin/python bench/admin_timing.py --rows 200000 --runs 10
    .venv/bin/python bench/admin_timing.py --pg-url postgres://postgres@127.0.0.1:5432/postgres

It creates its own database (``rdbtasks_admin_bench``; ``--reuse`` keeps a
seeded one), migrates it, seeds the rows in one ``INSERT … SELECT
generate_series`` (30 days of history: mostly successful, some failed with
a traceback, a backlog of ready tasks, a few running and waiting ones),
ANALYZEs, then requests each page with Django's test client as a superuser
and prints a Markdown table: median, 95th percentile and slowest response,
and the number of SQL queries per page.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BENCH_DB = "rdbtasks_admin_bench"
QUEUES = ["default", "emails", "reports"]
TASK_PATHS = [
    "shop.tasks.send_invoice",
    "shop.tasks.send_receipt",
    "shop.tasks.sync_stock",
    "reports.tasks.nightly_report",
    "search.tasks.reindex_product",
]


def configure(pg_url: str) -> None:
    import django
    from django.conf import settings

    parts = urlsplit(pg_url)
    settings.configure(
        DEBUG=False,
        SECRET_KEY="bench",
        ALLOWED_HOSTS=["testserver"],
        USE_TZ=True,
        TIME_ZONE="UTC",
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": BENCH_DB,
                "USER": parts.username or "postgres",
                "PASSWORD": parts.password or "",
                "HOST": parts.hostname or "127.0.0.1",
                "PORT": parts.port or 5432,
            }
        },
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django.contrib.staticfiles",
            "django_rdbtasks",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.common.CommonMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            "django.contrib.messages.middleware.MessageMiddleware",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {
                    "context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages",
                    ]
                },
            }
        ],
        ROOT_URLCONF="tests.browser.urls",
        STATIC_URL="/static/",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        TASKS={
            "default": {
                "BACKEND": "django_rdbtasks.backend.RDBTaskBackend",
                "QUEUES": QUEUES,
            }
        },
    )
    django.setup()


def create_database(pg_url: str, reuse: bool) -> bool:
    """Create the bench database; True if an existing one is kept as it is."""
    import psycopg

    parts = urlsplit(pg_url)
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB]).fetchone()
        if exists and reuse:
            return True
        if exists:
            conn.execute(f'DROP DATABASE "{BENCH_DB}"')
        conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    return False


# -- seeding ------------------------------------------------------------------------------

TRACEBACK = (
    "Traceback (most recent call last):\\n"
    '  File "/srv/shop/tasks.py", line 41, in send_invoice\\n'
    "    gateway.send(invoice)\\n"
    "ConnectionError: SMTP server refused the connection"
)


def seed(rows: int) -> None:
    """Insert ``rows`` tasks spread over 30 days, newest last, in one statement."""
    from django.db import connection

    from django_rdbtasks.models import Task

    # Row g is enqueued (30 days) * (rows - g) / rows ago; its id is a UUIDv7 of that
    # time, so id order is enqueue order as in production.
    expressions = {
        "id": (
            "(lpad(to_hex((extract(epoch from t.at) * 1000)::bigint), 12, '0') || '7' "
            "|| substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid"
        ),
        "task_path": f"(ARRAY{TASK_PATHS!r})[1 + g % {len(TASK_PATHS)}]",
        "queue_name": f"(ARRAY{QUEUES!r})[1 + (g / 7) % {len(QUEUES)}]",
        "backend_name": "'default'",
        "priority": "(g % 3) * 10",
        "args": "jsonb_build_array(g)",
        "kwargs": "jsonb_build_object('invoice_id', g, 'notify', true)",
        "status": "s.status",
        "version": "CASE WHEN s.status = 'READY' THEN 0 ELSE 2 END",
        "worker_id": (
            "CASE WHEN s.status = 'READY' THEN '' "
            "ELSE 'web-' || (g % 4) || ':' || (1000 + g % 16) || ':0:bench' END"
        ),
        "lease_expires_at": (
            "CASE WHEN s.status = 'RUNNING' THEN now() + interval '30 seconds' END"
        ),
        "attempts": (
            "CASE s.status WHEN 'READY' THEN 0 WHEN 'WAITING' THEN 0 "
            "WHEN 'FAILED' THEN 3 ELSE 1 END"
        ),
        "max_attempts": "3",
        "enqueued_at": "t.at",
        "run_after": "t.at",
        "started_at": "CASE WHEN s.status IN ('READY', 'WAITING') THEN NULL ELSE t.at END",
        "last_attempted_at": ("CASE WHEN s.status IN ('READY', 'WAITING') THEN NULL ELSE t.at END"),
        "finished_at": (
            "CASE WHEN s.status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED') "
            "THEN t.at + (g % 900) * interval '1 millisecond' END"
        ),
        "return_value": "CASE WHEN s.status = 'SUCCESSFUL' THEN to_jsonb(g) END",
        "history": (
            "CASE WHEN s.status = 'FAILED' THEN jsonb_build_array("
            "jsonb_build_object('attempt', 1, 'outcome', 'RETRY', 'worker_id', 'web-1:1001:0:b',"
            " 'started_at', t.at, 'finished_at', t.at,"
            " 'exception_class_path', 'builtins.ConnectionError',"
            f" 'traceback', E'{TRACEBACK}'),"
            "jsonb_build_object('attempt', 3, 'outcome', 'FAILED', 'worker_id', 'web-2:1002:0:b',"
            " 'started_at', t.at, 'finished_at', t.at,"
            " 'exception_class_path', 'builtins.ConnectionError',"
            f" 'traceback', E'{TRACEBACK}'))"
            " WHEN s.status IN ('SUCCESSFUL', 'CANCELLED') THEN jsonb_build_array("
            "jsonb_build_object('attempt', 1, 'outcome', s.status, 'worker_id', 'web-1:1001:0:b',"
            " 'started_at', t.at, 'finished_at', t.at))"
            " ELSE '[]'::jsonb END"
        ),
        "job_name": "''",
    }
    columns, values = [], []
    for field in Task._meta.concrete_fields:
        if getattr(field, "generated", False):
            continue
        if field.column in expressions:
            columns.append(field.column)
            values.append(expressions[field.column])
        elif not field.null and not field.has_db_default():
            # A column added since this script was written: its Python default.
            columns.append(field.column)
            values.append(_literal(field.get_default()))
    # The newest 1,000 rows are READY (a backlog), 50 RUNNING, 200 WAITING; before
    # that 2 % FAILED, 0.5 % CANCELLED, the rest SUCCESSFUL.
    status = (
        f"CASE WHEN g > {rows} - 1000 THEN 'READY' "
        f"WHEN g > {rows} - 1050 THEN 'RUNNING' "
        f"WHEN g > {rows} - 1250 THEN 'WAITING' "
        "WHEN g % 50 = 0 THEN 'FAILED' WHEN g % 200 = 1 THEN 'CANCELLED' "
        "ELSE 'SUCCESSFUL' END"
    )
    sql = (
        f"INSERT INTO {Task._meta.db_table} ({', '.join(columns)}) "
        f"SELECT {', '.join(values)} FROM generate_series(1, {rows}) AS g, "
        f"LATERAL (SELECT now() - interval '30 days' * ({rows} - g) / {rows} AS at) AS t, "
        f"LATERAL (SELECT {status} AS status) AS s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        cursor.execute(f"ANALYZE {Task._meta.db_table}")


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list | dict):
        return f"'{json.dumps(value)}'::jsonb"
    return "'" + str(value).replace("'", "''") + "'"


# -- timing -------------------------------------------------------------------------------


def measure(request: Callable[[], Any], runs: int) -> dict[str, Any]:
    from django.core.signals import request_started
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    request()  # warm caches (templates, the first connection)
    times = []
    # Django clears the query log when a request starts; keep this one's.
    request_started.disconnect(reset_queries)
    try:
        with CaptureQueriesContext(connection) as queries:
            response = request()
    finally:
        request_started.connect(reset_queries)
    captured = list(queries.captured_queries)  # later requests clear the log
    for _ in range(runs):
        start = time.perf_counter()
        request()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    status = getattr(response, "status_code", 0)
    return {
        "status": status,
        "median_ms": statistics.median(times),
        "p95_ms": times[max(0, round(0.95 * len(times)) - 1)],
        "max_ms": times[-1],
        "queries": len(captured),
        "slowest_query_ms": max((float(q["time"]) * 1000 for q in captured), default=0.0),
        "slowest_query": max(captured, key=lambda q: float(q["time"]), default={}).get("sql", ""),
    }


def pages(client: Any) -> dict[str, Callable[[], Any]]:
    from django.core.management import call_command

    from django_rdbtasks.models import Task, TaskStatus

    failed = (
        Task.objects.filter(status=TaskStatus.FAILED)
        .order_by("-pk")
        .values_list("pk", flat=True)[0]
    )
    base = "/admin/django_rdbtasks/task/"

    def get(path: str) -> Callable[[], Any]:
        return lambda: client.get(path)

    def status_command() -> Any:
        from io import StringIO

        out = StringIO()
        call_command("rdbtasks", "status", "--json", stdout=out)
        return type("Done", (), {"status_code": 200})()

    return {
        "task list": get(base),
        "task list, status = FAILED": get(f"{base}?status=FAILED"),
        "task list, READY in one queue": get(f"{base}?status=READY&queue=emails"),
        "task list, finished in the last hour": get(f"{base}?finished=1h"),
        "task list, one task": get(f"{base}?task=shop.tasks.sync_stock"),
        "task list, search a task path": get(f"{base}?q=reindex"),
        "worst case: filters matching nothing": get(
            f"{base}?status=CANCELLED&task=reports.tasks.nightly_report"
        ),
        "worst case: search matching nothing": get(f"{base}?q=no-such-task"),
        "task list, page 200": get(f"{base}?p=200"),
        "failed task page (history)": get(f"{base}{failed}/change/"),
        "dashboard": get(f"{base}dashboard/"),
        "dashboard, 24 hours": get(f"{base}dashboard/?range=24h"),
        "dashboard, 7 days": get(f"{base}dashboard/?range=7d"),
        "retry all failed (confirmation)": get(f"{base}retry-failed/?window=24h"),
        "rdbtasks status --json": status_command,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=20, help="timed requests per page")
    parser.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--reuse", action="store_true", help="keep an already seeded database")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--only",
        action="append",
        metavar="WORDS",
        help="time only the pages whose name contains WORDS; repeatable",
    )
    parser.add_argument(
        "--proposed-index",
        action="store_true",
        help="first create the partial index on WAITING rows that docs/admin.md proposes",
    )
    args = parser.parse_args()

    reused = create_database(args.pg_url, args.reuse)
    configure(args.pg_url)
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client

    from django_rdbtasks.models import Task

    call_command("migrate", verbosity=0)
    if not reused or not Task.objects.exists():
        started = time.perf_counter()
        seed(args.rows)
        print(
            f"seeded {args.rows:,} tasks in {time.perf_counter() - started:.1f} s", file=sys.stderr
        )
    if args.proposed_index:
        from django.db import connection as db

        with db.cursor() as cursor:
            cursor.execute(
                "CREATE INDEX IF NOT EXISTS rdbtasks_task_waiting "
                "ON django_rdbtasks_task (queue_name) WHERE status = 'WAITING'"
            )
    user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", password="bench"
    )
    client = Client()
    client.force_login(user)

    import django
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]
    chosen = {
        name: request
        for name, request in pages(client).items()
        if not args.only or any(words in name for words in args.only)
    }
    results = {name: measure(request, args.runs) for name, request in chosen.items()}
    rows = Task.objects.count()
    print(
        f"\n{rows:,} task rows; PostgreSQL {server}; Django {django.get_version()}; "
        f"{args.runs} requests per page after one warm-up.\n"
    )
    print("| page | median | p95 | slowest | queries | slowest query |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        assert r["status"] == 200, (name, r["status"])
        print(
            f"| {name} | {r['median_ms']:.1f} ms | {r['p95_ms']:.1f} ms | {r['max_ms']:.1f} ms "
            f"| {r['queries']} | {r['slowest_query_ms']:.1f} ms |"
        )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "results": results}, indent=2))


if __name__ == "__main__":
    main()
