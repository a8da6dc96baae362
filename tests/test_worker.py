"""The worker in this process: outcomes, retries, safety, lost leases."""

import logging
import re
import time
from datetime import datetime

import pytest
from django.db import connection, transaction

from django_rdbtasks.compat import TaskResultStatus
from django_rdbtasks.db import dialect_for
from django_rdbtasks.db.rows import ClaimRequest
from django_rdbtasks.models import Task
from django_rdbtasks.worker import EXIT_RECYCLE, Worker
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def drain(**options):
    options.setdefault("burst", True)
    worker = Worker(**options)
    assert worker.run(install_signals=False) in (0, EXIT_RECYCLE)
    return worker


def take_lease(worker_id, lease):
    """Claim everything runnable as a worker that will never come back."""
    dialect = dialect_for(connection)
    with transaction.atomic(), connection.cursor() as cursor:
        rows, _ = dialect.claim(cursor, ClaimRequest(["default"], 100, worker_id, lease))
        return rows


def test_success_failure_and_history():
    ok = tasks.add.enqueue(1, 2)
    bad = tasks.always_fails.enqueue("nope")
    drain()
    ok_row, bad_row = Task.objects.get(pk=ok.id), Task.objects.get(pk=bad.id)
    assert (ok_row.status, ok_row.return_value, ok_row.attempts) == ("SUCCESSFUL", 3, 1)
    [entry] = ok_row.history
    assert entry["outcome"] == "SUCCESSFUL" and entry["attempt"] == 1
    assert entry["started_at"] <= entry["finished_at"]
    assert (bad_row.status, bad_row.attempts) == ("FAILED", 2)
    assert [e["outcome"] for e in bad_row.history] == ["RETRY", "FAILED"]
    assert ok_row.lease_expires_at is None and bad_row.finished_at is not None


def test_retry_uses_backoff_and_then_succeeds(caplog):
    caplog.set_level(logging.INFO, logger="django_rdbtasks.worker")
    result = tasks.fails_until.enqueue("k", 2)
    drain()
    # The log says when the retry runs (its backoff; none for this task), then
    # how long the attempt ran.
    retries = [r.getMessage() for r in caplog.records if "will retry" in r.getMessage()]
    assert len(retries) == 2
    assert all(
        re.search(r"will retry at once \(ran [\d.]+(µs|ms|s), attempt [12] of 3\)", m)
        for m in retries
    )
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert result.attempts == 3 and len(result.errors) == 2
    assert SideEffect.objects.filter(key="k").count() == 3


def test_retry_waits_for_its_backoff_and_burst_waits_for_the_retry():
    backend = tasks.add.get_backend()
    for attempt in range(1, 6):
        full = backend.backoff * 2 ** (attempt - 1)
        assert full / 2 <= backend.retry_delay(tasks.add, attempt) <= full
    saved, backend.backoff = backend.backoff, 2.0
    try:
        tasks.fails_with_default_backoff.enqueue()
        drain(poll_interval=0.1)  # burst: waits out the 1 to 2 s backoff, runs it again
    finally:
        backend.backoff = saved
    row = Task.objects.get()
    assert (row.status, row.attempts) == ("FAILED", 2)
    first, second = row.history
    assert first["outcome"] == "RETRY" and second["outcome"] == "FAILED"
    waited = datetime.fromisoformat(second["started_at"]) - datetime.fromisoformat(
        first["finished_at"]
    )
    assert 1.0 <= waited.total_seconds() <= 3.0


def test_a_nothing_retried_forever_guarantee():
    tasks.always_fails.enqueue("x")
    drain()
    row = Task.objects.get()
    assert row.status == "FAILED" and row.attempts == row.max_attempts == 2


@pytest.mark.parametrize(
    "path",
    [
        "tests.testapp.tasks.plain_function",  # a function, not a Task
        "tests.testapp.tasks.not_a_task",  # the function behind a Task
        # Not "tests.testapp.tasks.missing": a task an installed app's module may
        # have in another release is handed back (tests/test_missing.py).
        "no.such.module.task",
        "os.system",
        "subprocess.run",
        "garbage",
        "",
    ],
)
def test_rows_naming_anything_but_a_task_fail_clearly(path):
    Task.objects.create(task_path=path, args=["echo hi"], max_attempts=3)
    tasks.record.enqueue("after")
    drain()
    bad = Task.objects.get(task_path=path)
    assert bad.status == "FAILED"
    assert bad.attempts == 1  # a bad path is not retried
    [entry] = bad.history
    assert entry["exception_class_path"] == "django_rdbtasks.exceptions.InvalidTaskPath"
    assert SideEffect.objects.filter(key="after").count() == 1  # the worker carried on


def test_return_value_that_is_not_json_fails_the_task():
    result = tasks.returns_object.enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "builtins.TypeError"


def test_context_sees_the_attempt_number():
    result = tasks.with_context.enqueue(5)
    drain()
    result.refresh()
    assert result.return_value == {"attempt": 1, "id": result.id, "value": 5}


