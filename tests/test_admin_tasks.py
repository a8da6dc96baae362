"""The task admin: the list, a task's page, and the operator actions with their permissions."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from django_rdbtasks.models import Job, JobRecord, Task, TaskDependency, TaskStatus
from tests.browser.support import (
    CANCEL,
    DISCARD,
    RETRY,
    VIEW,
    admin_urls,
    attempt,
    client_for,
    log_messages,
    make_task,
    now,
    require_admin,
    text,
    url,
)

if "django.contrib.admin" in settings.INSTALLED_APPS:
    from django.contrib.admin.models import DELETION

pytestmark = [
    pytest.mark.django_db,
    *admin_urls(),
    pytest.mark.usefixtures("require_admin"),
]
__all__ = ["require_admin"]  # the fixture, imported for pytest

#: The admin's one format of a moment (tests run in UTC).
WHEN = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def user_error_history(class_path: str, message: str) -> list[dict]:
    entry = attempt(1, "FAILED")
    entry["exception_class_path"] = class_path
    entry["traceback"] = (
        "Traceback (most recent call last):\n"
        '  File "/srv/venv/lib/python3.12/site-packages/django_rdbtasks/worker/process.py", '
        "line 480, in _call\n"
        "    return task.call(*args, **row.kwargs)\n"
        '  File "/srv/venv/lib/python3.12/site-packages/django/tasks/base.py", line 200, in call\n'
        "    return self.func(*args, **kwargs)\n"
        '  File "/srv/app/app/tasks.py", line 12, in charge\n'
        "    raise PaymentGatewayError(reply['message'] + '" + "x" * 400 + "')\n"
        f"{class_path}: {message}\n"
    )
    return [entry]


# -- the list ---------------------------------------------------------------------------------


def test_task_list_shows_coloured_status_columns_and_no_add_button() -> None:
    failed = make_task(TaskStatus.FAILED, task_path="tests.testapp.tasks.always_fails")
    make_task(TaskStatus.RUNNING, progress=0.42, progress_message="row 420 of 1000")
    make_task(TaskStatus.SUCCESSFUL, queue_name="emails", priority=10)
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
    # The name, breakable after underscores, its module under it (all of it on hover).
    assert 'title="tests.testapp.tasks.always_fails"><strong>always_<wbr>fails</strong>' in page
    assert "2/2" in page  # attempts / max attempts
    assert '<progress max="1" value="0.4200">' in page and "42%" in page
    assert "host-a:101" in page  # the worker, short
    assert "emails <span" in page and "+10" in page  # a priority beside its queue
    assert url("task_change", failed.pk) in page
    assert url("task_add") not in page
    assert "Retry all failed" not in page  # needs the retry permission


def test_failed_rows_show_their_error_on_one_line() -> None:
    failed = make_task(
        TaskStatus.FAILED,
        history=user_error_history("app.tasks.PaymentGatewayError", "card declined"),
    )
    make_task(TaskStatus.SUCCESSFUL)
    page = text(client_for(*VIEW).get(url("task_changelist")))
    row = page.split(url("task_change", failed.pk))[1].split("</tr>")[0]
    assert ">PaymentGatewayError: card declined</span>" in row
    assert 'title="app.tasks.PaymentGatewayError: card declined"' in row
    assert "<br" not in row  # one line


def test_dates_have_one_format_with_seconds_and_zone_and_tiny_durations_say_so() -> None:
    moment = now()
    task = make_task(
        TaskStatus.SUCCESSFUL,
        last_attempted_at=moment,
        finished_at=moment + dt.timedelta(microseconds=300),
        history=[attempt(1, "SUCCESSFUL", started=moment, seconds=0.0003, error=False)],
    )
    client = client_for(*VIEW)
    listing = text(client.get(url("task_changelist")))
    row = listing.split(url("task_change", task.pk))[1].split("</tr>")[0]
    assert len(WHEN.findall(row)) == 2  # enqueued, finished
    assert "<1 ms" in row.replace("&lt;", "<")
    page = text(client.get(url("task_change", task.pk))).replace("&lt;", "<")
    assert "0 ms" not in page and "<1 ms" in page
    assert len(WHEN.findall(page)) >= 6  # the times of the row and of its attempt
    assert not re.search(r"\b[A-Z][a-z]{2}\. \d+, \d{4}", page)  # no "Nov. 22, 2026"


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
    assert re.search(r"\b1 task in the table", page)  # one task, not "1 tasks"
    make_task()
    page = text(client_for(*VIEW, name="other").get(url("task_changelist")))
    assert re.search(r"\b2 tasks in the table", page)


def test_breadcrumbs_do_not_say_tasks_twice() -> None:
    task = make_task()
    client = client_for(*VIEW)
    for page in (
        text(client.get(url("task_changelist"))),
        text(client.get(url("task_change", task.pk))),
    ):
        assert breadcrumbs(page).startswith("Home Task queue Tasks")
        assert "Tasks Tasks" not in breadcrumbs(page)


def breadcrumbs(page: str) -> str:
    """The words of a page's breadcrumbs."""
    block = page.split('class="breadcrumbs"')[1]
    end = min(i for i in (block.find("</ol>"), block.find("</div>")) if i >= 0)
    words = re.sub(r"<[^>]+>", " ", block[1:end]).replace("&rsaquo;", " ")
    return " ".join(words.split())


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"status": "FAILED"}, {"failed"}),
        ({"status": "RUNNING"}, {"running", "stalled"}),
        ({"status": "STALLED"}, {"stalled"}),
        ({"status": "SCHEDULED"}, {"later", "noop"}),
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


