"""Producers and workers through a real PgBouncer in transaction pooling mode.

Between two of our transactions PgBouncer hands the server session to another
client, so nothing may live in a session: no SET, no prepared statement, no
LISTEN. PgBouncer 1.18 (Debian 12) does not track prepared statements at all,
so any the code prepared would fail loudly here.

Three checks: the test suite itself run through the pooler (every feature:
enqueue, claim, complete, heartbeats, progress, cancel, once(), locks, jobs,
the admin), a multi-process drain that counts server connections and side
effects and then inspects every pooled server session for leftovers, and the
LISTEN fallback. Run with ``make test-clusters`` (``--clusters``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from django_rdbtasks.models import Task
from scripts.clusters import pgbouncer
from tests.conftest import ROOT, wait_until
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PORT = int(os.environ.get("RDBTASKS_TEST_PGBOUNCER_PORT", "6439"))
POOL_SIZE = 4
#: Every server connection of the pooler logs in as this role, so the
#: server's pg_stat_activity tells them from everyone else's.
SERVER_USER = "rdbtasks_pooled"


def direct_params(dbname: str) -> dict[str, object]:
    db = settings.DATABASES["default"]
    return {
        "host": db["HOST"] or "127.0.0.1",
        "port": int(db["PORT"] or 5432),
        "user": db["USER"] or "postgres",
        "dbname": dbname,
        "autocommit": True,
    }


@pytest.fixture(scope="module")
def bouncer() -> Iterator[pgbouncer.Bouncer]:
    if connection.vendor != "postgresql":
        pytest.fail("tests/test_pgbouncer.py runs on PostgreSQL: DATABASE_URL=postgres://...")
    with psycopg.connect(**direct_params("postgres")) as admin:
        exists = admin.execute(
            "SELECT 1 FROM pg_roles WHERE rolname = %s", [SERVER_USER]
        ).fetchone()
        if not exists:
            admin.execute(f"CREATE ROLE {SERVER_USER} LOGIN SUPERUSER")
    # Not under pytest's tmp dir: PgBouncer runs as the postgres user, who
    # cannot reach into root's private directories.
    directory = tempfile.mkdtemp(prefix="rdbtasks-pgbouncer-")
    try:
        started = pgbouncer.start(
            directory,
            port=PORT,
            pool_size=POOL_SIZE,
            server_port=int(settings.DATABASES["default"]["PORT"] or 5432),
            server_user=SERVER_USER,
        )
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"could not start PgBouncer (apt-get install pgbouncer): {exc}")
    try:
        yield started
    finally:
        # Before the test database is dropped: the pool holds sessions in it.
        pgbouncer.stop(directory)
        shutil.rmtree(directory, ignore_errors=True)


def pooled_env(bouncer: pgbouncer.Bouncer, *, listen_database: bool = True) -> dict[str, str]:
    """Worker processes: the task database through the pooler, LISTEN straight to the server."""
    env = {
        "DATABASE_URL": bouncer.url("test"),
        "RDBTASKS_TEST_DIRECT_URL": os.environ["DATABASE_URL"],
    }
    if not listen_database:
        env["RDBTASKS_TEST_POLL_ONLY"] = "1"
    return env


def server_sessions(dbname: str) -> int:
    with psycopg.connect(**direct_params("postgres")) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND datname = %s",
            [SERVER_USER, dbname],
        ).fetchone()
    assert row is not None
    return int(row[0])


def pooler_clients(bouncer: pgbouncer.Bouncer) -> int:
    # The admin console speaks only the simple query protocol.
    with psycopg.connect(
        host="127.0.0.1", port=bouncer.port, user="postgres", dbname="pgbouncer", autocommit=True
    ) as console:
        cursor = psycopg.ClientCursor(console)
        cursor.execute("SHOW CLIENTS")
        assert cursor.description is not None
        database = [column.name for column in cursor.description].index("database")
        name = settings.DATABASES["default"]["NAME"]
        return sum(1 for row in cursor.fetchall() if row[database] == name)


class Sampler(threading.Thread):
    """The most server sessions and pooler clients seen at once, sampled until stopped."""

    def __init__(self, bouncer: pgbouncer.Bouncer, dbname: str) -> None:
        super().__init__(daemon=True)
        self.bouncer, self.dbname = bouncer, dbname
        self.max_sessions = self.max_clients = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.05):
            self.max_sessions = max(self.max_sessions, server_sessions(self.dbname))
            self.max_clients = max(self.max_clients, pooler_clients(self.bouncer))


@pytest.mark.django_db(transaction=True)
def test_workers_through_the_pooler_share_its_server_sessions_and_leave_nothing_in_them(
    bouncer, run_workers
):
    dbname = settings.DATABASES["default"]["NAME"]
    count = 3000
    for i in range(count):
        tasks.record.enqueue(f"k{i}")
    sampler = Sampler(bouncer, dbname)
    sampler.start()
    try:
        workers = [
            run_workers(
                "--processes",
                "1",
                "--threads",
                "3",
                "--burst",
                "--no-scheduler",
                env=pooled_env(bouncer),
            )
            for _ in range(3)
        ]
        for worker in workers:
            assert worker.wait(240) == 0, worker.log()
    finally:
        sampler.halt.set()
        sampler.join(5)
    # Every task ran once: no crash here, so at-least-once means exactly once.
    assert SideEffect.objects.count() == count
    assert SideEffect.objects.values("key").distinct().count() == count
    # Three processes of three threads had many more clients than the pool has sessions.
    assert sampler.max_clients > POOL_SIZE
    assert 0 < sampler.max_sessions <= POOL_SIZE
    logs = "".join(worker.log() for worker in workers)
    assert "polling" not in logs  # LISTEN went straight to the server

    assert_pooled_sessions_are_as_new(bouncer, dbname)


def assert_pooled_sessions_are_as_new(bouncer: pgbouncer.Bouncer, dbname: str) -> None:
    """Every pooled session, held at once by one client each, is as a new one."""
    held = [psycopg.connect(bouncer.url(dbname)) for _ in range(POOL_SIZE)]
    try:
        pids = set()
        for conn in held:  # each in an open transaction: one server session each
            row = conn.execute(
                "SELECT pg_backend_pid(), current_setting('lock_timeout'), "
                "current_setting('idle_in_transaction_session_timeout'), "
                "(SELECT count(*) FROM pg_prepared_statements), "
                "current_setting('jit') = (SELECT reset_val FROM pg_settings WHERE name = 'jit')"
            ).fetchone()
            assert row is not None
            pid, lock_timeout, idle_timeout, prepared, jit_as_configured = row
            pids.add(pid)
            assert (lock_timeout, idle_timeout, prepared, jit_as_configured) == ("0", "0", 0, True)
        assert len(pids) == POOL_SIZE
    finally:
        for conn in held:
            conn.close()


#: Producer threads in a process whose backend is not told of the pooler.
UNTOLD_PRODUCERS = """
import sys, threading
import django
django.setup()
from django.db import connection
from django_rdbtasks.compat import task_backends
from tests.testapp import tasks
assert task_backends["default"].prepare, "TRANSACTION_POOLING is set"
errors = []
def produce(number):
    try:
        for i in range(int(sys.argv[2])):
            tasks.record.enqueue(f"p{number}-{i}")
    except BaseException as exc:
        errors.append(repr(exc))
    finally:
        connection.close()
