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
