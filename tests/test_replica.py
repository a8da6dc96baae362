"""READ_DATABASE with a real streaming replica: the pages that only read run on the standby.

A PostgreSQL primary and its standby (``scripts/clusters/pg_pair.py`` on ports
27432/27433, both with ``pg_stat_statements``; ``remote_apply``, so a commit
is visible on the standby when it returns). Processes with
``tests/settings_replica.py`` (``default`` the primary, ``replica`` the
standby, the backend's ``READ_DATABASE = "replica"``) seed rows on the
primary, then render the admin's lists, detail pages and dashboard, run
``rdbtasks status``, scrape the metrics view and take the autoscaler's backlog
sample. Each server's own ``pg_stat_statements`` says what ran there: the
standby ran the project's read queries and the primary none of them. Then an
admin action (retry) runs, and its reads and writes are the primary's alone.

And what lag means: with the standby's replay paused, a change on the primary
is not in ``rdbtasks status`` (read off the standby), which reports the lag,
while ``--primary`` sees it; once replay resumes, both agree and the lag is 0.

Run with ``make test-clusters``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scripts.clusters import pg_pair
from tests.conftest import ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DB_NAME = "rdbtasks_replica"
SETTINGS = "tests.settings_replica"
PRIMARY_PORT = 27432
STANDBY_PORT = 27433
EXTRA_CONF = """
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = all
synchronous_commit = remote_apply
"""
#: What the project's queries name (its tables); Django's own (sessions, auth) are not counted.
PROJECT = "django_rdbtasks_"


# -- what runs in the Django processes ----------------------------------------------------------


def seed() -> None:
    """On the primary: a superuser, tasks of each kind, a job, a record, a worker."""
    from django.contrib.auth.models import User

    from django_rdbtasks.models import Job, JobRecord, TaskStatus
    from tests.browser.support import make_task, make_worker

    User.objects.create_superuser("ops", password="pw")
    failed = make_task(TaskStatus.FAILED, job_name="nightly")
    make_task(TaskStatus.READY)
    make_task(TaskStatus.RUNNING)
    make_task(TaskStatus.SUCCESSFUL)
    Job.objects.create(name="nightly", task_path="tests.testapp.tasks.add", cron="0 3 * * *")
    JobRecord.objects.create(job_name="nightly", key="k1", task_id=failed.pk)
    make_worker("host-a:101")
    print(json.dumps({"failed": str(failed.pk)}))


def _client() -> Any:
    from django.contrib.auth.models import User
    from django.test import Client
    from django.test.utils import setup_test_environment

    setup_test_environment()
    client = Client()
    client.force_login(User.objects.get(username="ops"))
    return client


def read_pages() -> None:
    """Everything that only reads, as an operator and a monitor would."""
    import io

    from django.core.management import call_command

    from django_rdbtasks.models import Job, JobRecord, Task, Worker
    from django_rdbtasks.worker.autoscale import AutoscalePolicy
    from django_rdbtasks.worker.supervisor import Supervisor
    from tests.browser.support import url

    client = _client()
    task = Task.objects.using("replica").filter(status="FAILED").get()
    pages = [
        url("task_changelist"),
        url("task_changelist") + "?status=FAILED&q=tests",
        url("task_change", task.pk),
        url("task_dashboard"),
        url("task_retry_failed"),
        url("job_changelist"),
        url("job_change", Job.objects.using("replica").get().pk),
        url("jobrecord_changelist"),
        url("jobrecord_change", JobRecord.objects.using("replica").get().pk),
        url("worker_changelist"),
        url("worker_change", Worker.objects.using("replica").get().pk),
    ]
    found: dict[str, Any] = {}
    for page in pages:
        response = client.get(page)
        assert response.status_code == 200, (page, response.status_code)
        if page == url("task_dashboard"):
            found["dashboard"] = response.content.decode()
    status = io.StringIO()
    call_command("rdbtasks", "status", stdout=status)
    found["status"] = status.getvalue()
    metrics = client.get("/rdbtasks/metrics/")
    assert metrics.status_code == 200, metrics.content
    found["metrics"] = metrics.content.decode()
    # A queue with nothing in it: the sample runs, and starts no process.
    Supervisor(0, {"backend": "default", "queues": ["idle"]}, scheduler=False)._scale(
        AutoscalePolicy(minimum=0, maximum=1), 0.0
    )
    lag = found["dashboard"].split('id="rdbtasks-replica-lag">')[1].split("</span>")[0]
    found["dashboard_lag"] = lag
    del found["dashboard"]
    print(json.dumps(found))


def retry(task_id: str) -> None:
    """The admin's retry action on the failed task."""
    client = _client()
    from tests.browser.support import url

    response = client.post(
        url("task_changelist"), {"action": "retry_tasks", "_selected_action": [task_id]}
    )
    assert response.status_code == 302, response.status_code


def reconnect_to_each() -> None:
    """A runner reconnecting its tasks' connection: done to the primary, refused by the standby."""
    import threading

    from django.db import connections

    from django_rdbtasks.db import dialect_for
    from django_rdbtasks.worker.task_connections import reconnect_task_connections

    found = {}
    for alias in ("default", "replica"):
        connections[alias].ensure_connection()  # as a task would have
        deadline = time.monotonic() + 1.0
        found[alias] = reconnect_task_connections(
            True,  # its lane's round thread lost its connection
            alias,
            dialect_for(connections[alias]).accepts_writes,
            stop=threading.Event(),
            give_up=lambda: time.monotonic() > deadline,  # noqa: B023
        )
        found[f"{alias}_open"] = connections[alias].connection is not None
    print(json.dumps(found))