def test_search_by_id_running_worker_path_key_and_job() -> None:
    target = make_task(
        TaskStatus.RUNNING,
        task_path="tests.testapp.tasks.sync_account",
        worker_id="box-9:77:1:zz",
        dedup_key="sync:acme",
        job_name="hourly-sync",
    )
    other = make_task()
    client = client_for(*VIEW)
    terms = [str(target.pk), "box-9:77", "tests.testapp.tasks.sync_acc", "sync:acme", "hourly-sy"]
    terms += ["sync_acc", "SYNC_ACCOUNT", "testapp.tasks.s"]  # any part of a path, any case
    if connection.vendor == "postgresql":
        terms += ["acme", "ly-sync"]  # any part, through the trigram indexes
    for term in terms:
        page = text(client.get(url("task_changelist"), {"q": term}))
        assert url("task_change", target.pk) in page, term
        assert url("task_change", other.pk) not in page, term
    nothing = text(client.get(url("task_changelist"), {"q": "zzz-no-such-thing"}))
    assert url("task_change", target.pk) not in nothing


def plan_without_seqscan(queryset) -> str:
    """PostgreSQL's plan for ``queryset`` where an index can serve it (tiny tables read whole)."""
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        try:
            return queryset.order_by().explain()
        finally:
            cursor.execute("SET enable_seqscan = on")


def test_the_search_uses_its_indexes_on_postgresql() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the plans of PostgreSQL")
    from django.contrib.auth.models import AnonymousUser
    from django.test import RequestFactory

    from django_rdbtasks.admin.tasks import TaskAdmin
    from django_rdbtasks.models import Task as TaskModel

    request = RequestFactory().get("/")
    request.user = AnonymousUser()
    model_admin = TaskAdmin(TaskModel, None)  # type: ignore[arg-type]
    found, _ = model_admin.get_search_results(request, TaskModel.objects.all(), "nothing-like-it")
    plan = plan_without_seqscan(found)
    for index in (
        "rdbtasks_task_job_search",
        "rdbtasks_task_dedup_search",
        "rdbtasks_task_lease",
    ):
        assert index in plan, plan
    # No path has the term: no arm for paths at all.
    assert '"task_path" IN' not in str(found.query)
    make_task(task_path="tests.testapp.tasks.sync_account")
    found, _ = model_admin.get_search_results(request, TaskModel.objects.all(), "sync_acc")
    plan = plan_without_seqscan(found)
    assert "rdbtasks_task_finished_path" in plan, plan


# -- a task's page -------------------------------------------------------------------------------


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
    assert page.count("<details>") + page.count("<details open>") == 2  # one per failed attempt
    assert "rdbtasks-retry" in page and "rdbtasks-failed" in page  # the two outcomes
    assert "<code>builtins.ValueError</code>: boom" in page
    assert "raise ValueError(message)" in page  # the traceback itself
    assert "host-a:101:0:abcd" in page
    # Read-only: no save button, no delete link, no retry button without the permission.
    assert 'name="_save"' not in page
    assert url("task_delete", task.pk) not in page
    assert url("task_retry", task.pk) not in page
    assert url("task_discard", task.pk) not in page


