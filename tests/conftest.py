from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_rdbtasks.db import forget_what_claims_learnt

ROOT = Path(__file__).resolve().parent.parent


def listen_connection() -> BaseDatabaseWrapper:
    """LISTEN needs the server itself: behind a pooler, the alias that bypasses it."""
    return connections["direct"] if "direct" in connections else connection


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--clusters",
        action="store_true",
        help="Run only the tests marked 'cluster', which start servers of their own "
        "(make test-clusters); without it they are deselected.",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The cluster tests start real servers and take minutes: CI runs them once,
    # on one Django line (make test-clusters), not in every database cell.
    clusters = config.getoption("--clusters")
    keep = [item for item in items if (item.get_closest_marker("cluster") is not None) == clusters]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


def pytest_report_header(config: pytest.Config) -> str:
    import django

    return f"database: {connection.vendor}, Django {django.get_version()}"


def in_new_thread(function: Callable[[], Any]) -> Any:
    """``function()`` in a fresh thread, its result or its exception: worker
    connections belong to the thread that opened them."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = function()
        except BaseException as exc:  # reported in the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(60)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def wait_until(predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05):
    """Poll ``predicate`` until it returns something true; fail the test on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {predicate.__name__}")
        time.sleep(interval)


class WorkerProcess:
    """``manage.py runworkers`` in a real process against the test database."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        *,
        new_session: bool = False,
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
    ) -> None:
        # ``prefix`` runs the command through another, e.g. ``ip netns exec NS``
        # (which execs it: the process is still ``pid``).
        # ``env`` overrides, e.g. another DATABASE_URL or DJANGO_SETTINGS_MODULE
        # for workers that connect through a pooler or to a cluster.
        env = {
            **os.environ,
            "RDBTASKS_TEST_WORKER": "1",
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            **(env or {}),
        }
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.process = subprocess.Popen(
            [*(prefix or []), sys.executable, "-m", "django", "runworkers", *args],
            env=env,
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # A process group of its own, for tests that signal the whole group.
            start_new_session=new_session,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 120.0) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self._log.close()

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            for child in _children(self.pid):
                _kill(child)
            _kill(self.pid)
            self.process.wait(10)
        self._log.close()


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def worker_children(supervisor_pid: int) -> list[int]:
    return _children(supervisor_pid)


@pytest.fixture
def run_workers(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []
    counter = iter(range(1000))

    def start(
        *args: str,
        new_session: bool = False,
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
    ) -> WorkerProcess:
        worker = WorkerProcess(
            list(args),
            tmp_path / f"worker-{next(counter)}.log",
            new_session=new_session,
            env=env,
            prefix=prefix,
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def vendor() -> str:
    return connection.vendor


def tables_holding(task_id: object) -> list[str]:
    """PostgreSQL: the tables that hold this task's row, each read alone (``ONLY``):
    ``task`` while it is to run, ``finished`` once moved (db/postgresql/finished.py)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 'task' FROM ONLY django_rdbtasks_task WHERE id = %s UNION ALL "
            "SELECT 'finished' FROM ONLY django_rdbtasks_finishedtask WHERE id = %s",
            [task_id, task_id],
        )
        return [row[0] for row in cursor.fetchall()]


def rows_by_table() -> dict[str, int]:
    """PostgreSQL: how many task rows each of the two tables holds, each read alone."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM ONLY django_rdbtasks_task), "
            "(SELECT count(*) FROM ONLY django_rdbtasks_finishedtask)"
        )
        task, finished = cursor.fetchone()
        return {"task": task, "finished": finished}


@pytest.fixture(autouse=True)
def claims_start_afresh() -> Iterator[None]:
    """What a test's claims learnt (a form, lost races) is not the next test's."""
    yield
    forget_what_claims_learnt()


@pytest.fixture(scope="session", autouse=True)
def database_features_known(django_db_setup, django_db_blocker):
    """Run the system checks on every connection once, before any test runs.

    Django 6.1 runs the model checks against every database alias by default,
    and some ask the connection what it supports (JSON, MySQL's server version):
    a query, the first time each is asked, cached on the connection after. A
    test without database access that runs the checks (``call_command(
    "runworkers", ...)`` refusing its options) failed with "Database access not
    allowed" when it ran before any test had touched that alias: the
    ``replica`` mirror alias, which few tests use.
    """
    from django.core import checks

    with django_db_blocker.unblock():
        checks.run_checks(databases=list(connections))


@contextmanager
def held_snapshot(application: str = "rdbtasks-test-holder") -> Iterator[Any]:
    """A second connection to the test database with a transaction open and a
    snapshot taken (REPEATABLE READ, then idle): what a console left open, a
    report or ``pg_dump`` is to vacuum. Yields its session's id as the reports
    name it (the backend's pid, the thread id); rolled back and closed on exit.
    PostgreSQL and MySQL/MariaDB only. On MySQL/MariaDB other databases'
    transactions on the same server are holders too (InnoDB purges for all of
    them at once): look for this one."""
    settings = connection.settings_dict
    if connection.vendor == "postgresql":
        import psycopg

        other = psycopg.connect(
            host=settings["HOST"] or None,
            port=settings["PORT"] or None,
            user=settings["USER"] or None,
            password=settings["PASSWORD"] or None,
            dbname=settings["NAME"],
            application_name=application,
        )
        other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        # The server's process, asked inside the transaction: through a
        # transaction pooler the connection's own backend_pid is PgBouncer's
        # cancel key, and the server session is the one the transaction holds.
        # (Before the snapshot's read, which the reports show as its last query.)
        server_pid = other.execute("SELECT pg_backend_pid()").fetchone()[0]
        other.execute("SELECT count(*) FROM django_rdbtasks_task").fetchone()
    else:
        import MySQLdb

        other = MySQLdb.connect(
            host=settings["HOST"] or "127.0.0.1",
            port=int(settings["PORT"] or 3306),
            user=settings["USER"],
            password=settings["PASSWORD"] or "",
            database=settings["NAME"],
        )
        cursor = other.cursor()
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        cursor.execute("SELECT count(*) FROM django_rdbtasks_task")
        cursor.fetchall()
    session = server_pid if connection.vendor == "postgresql" else other.thread_id()
    try:
        yield str(session)
    finally:
        other.rollback()
        other.close()
