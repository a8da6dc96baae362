"""``manage.py rdbtasks probe live|ready`` against real worker processes and real
(and unreachable, and silent) databases, each probe in a process of its own as
the kubelet runs it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder

from django_rdbtasks.models import Worker
from tests.browser.support import make_worker
from tests.conftest import ROOT, wait_until, worker_children

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HOST = socket.gethostname()


def probe(*args: str, database_url: str | None = None) -> tuple[int, str]:
    """Run a probe as the kubelet would: a fresh process; its exit code and output."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    if database_url is None:
        env["RDBTASKS_TEST_WORKER"] = "1"  # the test database
    else:
        env["DATABASE_URL"] = database_url
        env.pop("RDBTASKS_TEST_WORKER", None)
    done = subprocess.run(
        [sys.executable, "-m", "django", "rdbtasks", "probe", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr


def unreachable_url(port: int = 1) -> str:
    """A database URL of this test's vendor that nothing answers at."""
    if connection.vendor == "postgresql":
        return f"postgres://postgres@127.0.0.1:{port}/test"
    if connection.vendor == "mysql":
        return f"mysql://root@127.0.0.1:{port}/test"
    return "sqlite:////nonexistent-directory/rdbtasks.sqlite3"


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts TCP connections and never says a word (a hung server)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def start_worker(run_workers):
    # Heartbeats every lease / 3 = 0.5 s.
    supervisor = run_workers("--lease", "1.5", "--no-scheduler", "--poll-interval", "0.2")
    (child,) = wait_until(lambda: worker_children(supervisor.pid))
    wait_until(lambda: Worker.objects.filter(pid=child, host=HOST).exists())
    return supervisor, child


# -- live ------------------------------------------------------------------------------


def test_live_fails_while_a_worker_is_frozen_past_its_heartbeat_and_recovers(run_workers):
    supervisor, child = start_worker(run_workers)
    code, out = probe("live", "--within", "3")
    assert code == 0, out
    assert f"live: 1 worker process of {HOST}" in out

    os.kill(child, signal.SIGSTOP)
    try:

        def live_fails() -> str | None:
            code, out = probe("live", "--within", "3")
            return out if code == 1 else None

        out = wait_until(live_fails, 60)
        assert f"{HOST}:{child}" in out
        assert "no heartbeat within 3s" in out
    finally:
        os.kill(child, signal.SIGCONT)
    wait_until(lambda: probe("live", "--within", "3")[0] == 0, 60)
    assert supervisor.process.poll() is None


def test_live_fails_when_no_worker_of_this_host_is_registered():
    make_worker("elsewhere:4242")  # another host's: not ours to judge
    code, out = probe("live")
    assert code == 1
    assert f"no running worker process of {HOST} is registered" in out


def test_live_leaves_out_rows_of_processes_that_are_gone_or_younger(run_workers):
    start_worker(run_workers)
    # A worker that died without a goodbye: its pid belongs to nobody now.
    gone = subprocess.Popen(["true"])
    gone.wait()
    make_worker(f"{HOST}:{gone.pid}", age=3600)
    # A stale row whose pid a process started after it registered now holds,
    # as in a restarted container: the registration is older than the process.
    younger = subprocess.Popen(["sleep", "60"])
    try:
        make_worker(f"{HOST}:{younger.pid}", age=3600)
        code, out = probe("live", "--within", "3")
    finally:
        younger.kill()
        younger.wait()
    assert code == 0, out
    assert f"live: 1 worker process of {HOST}" in out


def test_live_passes_when_the_database_is_unreachable():
    code, out = probe("live", database_url=unreachable_url())
    assert code == 0, out
    assert "the database is unreachable" in out


@pytest.mark.skipif("connection.vendor == 'sqlite'", reason="SQLite has no server to hang")
def test_live_passes_and_ready_fails_in_time_when_the_database_hangs(silent_server):
    url = unreachable_url(silent_server)
    code, out = probe("live", "--timeout", "1", database_url=url)
    assert code == 0, out
    assert "no answer within 1s" in out
    code, out = probe("ready", "--timeout", "1", database_url=url)
    assert code == 2, out
    assert "no answer within 1s" in out


# -- ready -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "missing",
    [
        pytest.param("0005_enqueue_function", id="the-latest"),
        # A gap behind an applied leaf: Django's own plan towards the leaves is empty.
        pytest.param("0004_task_trace_context", id="one-behind-an-applied-one"),
    ],
)
def test_ready_passes_on_a_migrated_database_and_fails_on_a_missing_migration(missing):
    code, out = probe("ready")
    assert code == 0, out
    recorder = MigrationRecorder(connection)
    applied = recorder.migration_qs.get(app="django_rdbtasks", name=missing)
    applied_at = applied.applied
    applied.delete()
    try:
        code, out = probe("ready")
    finally:
        recorder.migration_qs.create(app="django_rdbtasks", name=missing, applied=applied_at)
    assert code == 1, out
    assert f"1 migrations not applied: django_rdbtasks.{missing}" in out


def test_ready_fails_against_an_unreachable_database():
    code, out = probe("ready", database_url=unreachable_url())
    assert code == 2, out
    assert "ready: the database is unreachable" in out