@pytest.mark.parametrize(
    ("class_path", "message"),
    [
        ("app.tasks.PaymentGatewayError", "card declined"),
        ("django_rdbtasks.exceptions.TaskCancelled", "cancelled by an operator while running"),
        ("builtins.ValueError", "boom"),
    ],
)
def test_error_summaries_name_the_class_once(class_path: str, message: str) -> None:
    task = make_task(TaskStatus.FAILED, history=user_error_history(class_path, message))
    page = text(client_for(*VIEW).get(url("task_change", task.pk)))
    summary = page.split("<summary>")[1].split("</summary>")[0]
    assert summary == f"<code>{class_path}</code>: {message}"
    listing = text(client_for(*VIEW, name="b").get(url("task_changelist")))
    assert listing.count(">" + class_path.rpartition(".")[2] + ":") == 1


def test_tracebacks_wrap_and_fold_the_frames_of_the_task_queue() -> None:
    task = make_task(
        TaskStatus.FAILED,
        history=user_error_history("app.tasks.PaymentGatewayError", "card declined"),
    )
    page = text(client_for(*VIEW).get(url("task_change", task.pk)))
    traceback = page.split('<div class="rdbtasks-traceback">')[1].split("</div>")[0]
    folded = traceback.split('<details class="rdbtasks-frames">')[1].split("</details>")[0]
    assert "2 frames of the task queue" in folded
    assert "django_rdbtasks/worker/process.py" in folded and "django/tasks/base.py" in folded
    own = traceback.split("</details>")[1]
    assert "/srv/app/app/tasks.py" in own and "card declined" in own  # the task's own, open
    css = (settings_static() / "admin.css").read_text()
    assert "white-space: pre-wrap" in css.split(".rdbtasks-traceback pre")[1].split("}")[0]


def settings_static():
    from pathlib import Path

    import django_rdbtasks

    return Path(django_rdbtasks.__file__).parent / "static" / "django_rdbtasks"


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


def test_history_of_a_lost_attempt() -> None:
    entry = attempt(1, "LOST")
    entry["exception_class_path"] = "django_rdbtasks.exceptions.WorkerLost"
    entry["traceback"] = "worker host-a:101:0:abcd stopped renewing its lease during attempt 1"
    task = make_task(TaskStatus.READY, history=[entry], attempts=1)
    page = text(client_for(*VIEW).get(url("task_change", task.pk)))
    assert "rdbtasks-lost" in page and "WorkerLost" in page
    assert "stopped renewing its lease" in page


def test_rows_cannot_be_added_changed_or_deleted_even_by_a_superuser() -> None:
    task = make_task(TaskStatus.FAILED)
    client = client_for(superuser=True)
    assert client.get(url("task_add")).status_code == 403
    response = client.post(url("task_change", task.pk), {"task_path": "os.system"})
    assert response.status_code == 403
    assert client.post(url("task_delete", task.pk), {"post": "yes"}).status_code == 403
    assert Task.objects.get(pk=task.pk).task_path == "tests.testapp.tasks.add"


def test_staff_without_view_permission_sees_nothing() -> None:
    task = make_task(TaskStatus.FAILED)
    client = client_for("django_rdbtasks.retry_task")  # an action permission alone
    assert client.get(url("task_changelist")).status_code == 403
    assert client.get(url("task_change", task.pk)).status_code == 403
    assert client.get(url("task_dashboard")).status_code == 403
    anonymous = Client()
    assert anonymous.get(url("task_dashboard")).status_code == 302  # to the login page


# -- retry / requeue ---------------------------------------------------------------------------


def _action(client: Client, action: str, *tasks: Task, **query: str):
    target = url("task_changelist")
    if query:
        target += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    return client.post(
        target,
        {"action": action, "_selected_action": [str(t.pk) for t in tasks]},
        follow=True,
    )


def test_retry_action_requeues_failed_and_ready_tasks_and_logs_each() -> None:
    failed = make_task(TaskStatus.FAILED)
    cancelled = make_task(TaskStatus.CANCELLED)
    done = make_task(TaskStatus.SUCCESSFUL)
    response = _action(client_for(*RETRY), "retry_tasks", failed, cancelled, done)
    page = text(response)
    assert "Requeued 2 tasks; they run again shortly." in page
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


