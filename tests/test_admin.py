"""The operators' admin: every page, every action, and every permission that guards one."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_rdbtasks.jobs import fire_due_jobs
from django_rdbtasks.models import Job, JobRecord, Task, TaskDependency, TaskStatus
from django_rdbtasks.ops import Throughput
from tests.browser.support import (
    admin_urls,
    attempt,
    make_task,
    make_worker,
    now,
    require_admin,
    staff,
)

# Without the admin installed these imports fail; the tests then fail one by one
# with require_admin's explanation instead of stopping the whole run at collection.
if "django.contrib.admin" in settings.INSTALLED_APPS:
    from django.contrib.admin.models import CHANGE, LogEntry

    from django_rdbtasks.admin import Chart, cron_in_words, redact

pytestmark = [
    pytest.mark.django_db,
    *admin_urls(),
    pytest.mark.usefixtures("require_admin"),
]
__all__ = ["require_admin"]  # the fixture, imported for pytest

VIEW = ["django_rdbtasks.view_task"]
RETRY = [*VIEW, "django_rdbtasks.retry_task"]
CANCEL = [*VIEW, "django_rdbtasks.cancel_task"]
JOB_VIEW = ["django_rdbtasks.view_job", "django_rdbtasks.change_job"]


def client_for(*permissions: str, superuser: bool = False, name: str = "op") -> Client:
    client = Client()
    client.force_login(staff(name, permissions, superuser=superuser))
    return client


def url(name: str, *args: object) -> str:
    return reverse(f"admin:django_rdbtasks_{name}", args=args)


def log_messages(obj: object) -> list[str]:
    return list(
        LogEntry.objects.filter(object_id=str(obj.pk), action_flag=CHANGE)
        .order_by("pk")
        .values_list("change_message", flat=True)
    )


def text(response) -> str:
    return response.content.decode()


# -- the task list --------------------------------------------------------------------------


def test_task_list_shows_coloured_status_columns_and_no_add_button() -> None:
    failed = make_task(TaskStatus.FAILED, task_path="tests.testapp.tasks.always_fails")
    make_task(TaskStatus.RUNNING, progress=0.42, progress_message="row 420 of 1000")
    make_task(TaskStatus.SUCCESSFUL, queue_name="emails")
    make_task(TaskStatus.RUNNING, lease_expires_at=now() - dt.timedelta(seconds=1))
    make_task(run_after=now() + dt.timedelta(minutes=5))
    response = client_for(*VIEW).get(url("task_changelist"))
    assert response.status_code == 200
    page = text(response)
    assert 'class="rdbtasks-badge rdbtasks-failed"' in page
    assert 'class="rdbtasks-badge rdbtasks-running"' in page
    assert 'class="rdbtasks-badge rdbtasks-successful"' in page
    # Judged by the database clock read with the rows:
    assert 'class="rdbtasks-badge rdbtasks-stalled"' in page
    assert ">Scheduled</span>" in page
    assert '<strong title="tests.testapp.tasks.always_fails">always_fails</strong>' in page
    assert "2/2" in page  # attempts / max attempts
    assert '<progress max="1" value="0.4200">' in page and "42%" in page
    assert "host-a:101" in page  # the worker, short
    assert url("task_change", failed.pk) in page
    assert url("task_add") not in page
    assert "Retry all failed" not in page  # needs the retry permission


def test_task_list_pages_without_counting_the_table() -> None:
    for _ in range(55):
        make_task(TaskStatus.FAILED)
    client = client_for(*VIEW)
    with CaptureQueriesContext(connection) as queries:
        first = client.get(url("task_changelist"), {"status": "FAILED"})
    page = text(first)
    assert "Tasks 1\u201350" in page
    assert 'rel="next"' in page and 'rel="prev"' not in page
    # No count of the filtered rows (SQLite, the development database, counts
    # the whole table for "N tasks in the table"; the others estimate it).
    counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    assert not [sql for sql in counts if "WHERE" in sql.upper()]
    second = text(client.get(url("task_changelist"), {"status": "FAILED", "p": 2}))
    assert "Tasks 51\u201355" in second
    assert 'rel="prev"' in second and 'rel="next"' not in second
    # No "select all 55": selection is per page, bulk work has its own view.
    assert "Select all" not in page


def test_task_list_says_how_many_rows_the_table_has() -> None:
    make_task()
    page = text(client_for(*VIEW).get(url("task_changelist")))
    assert re.search(r"1 tasks in the table", page)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"status": "FAILED"}, {"failed"}),
        ({"status": "RUNNING"}, {"running", "stalled"}),
        ({"status": "STALLED"}, {"stalled"}),
        ({"status": "SCHEDULED"}, {"later"}),
        ({"queue": "emails"}, {"email"}),
        ({"task": "tests.testapp.tasks.noop"}, {"noop"}),
        ({"enqueued": "1h"}, {"failed", "running", "stalled", "later", "email", "noop"}),
        ({"enqueued": "older"}, {"old"}),
        ({"finished": "1h"}, {"failed", "email"}),
        ({"finished": "older"}, {"old"}),
        ({"finished": "no"}, {"running", "stalled", "later", "noop"}),
    ],
)
def test_task_list_filters(query: dict, expected: set[str]) -> None:
    moment = now()
    long_ago = moment - dt.timedelta(days=40)
    rows = {
        "failed": make_task(TaskStatus.FAILED),
        "running": make_task(TaskStatus.RUNNING),
        "stalled": make_task(TaskStatus.RUNNING, lease_expires_at=moment - dt.timedelta(seconds=5)),
        "later": make_task(run_after=moment + dt.timedelta(hours=1)),
        "email": make_task(TaskStatus.SUCCESSFUL, queue_name="emails"),
        "noop": make_task(
            task_path="tests.testapp.tasks.noop", run_after=moment + dt.timedelta(hours=2)
        ),
        # Enqueued and finished 40 days ago: its id is of that time too (UUIDv7).
        "old": make_task(TaskStatus.SUCCESSFUL, at=long_ago),
    }
    if query == {"status": "SCHEDULED"}:
        expected = {"later", "noop"}
    page = text(client_for(*VIEW).get(url("task_changelist"), query))
    shown = {name for name, task in rows.items() if url("task_change", task.pk) in page}
    assert shown == expected


def test_filters_offer_queues_and_tasks_without_scanning_the_table() -> None:
    make_task(task_path="tests.testapp.tasks.noop", queue_name="other")
    Job.objects.create(name="nightly", task_path="tests.testapp.tasks.record_job", cron="0 3 * * *")
    page = text(client_for(*VIEW).get(url("task_changelist")))
    for choice in ("?queue=emails", "?queue=other", "?task=tests.testapp.tasks.noop"):
        assert choice in page
    assert "?task=tests.testapp.tasks.record_job" in page  # from the job


def test_search_by_id_worker_path_key_and_job() -> None:
    target = make_task(
        TaskStatus.RUNNING,
        task_path="tests.testapp.tasks.sync_account",
        worker_id="box-9:77:1:zz",
        dedup_key="sync:acme",
        job_name="hourly-sync",
    )
    other = make_task()
    client = client_for(*VIEW)
    for term in (str(target.pk), "box-9:77", "sync_acc", "sync:acme", "hourly-sync"):
        page = text(client.get(url("task_changelist"), {"q": term}))
        assert url("task_change", target.pk) in page, term
        assert url("task_change", other.pk) not in page, term


# -- the task page ---------------------------------------------------------------------------


def test_failed_task_page_shows_json_history_and_tracebacks() -> None:
    task = make_task(
        TaskStatus.FAILED,
        task_path="tests.testapp.tasks.always_fails",
        args=["boom"],
        kwargs={"url": "https://example.com", "headers": {"Authorization": "Bearer s3cr3t"}},
        checkpoint={"offset": 100},
    )
    response = client_for(*VIEW).get(url("task_change", task.pk))
    assert response.status_code == 200
    page = text(response)
    assert '<pre class="rdbtasks-json">[\n  &quot;boom&quot;\n]</pre>' in page
    assert "&quot;offset&quot;: 100" in page
    assert "s3cr3t" not in page and "hidden" in page  # secrets are not shown
    assert page.count('<table class="rdbtasks-history">') == 1
    assert page.count("<details") == 2  # one traceback per failed attempt
    assert "rdbtasks-retry" in page and "rdbtasks-failed" in page  # the two outcomes
    assert "<code>builtins.ValueError</code>: boom" in page
    assert "raise ValueError(message)" in page  # the traceback itself
    assert "host-a:101:0:abcd" in page
    # Read-only: no save button, no delete link, no retry button without the permission.
    assert 'name="_save"' not in page
    assert url("task_delete", task.pk) not in page
    assert url("task_retry", task.pk) not in page


def test_running_task_page_shows_progress_current_attempt_and_relations() -> None:
    parent = make_task(TaskStatus.SUCCESSFUL, task_path="tests.testapp.tasks.noop")
    task = make_task(
        TaskStatus.RUNNING, progress=0.5, progress_message="halfway", job_name="nightly"
    )
    child = make_task(TaskStatus.WAITING, task_path="tests.testapp.tasks.record")
    TaskDependency.objects.create(parent=parent, child=task)
    TaskDependency.objects.create(parent=task, child=child)
    job = Job.objects.create(name="nightly", task_path="tests.testapp.tasks.add", cron="0 3 * * *")
    JobRecord.objects.create(job_name="nightly", key="2026-01-01T03:00:00Z", task=task)
    page = text(client_for(*VIEW).get(url("task_change", task.pk)))
    assert '<progress max="1" value="0.5000">' in page and "halfway" in page
    assert "lease held until" in page
    assert url("task_change", parent.pk) in page
    assert url("task_change", child.pk) in page
    assert url("job_change", job.pk) in page
    assert "record 2026-01-01T03:00:00Z" in page


def test_rows_cannot_be_added_changed_or_deleted_even_by_a_superuser() -> None:
    task = make_task(TaskStatus.FAILED)
    client = client_for(superuser=True)
    assert client.get(url("task_add")).status_code == 403
    response = client.post(url("task_change", task.pk), {"task_path": "os.system"})
    assert response.status_code == 403
    assert client.post(url("task_delete", task.pk), {"post": "yes"}).status_code == 403
    assert Task.objects.get(pk=task.pk).task_path == "tests.testapp.tasks.add"


# -- retry / requeue --------------------------------------------------------------------------


def _action(client: Client, action: str, *tasks: Task):
    return client.post(
        url("task_changelist"),
        {"action": action, "_selected_action": [str(t.pk) for t in tasks]},
        follow=True,
    )


def test_retry_action_requeues_failed_and_ready_tasks_and_logs_each() -> None:
    failed = make_task(TaskStatus.FAILED)
    cancelled = make_task(TaskStatus.CANCELLED)
    done = make_task(TaskStatus.SUCCESSFUL)
    response = _action(client_for(*RETRY), "retry_tasks", failed, cancelled, done)
    page = text(response)
    assert "Requeued 2 tasks." in page
    assert "1 task was not requeued" in page
    failed.refresh_from_db()
    assert failed.status == TaskStatus.READY
    assert failed.attempts == 0 and failed.finished_at is None
    assert len(failed.history) == 2  # the history of the failed attempts is kept
    assert Task.objects.get(pk=cancelled.pk).status == TaskStatus.READY
    assert Task.objects.get(pk=done.pk).status == TaskStatus.SUCCESSFUL
    assert log_messages(failed) == ["Requeued (was FAILED)."]
    assert log_messages(cancelled) == ["Requeued (was CANCELLED)."]
    assert log_messages(done) == []


def test_retry_action_is_refused_without_the_retry_permission() -> None:
    failed = make_task(TaskStatus.FAILED)
    client = client_for(*VIEW, "django_rdbtasks.cancel_task")
    page = text(client.get(url("task_changelist")))
    assert 'value="retry_tasks"' not in page  # not offered
    assert 'value="cancel_tasks"' in page
    _action(client, "retry_tasks", failed)
    assert Task.objects.get(pk=failed.pk).status == TaskStatus.FAILED
    assert log_messages(failed) == []


def test_retry_button_on_the_task_page() -> None:
    failed = make_task(TaskStatus.FAILED)
    client = client_for(*RETRY)
    page = text(client.get(url("task_change", failed.pk)))
    assert url("task_retry", failed.pk) in page
    assert client.get(url("task_retry", failed.pk)).status_code == 405  # POST only
    response = client.post(url("task_retry", failed.pk), follow=True)
    assert "The task was requeued" in text(response)
    assert Task.objects.get(pk=failed.pk).status == TaskStatus.READY
    assert log_messages(failed) == ["Requeued (was FAILED)."]
    # Now READY: requeueing again just makes it due now; a running one is refused.
    running = make_task(TaskStatus.RUNNING)
    response = client.post(url("task_retry", running.pk), follow=True)
    assert "this one is RUNNING" in text(response)
    assert Task.objects.get(pk=running.pk).status == TaskStatus.RUNNING


def test_retry_button_is_refused_without_the_permission() -> None:
    failed = make_task(TaskStatus.FAILED)
    client = client_for(*CANCEL)
    assert url("task_retry", failed.pk) not in text(client.get(url("task_change", failed.pk)))
    assert client.post(url("task_retry", failed.pk)).status_code == 403
    assert Task.objects.get(pk=failed.pk).status == TaskStatus.FAILED


def test_retry_all_failed_asks_then_requeues_the_matching_ones() -> None:
    old = make_task(TaskStatus.FAILED, at=now() - dt.timedelta(days=3))
    recent = [make_task(TaskStatus.FAILED, task_path="tests.testapp.tasks.always_fails")]
    recent.append(make_task(TaskStatus.FAILED, queue_name="emails"))
    untouched = make_task(TaskStatus.CANCELLED)
    client = client_for(*RETRY)
    assert url("task_retry_failed") in text(client.get(url("task_changelist")))

    confirm = text(client.get(url("task_retry_failed"), {"window": "24h"}))
    assert "2 failed tasks will be set READY again" in confirm
    assert "tests.testapp.tasks.always_fails" in confirm
    assert Task.objects.filter(status=TaskStatus.FAILED).count() == 3  # nothing yet

    by_queue = text(client.get(url("task_retry_failed"), {"window": "24h", "queue": "emails"}))
    assert "1 failed task will be set READY again" in by_queue

    response = client.post(url("task_retry_failed"), {"window": "24h", "confirm": "1"}, follow=True)
    assert "Requeued 2 failed tasks." in text(response)
    assert {t.status for t in Task.objects.filter(pk__in=[r.pk for r in recent])} == {"READY"}
    assert Task.objects.get(pk=old.pk).status == TaskStatus.FAILED
    assert Task.objects.get(pk=untouched.pk).status == TaskStatus.CANCELLED
    assert all(log_messages(r) == ["Requeued (was FAILED)."] for r in recent)

    # Without the window: every failed task.
    client.post(url("task_retry_failed"), {"confirm": "1"})
    assert Task.objects.get(pk=old.pk).status == TaskStatus.READY


def test_retry_all_failed_needs_the_confirmation_and_the_permission() -> None:
    failed = make_task(TaskStatus.FAILED)
    client = client_for(*RETRY)
    client.post(url("task_retry_failed"), {"window": ""})  # no confirm: just the page again
    assert Task.objects.get(pk=failed.pk).status == TaskStatus.FAILED
    refused = client_for(*CANCEL, name="other")
    assert refused.get(url("task_retry_failed")).status_code == 403
    assert refused.post(url("task_retry_failed"), {"confirm": "1"}).status_code == 403
    assert Task.objects.get(pk=failed.pk).status == TaskStatus.FAILED
    assert "Retry all failed" not in text(refused.get(url("task_changelist")))


# -- cancel ------------------------------------------------------------------------------------


def test_cancel_action_cancels_ready_asks_running_and_leaves_finished() -> None:
    ready = make_task()
    waiting = make_task(TaskStatus.WAITING)
    running = make_task(TaskStatus.RUNNING)
    done = make_task(TaskStatus.SUCCESSFUL)
    page = text(_action(client_for(*CANCEL), "cancel_tasks", ready, waiting, running, done))
    assert "Cancelled 2 tasks." in page
    assert "Asked 1 running task to stop" in page
    assert "1 task had already finished" in page
    assert Task.objects.get(pk=ready.pk).status == TaskStatus.CANCELLED
    assert Task.objects.get(pk=waiting.pk).status == TaskStatus.CANCELLED
    running.refresh_from_db()
    assert running.status == TaskStatus.RUNNING and running.cancel_requested
    assert Task.objects.get(pk=done.pk).status == TaskStatus.SUCCESSFUL
    assert log_messages(ready) == ["Cancelled (was READY)."]
    assert log_messages(running) == ["Asked to stop (cancel requested while running)."]
    assert log_messages(done) == []


def test_cancelling_running_task_shows_as_cancelling_in_the_list() -> None:
    running = make_task(TaskStatus.RUNNING, cancel_requested=True)
    page = text(client_for(*CANCEL).get(url("task_changelist")))
    assert "Cancelling" in page
    # And its page offers no second cancel.
    assert url("task_cancel", running.pk) not in text(
        client_for(*CANCEL, name="b").get(url("task_change", running.pk))
    )


def test_cancel_is_refused_without_the_cancel_permission() -> None:
    ready = make_task()
    client = client_for(*RETRY)
    assert 'value="cancel_tasks"' not in text(client.get(url("task_changelist")))
    _action(client, "cancel_tasks", ready)
    assert client.post(url("task_cancel", ready.pk)).status_code == 403
    assert Task.objects.get(pk=ready.pk).status == TaskStatus.READY
    assert log_messages(ready) == []


def test_cancel_button_on_the_task_page() -> None:
    ready = make_task()
    client = client_for(*CANCEL)
    assert url("task_cancel", ready.pk) in text(client.get(url("task_change", ready.pk)))
    response = client.post(url("task_cancel", ready.pk), follow=True)
    assert "Cancelled 1 task." in text(response)
    assert Task.objects.get(pk=ready.pk).status == TaskStatus.CANCELLED


def test_staff_without_view_permission_sees_nothing() -> None:
    task = make_task(TaskStatus.FAILED)
    client = client_for("django_rdbtasks.retry_task")  # an action permission alone
    assert client.get(url("task_changelist")).status_code == 403
    assert client.get(url("task_change", task.pk)).status_code == 403
    assert client.get(url("task_dashboard")).status_code == 403
    anonymous = Client()
    assert anonymous.get(url("task_dashboard")).status_code == 302  # to the login page


# -- dashboard ---------------------------------------------------------------------------------


def test_dashboard_counts_lag_chart_workers_and_links() -> None:
    moment = now()
    make_task(run_after=moment - dt.timedelta(seconds=125))  # waiting for over two minutes
    make_task(queue_name="emails")
    make_task(run_after=moment + dt.timedelta(hours=1))
    make_task(TaskStatus.RUNNING)
    make_task(TaskStatus.FAILED, at=moment - dt.timedelta(minutes=5))
    for minutes in (1, 2, 2, 30):
        make_task(TaskStatus.SUCCESSFUL, at=moment - dt.timedelta(minutes=minutes))
    make_worker("host-a:101")
    make_worker("host-b:202", age=600)  # gone
    Job.objects.create(
        name="nightly",
        task_path="tests.testapp.tasks.add",
        cron="0 3 * * *",
        next_run_at=moment + dt.timedelta(hours=3),
    )
    response = client_for(*RETRY).get(url("task_dashboard"))
    assert response.status_code == 200
    page = text(response)
    assert "<svg" in page and 'id="rdbtasks-chart"' in page
    assert page.count('class="rdbtasks-bar-ok"') == 3  # three minutes had successes
    assert page.count('class="rdbtasks-bar-failed"') == 1
    assert "2 min" in page  # the lag
    queues = page.split('id="rdbtasks-queues"')[1].split("</table>")[0]
    default_row = queues.split('<th scope="row">')[1]
    assert "?queue=default" in default_row
    assert 'href="/admin/django_rdbtasks/task/?status=READY&amp;queue=default"' in queues
    assert (
        'href="/admin/django_rdbtasks/task/?status=FAILED&amp;finished=1h&amp;queue=default"'
        in queues
    )
    assert "host-a:101" in page and "host-b:202" not in page.split('id="rdbtasks-workers"')[1]
    assert "1 gone" in page
    assert "nightly" in page and "At 03:00" in page
    assert url("task_retry_failed") in page
    assert "<script" not in page.split('id="content-main"')[1]  # no JavaScript, no CDN
    assert "cdn" not in page.lower()


def test_dashboard_refreshes_itself_when_asked() -> None:
    client = client_for(*VIEW)
    assert 'http-equiv="refresh"' not in text(client.get(url("task_dashboard")))
    page = text(client.get(url("task_dashboard"), {"refresh": "10"}))
    assert '<meta http-equiv="refresh" content="10">' in page


def test_chart_scales_bars_into_the_plot() -> None:
    start = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
    minutes = [start + dt.timedelta(minutes=i) for i in range(60)]
    succeeded = [0] * 60
    failed = [0] * 60
    succeeded[59], failed[59], succeeded[0] = 30, 7, 3
    chart = Chart.build(Throughput(minutes, succeeded, failed, [0] * 60))
    assert chart.peak == 37
    assert [value for _, value in chart.y_ticks] == [0, 10, 20, 30, 40]  # round steps
    last = chart.bars[-1]
    heights = {css: h for css, _, h in last.segments}
    assert heights["ok"] == pytest.approx(30 / 40 * chart.plot_height, abs=0.01)
    assert all(chart.top <= y <= chart.bottom for _, y, _ in last.segments)
    assert "30 succeeded, 7 failed" in last.title
    assert [m.minute for _, m in chart.x_ticks] == [0, 10, 20, 30, 40, 50]


# -- jobs --------------------------------------------------------------------------------------


def _job(**fields) -> Job:
    values = {
        "name": "nightly",
        "task_path": "tests.testapp.tasks.record_job",
        "kwargs": {"job": "nightly"},
        "cron": "30 2 * * 1-5",
        "timezone": "Europe/Berlin",
        "next_run_at": now() + dt.timedelta(hours=1),
    }
    values.update(fields)
    return Job.objects.create(**values)


def test_job_list_and_page_show_cron_in_words_and_next_five_runs() -> None:
    job = _job()
    JobRecord.objects.create(
        job_name="nightly", key="2026-01-05T01:30:00Z", status="FAILED", error="ValueError: nope"
    )
    client = client_for(*JOB_VIEW)
    listing = text(client.get(url("job_changelist")))
    assert "At 02:30, Monday through Friday" in listing
    assert "rdbtasks-failed" in listing  # the last run's outcome
    page = text(client.get(url("job_change", job.pk)))
    ticks = re.findall(r"<li>(\w{3} \d{4}-\d\d-\d\d 02:30 CES?T)", page)
    assert len(ticks) == 5
    assert all(day[:3] not in ("Sat", "Sun") for day in ticks)
    assert "2026-01-05T01:30:00Z" in page  # the recent records table
    assert "ValueError: nope" in page


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("cron", "61 * * * *", "Invalid cron expression"),
        ("timezone", "Mars/Olympus", "Unknown time zone"),
        ("task_path", "os.system", "is not a task"),
        ("task_path", "elsewhere.tasks.job", "not part of an installed app"),
        ("task_path", "tests.testapp.tasks.not_a_task", "is not a task"),
        ("kwargs", "[1, 2]", "must be a JSON object"),
    ],
)
def test_job_form_validates_cron_timezone_task_and_kwargs(field, value, message) -> None:
    data = {
        "name": "report",
        "task_path": "tests.testapp.tasks.record_job",
        "kwargs": '{"job": "report"}',
        "queue_name": "",
        "priority": "",
        "cron": "0 3 * * *",
        "timezone": "UTC",
        "misfire_policy": "run_once",
        "enabled": "on",
    }
    data[field] = value
    client = client_for(*JOB_VIEW, "django_rdbtasks.add_job", "django_rdbtasks.pause_job")
    response = client.post(url("job_add"), data)
    assert response.status_code == 200
    assert message in text(response)
    assert not Job.objects.exists()


def test_adding_and_editing_a_job_schedules_its_next_tick() -> None:
    client = client_for(*JOB_VIEW, "django_rdbtasks.add_job", "django_rdbtasks.pause_job")
    data = {
        "name": "report",
        "task_path": "tests.testapp.tasks.record_job",
        "kwargs": '{"job": "report"}',
        "queue_name": "",
        "priority": "",
        "cron": "0 3 * * *",
        "timezone": "UTC",
        "misfire_policy": "run_once",
        "enabled": "on",
    }
    response = client.post(url("job_add"), data)
    assert response.status_code == 302, text(response)
    job = Job.objects.get(name="report")
    assert job.next_run_at is not None and job.next_run_at.hour == 3
    version = job.version
    data["cron"] = "15 4 * * *"
    assert client.post(url("job_change", job.pk), data).status_code == 302
    job.refresh_from_db()
    assert (job.next_run_at.hour, job.next_run_at.minute) == (4, 15)
    assert job.version == version + 1  # an in-flight fire of the old schedule misses its CAS


def test_run_now_fires_the_job_through_the_scheduler() -> None:
    job = _job()
    client = client_for(*JOB_VIEW, "django_rdbtasks.run_job")
    page = text(client.get(url("job_change", job.pk)))
    assert url("job_run", job.pk) in page
    assert url("job_pause", job.pk) not in page  # pausing is another permission
    response = client.post(url("job_run", job.pk), follow=True)
    assert "The job will run within seconds." in text(response)
    job.refresh_from_db()
    assert job.next_run_at <= now()
    assert log_messages(job) == ["Run now requested."]
    assert fire_due_jobs() == 1
    record = JobRecord.objects.get(job_name="nightly")
    assert record.task is not None
    assert record.task.task_path == "tests.testapp.tasks.record_job"


def test_run_now_is_refused_without_the_permission_and_for_paused_jobs() -> None:
    job = _job()
    client = client_for(*JOB_VIEW, "django_rdbtasks.pause_job")
    assert url("job_run", job.pk) not in text(client.get(url("job_change", job.pk)))
    assert client.post(url("job_run", job.pk)).status_code == 403
    changes = {"action": "run_now", "_selected_action": [job.pk]}
    client.post(url("job_changelist"), changes)
    assert Job.objects.get(pk=job.pk).version == job.version
    paused = _job(name="paused", enabled=False)
    runner = client_for(*JOB_VIEW, "django_rdbtasks.run_job", name="runner")
    response = runner.post(url("job_run", paused.pk), follow=True)
    assert "paused; enable it first" in text(response)
    assert Job.objects.get(pk=paused.pk).version == paused.version


def test_pause_and_enable_buttons_and_actions() -> None:
    job = _job(next_run_at=now() - dt.timedelta(days=2))  # it missed ticks before the pause
    client = client_for(*JOB_VIEW, "django_rdbtasks.pause_job")
    client.post(url("job_pause", job.pk))
    job.refresh_from_db()
    assert not job.enabled
    page = text(client.get(url("job_change", job.pk)))
    assert url("job_enable", job.pk) in page and url("job_run", job.pk) not in page
    client.post(url("job_enable", job.pk))
    job.refresh_from_db()
    assert job.enabled
    assert job.next_run_at > now()  # resumes from its next tick; missed ticks are not owed
    assert log_messages(job) == ["Paused.", "Enabled."]
    client.post(url("job_changelist"), {"action": "pause_jobs", "_selected_action": [job.pk]})
    assert not Job.objects.get(pk=job.pk).enabled
    client.post(url("job_changelist"), {"action": "enable_jobs", "_selected_action": [job.pk]})
    assert Job.objects.get(pk=job.pk).enabled


def test_pausing_is_refused_without_the_permission() -> None:
    job = _job()
    client = client_for(*JOB_VIEW, "django_rdbtasks.run_job")
    assert client.post(url("job_pause", job.pk)).status_code == 403
    client.post(url("job_changelist"), {"action": "pause_jobs", "_selected_action": [job.pk]})
    # Nor through the form: "enabled" is read-only without pause_job.
    page = text(client.get(url("job_change", job.pk)))
    assert 'name="enabled"' not in page
    assert Job.objects.get(pk=job.pk).enabled


def test_a_job_declared_in_code_is_read_only_but_can_be_paused() -> None:
    job = _job(from_code=True)
    client = client_for(*JOB_VIEW, "django_rdbtasks.pause_job")
    page = text(client.get(url("job_change", job.pk)))
    assert 'name="cron"' not in page and 'name="task_path"' not in page
    assert 'name="enabled"' in page
    data = {"misfire_policy": "run_once"}  # "enabled" left out: unticked
    assert client.post(url("job_change", job.pk), data).status_code == 302
    assert not Job.objects.get(pk=job.pk).enabled


def test_an_invalid_read_only_field_is_reported_not_a_crash() -> None:
    # Declared in code, then the code lost its task: the form says so.
    job = _job(from_code=True, task_path="tests.testapp.tasks.gone_away")
    client = client_for(*JOB_VIEW, "django_rdbtasks.pause_job")
    response = client.post(url("job_change", job.pk), {"enabled": "on"})
    assert response.status_code == 200
    assert "task_path: " in text(response) and "gone_away" in text(response)


# -- job records and workers ------------------------------------------------------------------


def test_job_records_filter_and_link_to_their_task_and_job() -> None:
    job = _job()
    task = make_task(TaskStatus.SUCCESSFUL, job_name="nightly")
    ok = JobRecord.objects.create(job_name="nightly", key="k1", status="SUCCESSFUL", task=task)
    bad = JobRecord.objects.create(job_name="other", key="k2", status="FAILED", error="boom")
    client = client_for("django_rdbtasks.view_jobrecord")
    page = text(client.get(url("jobrecord_changelist")))
    assert url("task_change", task.pk) in page and url("job_change", job.pk) in page
    by_job = text(client.get(url("jobrecord_changelist"), {"job": "nightly"}))
    assert (
        url("jobrecord_change", ok.pk) in by_job and url("jobrecord_change", bad.pk) not in by_job
    )
    by_status = text(client.get(url("jobrecord_changelist"), {"status": "FAILED"}))
    assert url("jobrecord_change", bad.pk) in by_status
    assert url("jobrecord_change", ok.pk) not in by_status
    superuser = client_for(superuser=True, name="root")
    assert superuser.post(url("jobrecord_delete", ok.pk), {"post": "yes"}).status_code == 403


def test_workers_alive_stopped_and_gone_with_what_they_run() -> None:
    alive = make_worker("host-a:101")
    gone = make_worker("host-b:202", age=600)
    stopped = make_worker("host-c:303", age=30, stopped_at=now())
    task = make_task(TaskStatus.RUNNING, worker_id="host-a:101:0:abcd")
    client = client_for("django_rdbtasks.view_worker", "django_rdbtasks.delete_worker")
    page = text(client.get(url("worker_changelist")))
    assert page.count("rdbtasks-badge") == 3
    assert "Alive" in page and "Gone" in page and "Stopped" in page
    assert "worker_id__startswith=host-a%3A101%3A" in page
    for state, expected in (("alive", alive), ("gone", gone), ("stopped", stopped)):
        filtered = text(client.get(url("worker_changelist"), {"state": state}))
        shown = [w for w in (alive, gone, stopped) if url("worker_change", w.pk) in filtered]
        assert shown == [expected], state
    detail = text(client.get(url("worker_change", alive.pk)))
    assert url("task_change", task.pk) in detail
    # What a worker runs, from its link: the RUNNING tasks with its prefix.
    viewer = client_for(*VIEW, name="viewer")
    held = text(
        viewer.get(
            url("task_changelist"),
            {"status": "RUNNING", "worker_id__startswith": "host-a:101:"},
        )
    )
    assert url("task_change", task.pk) in held
    # Rows of gone workers may be deleted; those of live ones may not.
    assert client.post(url("worker_delete", alive.pk), {"post": "yes"}).status_code == 403
    assert client.post(url("worker_delete", gone.pk), {"post": "yes"}).status_code == 302


# -- helpers -----------------------------------------------------------------------------------


def test_redact_hides_secret_looking_keys_at_any_depth() -> None:
    value = {
        "url": "https://x",
        "headers": {"Authorization": "Bearer t", "X-Api-Key": "k", "Accept": "json"},
        "items": [{"password": "p", "name": "n"}],
    }
    shown = redact(value)
    assert shown["url"] == "https://x"
    assert shown["headers"]["Accept"] == "json"
    assert "t" not in json.dumps(shown["headers"]["Authorization"]).replace("hidden", "")
    assert shown["headers"]["X-Api-Key"] != "k"
    assert shown["items"][0] == {"password": shown["headers"]["X-Api-Key"], "name": "n"}
    assert value["headers"]["Authorization"] == "Bearer t"  # the original is untouched


def test_cron_in_words() -> None:
    assert cron_in_words("*/5 * * * *") == "Every 5 minutes"
    assert cron_in_words("0 3 * * *") == "At 03:00"
    assert cron_in_words("@daily") == "At 00:00"
    assert cron_in_words("not a cron") == "not a cron"


def test_history_of_a_lost_attempt() -> None:
    entry = attempt(1, "LOST")
    entry["exception_class_path"] = "django_rdbtasks.exceptions.WorkerLost"
    entry["traceback"] = "worker host-a:101:0:abcd stopped renewing its lease during attempt 1"
    task = make_task(TaskStatus.READY, history=[entry], attempts=1)
    page = text(client_for(*VIEW).get(url("task_change", task.pk)))
    assert "rdbtasks-lost" in page and "WorkerLost" in page