threads = [threading.Thread(target=produce, args=(n,)) for n in range(int(sys.argv[1]))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(errors)
sys.exit(1 if errors else 0)
"""


@pytest.mark.django_db(transaction=True)
def test_producers_not_told_of_the_pooler_prepare_nothing_through_it(bouncer):
    # Without TRANSACTION_POOLING an enqueue keeps its statement prepared in
    # the session from its second run, but only in a session that is the
    # server's own: through the pooler the connection's process id is
    # PgBouncer's, not the server's, and nothing is prepared.
    dbname = settings.DATABASES["default"]["NAME"]
    producers, each = 2 * POOL_SIZE, 100
    env = {
        **os.environ,
        "DATABASE_URL": bouncer.url("test"),
        "RDBTASKS_TEST_WORKER": "1",  # the test database, by its name
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(ROOT),
    }
    result = subprocess.run(
        [sys.executable, "-c", UNTOLD_PRODUCERS, str(producers), str(each)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert Task.objects.count() == producers * each
    assert Task.objects.values("args").distinct().count() == producers * each
    assert_pooled_sessions_are_as_new(bouncer, dbname)


@pytest.mark.django_db(transaction=True)
def test_without_a_listen_database_workers_poll_and_say_so_once(bouncer, run_workers):
    worker = run_workers(
        "--processes",
        "1",
        "--threads",
        "2",
        "--no-scheduler",
        "--poll-interval",
        "0.2",
        env=pooled_env(bouncer, listen_database=False),
    )
    tasks.record.enqueue("polled")
    wait_until(lambda: SideEffect.objects.filter(key="polled").exists(), timeout=60)
    worker.stop()
    log = worker.log()
    assert log.count("LISTEN cannot go through a transaction pooler") == 1, log


@pytest.mark.django_db(transaction=True)
def test_with_a_listen_database_the_listener_connects_straight_to_the_server(bouncer, run_workers):
    dbname = settings.DATABASES["default"]["NAME"]
    # Polls once at start, then not for five minutes: only NOTIFY can wake it in time.
    worker = run_workers(
        "--processes", "1", "--no-scheduler", "--poll-interval", "300", env=pooled_env(bouncer)
    )

    def listening_sessions() -> list[tuple[str, str]]:
        with psycopg.connect(**direct_params("postgres")) as admin:
            return admin.execute(
                "SELECT usename, query FROM pg_stat_activity "
                "WHERE datname = %s AND query LIKE 'LISTEN%%'",
                [dbname],
            ).fetchall()

    found = wait_until(listening_sessions, timeout=60)
    # Not through the pooler, whose sessions log in as SERVER_USER.
    assert [user for user, _ in found] == [settings.DATABASES["default"]["USER"] or "postgres"]
    tasks.record.enqueue("woken")
    wait_until(lambda: SideEffect.objects.filter(key="woken").exists(), timeout=60)
    worker.stop()


# The suite's own tests of every feature, run again through the pooler.
THROUGH_THE_POOLER = [
    "tests/test_backend.py",  # enqueue, bulk, results, cancel, NOTIFY through the pooler
    "tests/test_worker.py",  # claim, complete, retries, leases, recycling
    "tests/test_context.py",  # progress, checkpoints
    "tests/test_locks.py",  # LeasedLock and singleton
    "tests/test_idempotency.py",  # once(), JobRecord
    "tests/test_jobs.py",
    "tests/test_scheduler.py",
    "tests/test_dependencies.py",
    "tests/test_sagas.py",  # compensations enqueued in the worker's transaction
    "tests/test_connection.py",  # the worker's bounds, per transaction here
    "tests/test_db.py",
    "tests/test_snapshots.py",
    "tests/test_bulk_requeue.py",
    "tests/test_commands.py",
    "tests/test_admin_tasks.py",
    "tests/test_admin_jobs.py",
    "tests/test_admin_dashboard.py",
    "tests/test_limits.py",  # the limits' slots, taken and freed in pooled transactions
]


def test_the_features_tests_pass_through_the_pooler(bouncer, tmp_path: Path):
    test_db = "test_rdbtasks_pooled"
    with psycopg.connect(**direct_params("postgres")) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {test_db} WITH (FORCE)")
    env = {
        **os.environ,
        **pooled_env(bouncer),
        "RDBTASKS_TEST_DB": test_db,
        "PYTHONPATH": str(ROOT),
    }
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                # pytest-django would drop the database through the pooler, which
                # holds sessions in it: it is dropped straight on the server below.
                "--reuse-db",
                # The multi-process races through the pooler are the drain above.
                "-m",
                "not slow",
                *THROUGH_THE_POOLER,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        with psycopg.connect(**direct_params("postgres")) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {test_db} WITH (FORCE)")
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr[-5000:]
    assert " passed" in result.stdout.strip().splitlines()[-1], result.stdout[-2000:]