# -- the pair and the test ----------------------------------------------------------------------


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[pg_pair.Pair]:
    # Under /tmp, not tmp_path: the server user must be able to reach it.
    root = Path(tempfile.mkdtemp(prefix="rdbtasks-replica-"))
    try:
        try:
            started = pg_pair.start(
                root, primary_port=PRIMARY_PORT, standby_port=STANDBY_PORT, extra_conf=EXTRA_CONF
            )
        except (pg_pair.PairError, subprocess.SubprocessError) as exc:
            pytest.fail(f"could not start the PostgreSQL pair: {exc}")
        pg_pair.psql(started.primary_port, f"CREATE DATABASE {DB_NAME}")
        pg_pair.psql(started.primary_port, "CREATE EXTENSION pg_stat_statements", dbname=DB_NAME)
        yield started
    finally:
        for log in root.glob("*.log"):  # kept for a failure's post-mortem
            shutil.copy(log, tmp_path / log.name)
        pg_pair.stop(root)


def django(*args: str) -> str:
    """``python ARGS`` with the replica settings; its stdout."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "RDBTASKS_REPLICA_DB": DB_NAME,
        "RDBTASKS_PRIMARY_PORT": str(PRIMARY_PORT),
        "RDBTASKS_STANDBY_PORT": str(STANDBY_PORT),
    }
    proc = subprocess.run(
        [sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc.stdout


def call(function: str, *arguments: str) -> Any:
    code = (
        "import django; django.setup(); "
        f"from tests.test_replica import {function}; {function}(*{list(arguments)!r})"
    )
    out = django("-c", code).strip()
    return json.loads(out.splitlines()[-1]) if out else None


def reset_statements(*ports: int) -> None:
    for port in ports:
        pg_pair.psql(port, "SELECT pg_stat_statements_reset()", dbname=DB_NAME)


def project_statements(port: int) -> list[str]:
    """The statements on the project's tables this server ran since the last reset."""
    out = pg_pair.psql(
        port,
        "SELECT query FROM pg_stat_statements WHERE dbid = "
        f"(SELECT oid FROM pg_database WHERE datname = '{DB_NAME}') "
        f"AND query LIKE '%{PROJECT}%' AND query NOT LIKE '%pg_stat_statements%'",
        dbname=DB_NAME,
    )
    return [line for line in out.splitlines() if line.strip()]


def test_the_read_only_views_run_on_the_standby_and_actions_on_the_primary(pair) -> None:
    assert pg_pair.psql(STANDBY_PORT, "SELECT pg_is_in_recovery()") == "t"
    django("-m", "django", "migrate", "-v0", "--database", "default")
    failed = call("seed")["failed"]

    reset_statements(PRIMARY_PORT, STANDBY_PORT)
    shown = call("read_pages")
    on_primary = project_statements(PRIMARY_PORT)
    on_standby = project_statements(STANDBY_PORT)
    assert on_primary == [], "the primary ran reads of the pages:\n" + "\n".join(on_primary)
    # Each kind of page left its reads on the standby: lists, the dashboard's
    # counts, the worker registry, jobs and their records.
    for table in ("task", "job", "jobrecord", "worker"):
        assert any(f'"{PROJECT}{table}"' in sql for sql in on_standby), table
    assert all(sql.lstrip().upper().startswith(("SELECT", "WITH")) for sql in on_standby)
    # The standby replays as it receives (remote_apply): no lag to show.
    assert shown["dashboard_lag"] == "Read from the replica replica, behind the primary by 0 s."
    assert "Read from replica, a replica; replication lag: 0.0s." in shown["status"]
    assert "rdbtasks_replica_lag_seconds 0.0" in shown["metrics"]

    reset_statements(PRIMARY_PORT, STANDBY_PORT)
    call("retry", failed)
    assert project_statements(STANDBY_PORT) == []
    on_primary = project_statements(PRIMARY_PORT)
    assert any(sql.lstrip().upper().startswith("UPDATE") for sql in on_primary), on_primary
    # And the change reached the standby, which the next page reads.
    status = pg_pair.psql(
        STANDBY_PORT, f"SELECT status FROM {PROJECT}task WHERE id = '{failed}'", dbname=DB_NAME
    )
    assert status == "READY"

    # After a failover, a runner does not run its next task on a standby.
    assert call("reconnect_to_each") == {
        "default": True, "default_open": True, "replica": False, "replica_open": False,
    }  # fmt: skip


def test_a_standby_behind_shows_its_lag_and_the_old_rows(pair) -> None:
    django("-m", "django", "migrate", "-v0", "--database", "default")
    failed = call("seed")["failed"]
    assert status_json()["replica_lag_seconds"] == 0  # caught up (remote_apply)
    # The standby stops replaying (it still receives); the primary goes on
    # without waiting for it, a second after the last commit the standby applied.
    pg_pair.psql(STANDBY_PORT, "SELECT pg_wal_replay_pause()")
    time.sleep(1.0)
    pg_pair.psql(
        PRIMARY_PORT,
        "SET synchronous_commit = local; "
        f"UPDATE {PROJECT}task SET status = 'READY' WHERE id = '{failed}'",
        dbname=DB_NAME,
    )
    behind = status_json()
    assert behind["replica_lag_seconds"] >= 1.0
    assert behind["total"]["ready"] == 1  # the requeued task is not there yet
    assert status_json("--primary")["total"]["ready"] == 2
    pg_pair.psql(STANDBY_PORT, "SELECT pg_wal_replay_resume()")
    deadline = time.monotonic() + 30
    while (caught_up := status_json())["replica_lag_seconds"] != 0:
        assert time.monotonic() < deadline, caught_up
        time.sleep(0.1)
    assert caught_up["total"]["ready"] == 2


def status_json(*args: str) -> dict[str, Any]:
    return json.loads(django("-m", "django", "rdbtasks", "status", "--json", *args))
