"""Prometheus metrics: the worker's counters and histograms, the database's gauges, scrapes."""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from django_rdbtasks.backend import bulk_enqueue
from django_rdbtasks.db.rows import Candidate, ClaimedRow, Outcome
from django_rdbtasks.models import Task
from django_rdbtasks.models import Worker as WorkerRow
from django_rdbtasks.observability.metrics import (
    DELAY_BUCKETS,
    DURATION_BUCKETS,
    WorkerMetrics,
    observe_many,
)
from django_rdbtasks.states import OutcomeKind, TaskStatus
from django_rdbtasks.worker.execution import Running
from tests.conftest import wait_until, worker_children
from tests.testapp import tasks
from tests.testapp.models import SideEffect

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a Prometheus text page, keyed by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: dict, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def claimed(
    task_id: int,
    *,
    path: str = "tests.testapp.tasks.record",
    queue: str = "default",
    waited: float = 0.5,
    lost_from: Candidate | None = None,
) -> ClaimedRow:
    return ClaimedRow(
        id=task_id,
        version=1,
        task_path=path,
        args=[],
        kwargs={},
        attempts=1,
        max_attempts=3,
        queue_name=queue,
        backend_name="default",
        priority=0,
        enqueued_at=NOW - dt.timedelta(seconds=waited),
        started_at=NOW,
        claimed_at=NOW,
        run_after=NOW - dt.timedelta(seconds=waited),
        history=[],
        lost_from=lost_from,
    )


def _recorded_takeover(row: ClaimedRow) -> ClaimedRow:
    # What the executor leaves once it has recorded the lost attempt.
    row.taken_over = True
    return row


def pair(row: ClaimedRow, kind: OutcomeKind, duration: float = 0.003):
    return Outcome(row.id, row.version, kind, duration=duration, row=row), Running(row, "w:1")


# -- the worker's counters, in this process ------------------------------------------------


def test_a_batch_of_outcomes_counts_each_kind_once_per_task():
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    lost_holder = Candidate(9, 3, TaskStatus.RUNNING, "gone:1", NOW)
    pairs = [
        pair(claimed(1), OutcomeKind.SUCCESS),
        pair(claimed(2), OutcomeKind.SUCCESS, duration=0.2),
        pair(claimed(3), OutcomeKind.RETRY),
        pair(claimed(4, path="tests.testapp.tasks.add", queue="emails"), OutcomeKind.FAILURE),
        pair(claimed(5), OutcomeKind.CANCELLED),
        pair(claimed(6), OutcomeKind.HANDOVER),
        pair(claimed(7), OutcomeKind.POSTPONE),
        pair(claimed(8), OutcomeKind.RELEASE),  # never counted: it runs later
        pair(claimed(9, lost_from=lost_holder), OutcomeKind.SUCCESS),
        pair(claimed(10, lost_from=lost_holder), OutcomeKind.ABANDON),
        pair(claimed(11), OutcomeKind.SUCCESS),  # not written: another worker holds it
        # A takeover whose lost attempt the executor already recorded (lost_from cleared).
        pair(_recorded_takeover(claimed(12)), OutcomeKind.SUCCESS),
        pair(_recorded_takeover(claimed(13)), OutcomeKind.RELEASE),  # handed back unstarted
    ]
    written = {outcome.id: None for outcome, _ in pairs if outcome.id != 11}
    metrics.record(pairs, written)

    found = samples(_text(registry))
    record = {"queue": "default", "task": "tests.testapp.tasks.record"}
    add = {"queue": "emails", "task": "tests.testapp.tasks.add"}
    assert value(found, "rdbtasks_tasks_succeeded_total", **record) == 4
    assert value(found, "rdbtasks_tasks_retried_total", **record) == 1
    assert value(found, "rdbtasks_tasks_failed_total", **add) == 1
    assert value(found, "rdbtasks_tasks_failed_total", **record) == 1  # the abandoned one
    assert value(found, "rdbtasks_tasks_cancelled_total", **record) == 1
    assert value(found, "rdbtasks_tasks_handed_back_total", **record) == 2
    assert value(found, "rdbtasks_tasks_reclaimed_total", **record) == 4
    assert value(found, "rdbtasks_tasks_lost_total", **record) == 1
    # Durations of every attempt that ran (the lost one too: it ran), not of
    # the postponed, released or abandoned ones.
    assert value(found, "rdbtasks_task_duration_seconds_count", **record) == 8
    assert value(found, "rdbtasks_task_duration_seconds_count", **add) == 1
    assert value(found, "rdbtasks_task_duration_seconds_sum", **record) == pytest.approx(0.221)
    assert value(found, "rdbtasks_task_duration_seconds_bucket", le="0.005", **record) == 7
    # Start delays of attempts not taken over from a lost worker.
    assert value(found, "rdbtasks_task_start_delay_seconds_count", **record) == 6
    assert value(found, "rdbtasks_task_start_delay_seconds_sum", **record) == pytest.approx(3.0)