def test_lost_lease_is_reclaimed_and_recorded():
    result = tasks.record.enqueue("lost")
    take_lease("ghost-worker", lease=0.2)
    time.sleep(0.4)
    drain()
    row = Task.objects.get(pk=result.id)
    assert row.status == "SUCCESSFUL" and row.attempts == 2
    lost, done = row.history
    assert lost["outcome"] == "LOST" and lost["worker_id"] == "ghost-worker"
    assert lost["exception_class_path"] == "django_rdbtasks.exceptions.WorkerLost"
    assert done["outcome"] == "SUCCESSFUL" and done["attempt"] == 2
    result.refresh()
    assert result.worker_ids[0] == "ghost-worker" and result.attempts == 2
    assert SideEffect.objects.filter(key="lost").count() == 1


def test_lost_lease_on_the_last_attempt_fails_without_running():
    tasks.record.enqueue("last")
    Task.objects.update(max_attempts=1)
    take_lease("ghost-worker", lease=0.2)
    time.sleep(0.4)
    drain()
    row = Task.objects.get()
    assert row.status == "FAILED" and row.attempts == 1
    assert [e["outcome"] for e in row.history] == ["LOST"]
    assert not SideEffect.objects.exists()


def test_a_takeover_handed_back_unstarted_keeps_its_lost_attempt():
    # Claimed two at a time behind a long task, the takeover is handed back
    # before it starts: its lost attempt must still be recorded (and, being
    # the last, end the task) rather than vanish and let it run once more.
    tasks.record_then_sleep.enqueue("long", 0.5)
    last = tasks.record.enqueue("last-attempt")
    Task.objects.filter(pk=last.id).update(max_attempts=1)
    take_lease("ghost-worker", lease=0.2)
    time.sleep(0.4)
    drain(batch=2, poll_interval=0.05, listen=False)
    row = Task.objects.get(pk=last.id)
    assert SideEffect.objects.filter(key="last-attempt").count() == 0
    assert (row.status, row.attempts) == ("FAILED", 1)
    assert [e["outcome"] for e in row.history] == ["LOST"]


def test_live_lease_is_left_alone():
    tasks.record.enqueue("held")
    take_lease("busy-worker", lease=60)
    drain()
    row = Task.objects.get()
    assert (row.status, row.worker_id) == ("RUNNING", "busy-worker")


def test_threads_and_batches_run_everything_once():
    for i in range(200):
        tasks.record.enqueue(f"t{i}")
    drain(threads=4, batch=8)
    assert Task.objects.filter(status="SUCCESSFUL").count() == 200
    assert SideEffect.objects.count() == 200
    assert SideEffect.objects.values("key").distinct().count() == 200


def test_priority_order_within_one_worker():
    for priority in (-10, 0, 10, 5):
        tasks.record.using(priority=priority).enqueue(f"p{priority}")
    drain(batch=10)
    keys = list(SideEffect.objects.order_by("id").values_list("key", flat=True))
    assert keys == ["p10", "p5", "p0", "p-10"]


def test_deferred_tasks_wait_and_burst_leaves_them():
    from datetime import timedelta

    from django.utils import timezone

    tasks.record.using(run_after=timezone.now() + timedelta(hours=1)).enqueue("later")
    tasks.record.enqueue("now")
    drain()
    assert list(SideEffect.objects.values_list("key", flat=True)) == ["now"]
    assert Task.objects.get(status="READY").args == ["later"]


def test_max_tasks_recycles():
    for i in range(10):
        tasks.record.enqueue(f"m{i}")
    worker = Worker(burst=True, max_tasks=4, batch=3)
    assert worker.run(install_signals=False) == EXIT_RECYCLE
    assert SideEffect.objects.count() == 4
    assert Task.objects.filter(status="READY").count() == 6


def test_queue_selection():
    tasks.send_email.enqueue("a@example.com")
    tasks.record.enqueue("default-queue")
    drain(queues=["emails"])
    assert list(SideEffect.objects.values_list("key", flat=True)) == ["email:a@example.com"]


def test_bad_options_are_refused_clearly(vendor):
    with pytest.raises(ValueError, match="not among"):
        Worker(queues=["nope"])
    with pytest.raises(ValueError, match="mode"):
        Worker(mode="fast")
    if vendor == "sqlite":
        with pytest.raises(ValueError, match="SQLite"):
            Worker(mode="skip-locked")
    else:
        tasks.record.enqueue("locked")
        drain(mode="skip-locked")
        assert SideEffect.objects.count() == 1


def test_worker_keeps_its_connection_whatever_conn_max_age():
    from django.db import connections

    # Django's default: close after every request. A worker has no requests and
    # must not reconnect per task either.
    assert connections["default"].settings_dict["CONN_MAX_AGE"] == 0
    for _ in range(20):
        tasks.connection_identity.enqueue()
    drain(batch=1)
    identities = {row.return_value for row in Task.objects.all()}
    assert len(identities) == 1


def test_max_tasks_counts_what_ran_not_what_was_handed_back():
    """Tasks claimed behind a long one and handed back unstarted leave the budget
    as it was: the process recycles after running its --max-tasks, not fewer."""
    tasks.record_then_sleep.using(priority=10).enqueue("slow", 0.3)
    for i in range(8):
        tasks.record.enqueue(f"m{i}")
    worker = Worker(burst=True, max_tasks=4, batch=4)
    assert worker.run(install_signals=False) == EXIT_RECYCLE
    assert SideEffect.objects.count() == 4
    assert Task.objects.filter(status="READY").count() == 5
