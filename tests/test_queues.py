"""Pausing and resuming a queue: Python, the CLI, the admin, status and the metrics."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.admin.models import ADDITION, DELETION, LogEntry
from django.core.management import CommandError, call_command

from django_rdbtasks import queues
from django_rdbtasks.models import PausedQueue
from django_rdbtasks.testing import drain
from tests.browser.support import VIEW, admin_urls, client_for, require_admin, text, url
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db, *admin_urls()]
__all__ = ["require_admin"]

PAUSE = [*VIEW, "django_rdbtasks.pause_queue"]


def rdbtasks(*args: str) -> str:
    out = StringIO()
    call_command("rdbtasks", *args, stdout=out)
    return out.getvalue()


def test_pause_and_resume_from_python():
    assert queues.pause("emails", by="ops", reason="SMTP down")
    row = PausedQueue.objects.get()
    assert (row.queue_name, row.paused_by, row.reason) == ("emails", "ops", "SMTP down")
    assert list(queues.paused_queues()) == ["emails"]
    assert not queues.pause("emails", by="someone else")  # the first pause stands
    assert PausedQueue.objects.get().paused_by == "ops"
    assert queues.resume("emails")
    assert not queues.resume("emails")
    assert queues.paused_queues() == {}


def test_an_unknown_queue_is_refused_with_the_nearest_name():
    with pytest.raises(queues.UnknownQueue, match="Did you mean 'emails'"):
        queues.pause("emials")
    assert not PausedQueue.objects.exists()


def test_a_paused_queue_is_not_claimed_and_enqueues_still_go_in():
    queues.pause("emails")
    email = tasks.send_email.enqueue("a@example.com")  # enqueued while paused
    other = tasks.record.enqueue("other queue")
    assert [r.id for r in drain()] == [other.id]
    queues.resume("emails")
    assert [r.id for r in drain()] == [email.id]


def test_the_cli_pauses_resumes_and_refuses_a_typo():
    assert "Queue 'emails' paused." in rdbtasks("pause", "emails", "--reason", "SMTP down")
    assert "was paused already" in rdbtasks("pause", "emails")
    assert PausedQueue.objects.get().reason == "SMTP down"
    status = rdbtasks("status")
    assert "emails (paused" in status
    data = json.loads(rdbtasks("status", "--json"))
    assert data["queues"]["emails"]["paused_since"] is not None
    assert data["queues"]["default"]["paused_since"] is None
    assert "Queue 'emails' resumed." in rdbtasks("resume", "emails")
    assert "was not paused" in rdbtasks("resume", "emails")
    with pytest.raises(CommandError, match="Did you mean 'emails'"):
        rdbtasks("pause", "emials")


def test_the_cli_explains_a_task():
    queues.pause("emails", by="ops")
    result = tasks.send_email.enqueue("x@example.com")
    out = rdbtasks("explain", result.id)
    assert "queue 'emails' is paused" in out
    data = json.loads(rdbtasks("explain", result.id, "--json"))
    assert "queue paused" in [f["hold"] for f in data["findings"]]
    with pytest.raises(CommandError, match="No task"):
        rdbtasks("explain", "not-a-task")


def test_the_admin_pauses_with_its_own_permission_and_logs_it():
    viewer = client_for(*VIEW, name="viewer")
    pauser = client_for(*PAUSE, name="pauser")
    dashboard = text(pauser.get(url("task_dashboard")))
    assert url("task_queue", "emails", "pause") in dashboard
    assert url("task_queue", "emails", "pause") not in text(viewer.get(url("task_dashboard")))
    # Without the permission: refused, nothing paused.
    assert viewer.post(url("task_queue", "emails", "pause")).status_code == 403
    assert not PausedQueue.objects.exists()
    assert pauser.get(url("task_queue", "emails", "pause")).status_code == 405
    response = pauser.post(url("task_queue", "emails", "pause"))
    assert response.status_code == 302
    row = PausedQueue.objects.get()
    assert row.paused_by == "pauser"
    assert LogEntry.objects.filter(action_flag=ADDITION, object_repr="emails").exists()
    page = text(pauser.get(url("task_dashboard")))
    assert "paused for" in page
    assert url("task_queue", "emails", "resume") in page
    pauser.post(url("task_queue", "emails", "resume"))
    assert not PausedQueue.objects.exists()
    assert LogEntry.objects.filter(action_flag=DELETION, object_repr="emails").exists()


def test_the_task_page_says_why_it_is_not_running():
    queues.pause("emails")
    result = tasks.send_email.enqueue("y@example.com")
    page = text(client_for(*VIEW).get(url("task_change", result.id)))
    assert "Why is this task not running?" in page
    assert "is paused" in page


@pytest.mark.urls("django_rdbtasks.urls")
def test_the_metrics_say_how_long_a_queue_has_been_paused():
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    from tests.test_metrics import samples, value

    queues.pause("emails")
    client = Client()
    user = User.objects.create_user("metrics", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_task"))
    client.force_login(user)
    found = samples(client.get("/metrics/").content.decode())
    assert value(found, "rdbtasks_queue_paused_seconds", queue="emails") >= 0
    assert ("rdbtasks_queue_paused_seconds", frozenset({"queue": "emails"}.items())) in found
    assert value(found, "rdbtasks_queue_paused_seconds", queue="default") == 0


# -- real worker processes --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", ["optimistic", "skip-locked"])
def test_no_worker_process_claims_from_a_paused_queue(run_workers, vendor, mode):
    from django_rdbtasks.models import Task
    from django_rdbtasks.states import TaskStatus
    from tests.testapp.models import SideEffect

    if vendor == "sqlite" and mode == "skip-locked":
        pytest.skip("SQLite claims in the optimistic mode only")
    queues.pause("emails")
    emails = [tasks.send_email.enqueue(f"{n}@example.com").id for n in range(20)]
    for n in range(20):
        tasks.record.enqueue(f"other-{n}")
    args = ["--burst", "--no-scheduler", "--processes", "2", "--threads", "2", "--mode", mode]
    worker = run_workers(*args, "--poll-interval", "0.05")
    assert worker.wait(120) == 0, worker.log()
    assert SideEffect.objects.filter(key__startswith="other-").count() == 20
    assert not SideEffect.objects.filter(key__startswith="email:").exists()
    paused = Task.objects.filter(pk__in=emails)
    assert set(paused.values_list("status", "attempts")) == {(TaskStatus.READY, 0)}
    queues.resume("emails")
    worker = run_workers(*args, "--poll-interval", "0.05")
    assert worker.wait(120) == 0, worker.log()
    assert SideEffect.objects.filter(key__startswith="email:").count() == 20


def _commits() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        # This backend's own commits (the test's 200 enqueues) are reported
        # when it flushes its statistics, which PostgreSQL may put off for up
        # to 10 s: forced here (at this statement's end), so that they count
        # before the window, not inside it (they once made 224 of 20).
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def _transactions_while(run_workers, seconds: float) -> int:
    import time

    from django_rdbtasks.models import Worker
    from tests.conftest import wait_until

    worker = run_workers("--no-scheduler", "--poll-interval", "0.5", "--queue", "emails")
    wait_until(lambda: Worker.objects.filter(stopped_at__isnull=True).exists())
    time.sleep(2)  # its start-up's transactions (checks, registration) are over
    before = _commits()
    time.sleep(seconds)
    after = _commits()
    worker.stop()
    Worker.objects.all().delete()
    return after - before


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_queues_are_paused_waits_as_an_idle_one_does(run_workers, vendor):
    """No claim-then-skip spin: a paused queue costs the server what an empty one does."""
    if vendor != "postgresql":
        pytest.skip("counts the test database's own transactions (pg_stat_database)")
    idle = _transactions_while(run_workers, 3.0)
    queues.pause("emails")
    for n in range(200):
        tasks.send_email.enqueue(f"{n}@example.com")
    paused = _transactions_while(run_workers, 3.0)
    # Polls every half second and heartbeats: a few dozen at most either way.
    assert paused <= 2 * idle + 10, (paused, idle)