@pytest.mark.parametrize(
    "bounds,values",
    [
        (DURATION_BUCKETS, [0.0, 0.001, 0.0011, 0.3, 7.0, 1e6, 0.001, 2.5]),
        (DELAY_BUCKETS, [0.005, 0.0, 61.0, 3600.0, 3600.5]),
    ],
)
def test_observe_many_equals_one_observe_per_value(bounds, values):
    one, many = CollectorRegistry(), CollectorRegistry()
    by_one = Histogram("h", "h", buckets=bounds, registry=one)
    by_many = Histogram("h", "h", buckets=bounds, registry=many)
    for v in values:
        by_one.observe(v)
    observe_many(by_many, values, bounds)

    def observed(registry):  # all but the creation time
        return {k: v for k, v in samples(_text(registry)).items() if k[0] != "h_created"}

    assert observed(many) == observed(one)


@pytest.mark.django_db
def test_enqueues_and_starts_are_counted_from_the_framework_signals():
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    metrics.connect_signals()
    try:
        tasks.record.enqueue("one")
        tasks.send_email.enqueue("a@example.com")
        bulk_enqueue(tasks.record, [((f"k{i}",), {}) for i in range(5)])
    finally:
        metrics.disconnect_signals()
    tasks.record.enqueue("after")  # not counted: disconnected
    found = samples(_text(registry))
    assert (
        value(
            found,
            "rdbtasks_tasks_enqueued_total",
            queue="default",
            task="tests.testapp.tasks.record",
        )
        == 6
    )
    assert (
        value(
            found,
            "rdbtasks_tasks_enqueued_total",
            queue="emails",
            task="tests.testapp.tasks.send_email",
        )
        == 1
    )