def test_retry_action_on_a_failed_only_list_counts_what_it_did() -> None:
    # Issue 10: the list filtered to FAILED said "Requeued 1 task." and then
    # "-1 tasks were not requeued", counting the selection again after the update.
    failed = make_task(TaskStatus.FAILED)
    page = text(_action(client_for(*RETRY), "retry_tasks", failed, status="FAILED"))
    said = page.split('<ul class="messagelist">')[1].split("</ul>")[0]
    assert "Requeued 1 task; it runs again shortly." in said
    assert "not requeued" not in said and "-1" not in said
    assert Task.objects.get(pk=failed.pk).status == TaskStatus.READY


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
    assert "Requeued 1 task; it runs again shortly." in text(response)
    assert Task.objects.get(pk=failed.pk).status == TaskStatus.READY
    assert log_messages(failed) == ["Requeued (was FAILED)."]
    # A running one is not offered the button, and refused if asked anyway.
    running = make_task(TaskStatus.RUNNING)
    assert url("task_retry", running.pk) not in text(client.get(url("task_change", running.pk)))
    response = client.post(url("task_retry", running.pk), follow=True)
    assert "1 task was not requeued" in text(response)
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


# -- cancel ---------------------------------------------------------------------------------


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


# -- discard -----------------------------------------------------------------------------------


def test_discard_a_failed_task_from_its_page_is_logged() -> None:
    failed = make_task(TaskStatus.FAILED)
    parent = make_task(TaskStatus.SUCCESSFUL)
    TaskDependency.objects.create(parent=parent, child=failed)
    record = JobRecord.objects.create(job_name="nightly", key="k", task=failed, status="FAILED")
    client = client_for(*DISCARD)
    page = text(client.get(url("task_change", failed.pk)))
    assert url("task_discard", failed.pk) in page
    assert 'value="discard_tasks"' not in text(client.get(url("task_changelist")))  # page only
    assert client.get(url("task_discard", failed.pk)).status_code == 405
    response = client.post(url("task_discard", failed.pk), follow=True)
    assert response.redirect_chain[-1][0] == url("task_changelist")
    assert "Discarded 1 task." in text(response)
    assert not Task.objects.filter(pk=failed.pk).exists()
    assert Task.objects.filter(pk=parent.pk).exists()
    assert JobRecord.objects.get(pk=record.pk).task_id is None  # the ledger keeps its key
    assert log_messages(failed, DELETION) == [""]


def test_discard_needs_the_permission_and_a_failed_or_cancelled_task() -> None:
    failed = make_task(TaskStatus.FAILED)
    running = make_task(TaskStatus.RUNNING)
    viewer = client_for(*RETRY)
    assert url("task_discard", failed.pk) not in text(viewer.get(url("task_change", failed.pk)))
    assert viewer.post(url("task_discard", failed.pk)).status_code == 403
    client = client_for(*DISCARD, name="discarder")
    assert url("task_discard", running.pk) not in text(client.get(url("task_change", running.pk)))
    response = client.post(url("task_discard", running.pk), follow=True)
    assert "1 task was kept" in text(response)
    assert Task.objects.filter(pk__in=[failed.pk, running.pk]).count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_page_and_get_result_agree_on_the_attempts_after_a_retry() -> None:
    """Issue 39: the page said ``Attempts: 3/3`` where ``get_result().attempts == 6``."""
    from django_rdbtasks.worker import Worker
    from tests.testapp.tasks import always_fails  # max_attempts=2, no backoff

    def drain() -> None:
        assert Worker(burst=True).run(install_signals=False) == 0

    result = always_fails.enqueue("boom")
    drain()
    client = client_for(*RETRY)
    page = text(client.get(url("task_change", result.id)))
    assert '<div class="readonly">2/2</div>' in page  # nothing else to say yet
    client.post(url("task_retry", result.id))
    drain()
    result.refresh()
    assert (result.status, result.attempts) == ("FAILED", 4)
    page = text(client.get(url("task_change", result.id)))
    summary = page.split("field-attempts_detail")[1].split('<div class="readonly">')[1]
    summary = summary.split("</div>")[0]
    assert summary == (
        '2/2 <span class="rdbtasks-muted" title="2 of its 2 attempts spent since it was last '
        'requeued; 4 attempts in all, as get_result().attempts counts them.">(4 in all)</span>'
    )
    # The history numbers every attempt as get_result() counts them, and shows the
    # counter a requeue started again.
    rows = re.findall(
        r'<td class="rdbtasks-num">(\d+)</td>\s*<td class="rdbtasks-num">(\d+/\d+)</td>', page
    )
    assert rows == [("1", "1/2"), ("2", "2/2"), ("3", "1/2"), ("4", "2/2")]