def _text(registry: CollectorRegistry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()


# -- the database's gauges, through the Django view -----------------------------------------


@pytest.fixture
def staff_client() -> Client:
    client = Client()
    user = User.objects.create_user("ops", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_task"))
    client.force_login(user)
    return client


@pytest.mark.django_db
@pytest.mark.urls("django_rdbtasks.urls")
def test_the_view_serves_queue_depth_lag_and_workers(staff_client):
    bulk_enqueue(tasks.record, [((f"r{i}",), {}) for i in range(4)])
    tasks.send_email.using(run_after=timezone.now() + dt.timedelta(hours=1)).enqueue(
        "later@example.com"
    )
    tasks.send_email.enqueue("now@example.com")
    Task.objects.filter(task_path="tests.testapp.tasks.record").update(
        run_after=timezone.now() - dt.timedelta(minutes=5)  # waiting for five minutes
    )
    WorkerRow.objects.create(name="host:1", host="host", pid=1, queues=["default"], mode="x")

    response = staff_client.get("/metrics/")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    found = samples(response.content.decode())
    assert value(found, "rdbtasks_queue_tasks", queue="default", state="ready") == 4
    assert value(found, "rdbtasks_queue_tasks", queue="emails", state="ready") == 1
    assert value(found, "rdbtasks_queue_tasks", queue="emails", state="scheduled") == 1
    assert (
        "rdbtasks_queue_tasks",
        frozenset({"queue": "other", "state": "ready"}.items()),
    ) in found
    assert value(found, "rdbtasks_queue_lag_seconds", queue="default") >= 300
    assert value(found, "rdbtasks_queue_lag_seconds", queue="other") == 0
    assert value(found, "rdbtasks_workers_alive") == 1
    assert value(found, "rdbtasks_task_rows") >= 0


@pytest.mark.django_db
@pytest.mark.urls("django_rdbtasks.urls")
def test_the_view_is_for_staff_or_the_bearer_token(settings):
    assert Client().get("/metrics/").status_code == 403
    plain = Client()
    plain.force_login(User.objects.create_user("someone"))
    assert plain.get("/metrics/").status_code == 403
    staff = Client()  # staff, but not allowed to see the dashboard
    staff.force_login(User.objects.create_user("staff", is_staff=True))
    assert staff.get("/metrics/").status_code == 403

    settings.RDBTASKS_METRICS_TOKEN = "s3cret-token"
    anonymous = Client()
    assert anonymous.get("/metrics/", HTTP_AUTHORIZATION="Bearer s3cret-token").status_code == 200
    assert anonymous.get("/metrics/", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert anonymous.get("/metrics/").status_code == 403
    assert anonymous.post("/metrics/").status_code in (403, 405)


# -- runworkers --metrics-port: a real scrape over HTTP ------------------------------------


def _served(workers) -> tuple[int, Path]:
    match = wait_until(
        lambda: re.search(
            r"metrics served on http://127\.0\.0\.1:(\d+)/metrics \(multiprocess directory (\S+)\)",
            workers.log(),
        ),
        timeout=60,
    )
    return int(match.group(1)), Path(match.group(2))


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return samples(response.read().decode())


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_runworkers_serves_the_metrics_of_every_process(run_workers):
    count = 40
    bulk_enqueue(tasks.record, [((f"m{i}",), {}) for i in range(count)])
    tasks.always_fails.enqueue("boom")  # max_attempts=2: one retry, then failed
    workers = run_workers(
        "--processes", "2", "--metrics-port", "0", "--no-scheduler", "--poll-interval", "0.2"
    )
    port, directory = _served(workers)
    assert directory.is_dir()
    wait_until(lambda: len(worker_children(workers.pid)) == 2, timeout=60)
    wait_until(
        lambda: Task.objects.filter(status__in=TaskStatus.finished()).count() == count + 1,
        timeout=120,
    )
    record = {"queue": "default", "task": "tests.testapp.tasks.record"}
    fails = {"queue": "default", "task": "tests.testapp.tasks.always_fails"}

    def all_counted():
        found = scrape(port)
        done = value(found, "rdbtasks_tasks_succeeded_total", **record) == count
        return found if done and value(found, "rdbtasks_tasks_failed_total", **fails) else None

    found = wait_until(all_counted, timeout=30)
    assert SideEffect.objects.count() == count  # each body ran once, as counted
    assert value(found, "rdbtasks_tasks_started_total", **record) == count
    assert value(found, "rdbtasks_tasks_started_total", **fails) == 2
    assert value(found, "rdbtasks_tasks_retried_total", **fails) == 1
    assert value(found, "rdbtasks_tasks_failed_total", **fails) == 1
    assert value(found, "rdbtasks_tasks_failed_total", **record) == 0
    assert value(found, "rdbtasks_task_duration_seconds_count", **record) == count
    assert value(found, "rdbtasks_task_start_delay_seconds_count", **record) == count
    assert value(found, "rdbtasks_worker_processes") == 2

    workers.signal(signal.SIGTERM)
    assert workers.wait(timeout=60) == 0, workers.log()
    assert not directory.exists()  # the supervisor removed it
    with pytest.raises(OSError):
        scrape(port)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_counts_of_a_killed_process_survive_it_and_the_reclaim_is_counted(run_workers):
    tasks.record.enqueue("before")
    result = tasks.slow_first_attempt.enqueue("crash", 60)
    workers = run_workers(
        "--metrics-port", "0", "--lease", "1", "--poll-interval", "0.2", "--no-scheduler"
    )
    port, _ = _served(workers)
    first = wait_until(lambda: SideEffect.objects.filter(key="crash").first(), timeout=60)
    os.kill(first.pid, signal.SIGKILL)  # mid-task; the supervisor starts another process
    wait_until(lambda: Task.objects.get(pk=result.id).status == TaskStatus.SUCCESSFUL, timeout=60)
    path = {"queue": "default", "task": "tests.testapp.tasks.slow_first_attempt"}
    found = wait_until(
        lambda: (f := scrape(port)) and value(f, "rdbtasks_tasks_succeeded_total", **path) and f,
        timeout=30,
    )
    assert SideEffect.objects.filter(key="crash").count() == 2
    assert value(found, "rdbtasks_tasks_started_total", **path) == 2  # one by the dead process
    assert value(found, "rdbtasks_tasks_reclaimed_total", **path) == 1
    assert value(found, "rdbtasks_tasks_succeeded_total", **path) == 1
    record = {"queue": "default", "task": "tests.testapp.tasks.record"}
    assert value(found, "rdbtasks_tasks_succeeded_total", **record) == 1
    assert value(found, "rdbtasks_worker_processes") == 1
    workers.signal(signal.SIGTERM)
    assert workers.wait(timeout=60) == 0, workers.log()


def test_directories_of_supervisors_gone_without_cleaning_up_are_removed(tmp_path):
    import subprocess
    import sys
    import tempfile

    from django_rdbtasks.observability.metrics import DIRECTORY_PREFIX, remove_stale_directories

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    root = Path(tempfile.gettempdir())
    stale = root / f"{DIRECTORY_PREFIX}{gone.stdout.strip()}-test"
    live = root / f"{DIRECTORY_PREFIX}{os.getpid()}-test"
    for directory in (stale, live):
        directory.mkdir()
        (directory / "counter_1.db").write_bytes(b"x")
    try:
        assert str(stale) in remove_stale_directories()
        assert not stale.exists() and live.exists()
    finally:
        shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(live, ignore_errors=True)


@pytest.mark.django_db
@pytest.mark.urls("django_rdbtasks.urls")
def test_the_view_serves_what_holds_back_cleanup(staff_client, vendor, monkeypatch):
    from django_rdbtasks import cleanup
    from tests.conftest import held_snapshot

    if vendor == "sqlite":
        found = samples(staff_client.get("/metrics/").content.decode())
        assert not [name for name, _ in found if name.startswith("rdbtasks_cleanup")]
        return
    monkeypatch.setattr(cleanup, "SHOWN_AFTER", 1.0)
    with held_snapshot():
        time.sleep(1.5)
        found = samples(staff_client.get("/metrics/").content.decode())
    assert value(found, "rdbtasks_cleanup_oldest_transaction_seconds") >= 1.5
    # At least this one (on MySQL/MariaDB, other databases' transactions hold InnoDB too).
    assert value(found, "rdbtasks_cleanup_holders", kind="session") >= 1
    assert value(found, "rdbtasks_cleanup_holders", kind="replication slot") == 0
    if vendor == "postgresql":
        assert value(found, "rdbtasks_cleanup_xmin_age_transactions") >= 0
        assert (
            "rdbtasks_table_dead_rows",
            frozenset({"table": "django_rdbtasks_task"}.items()),
        ) in (found)
    else:
        assert value(found, "rdbtasks_innodb_history_list_length") >= 0
