"""An operator in a real Chromium: log in, find the failed task, read why, retry it."""

from __future__ import annotations

import datetime as dt
import random
import re
from typing import Any

import pytest

from django_rdbtasks.models import Job, JobRecord, Task, TaskStatus
from tests.browser.support import (
    admin_urls,
    attempt,
    make_task,
    make_worker,
    now,
    require_admin,
    staff,
    uuid7_at,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    *admin_urls(),
    pytest.mark.usefixtures("require_admin"),
]
__all__ = ["require_admin"]

TASKS = "/admin/django_rdbtasks/task/"


def seed_an_hour_of_work() -> dict[str, Any]:
    """What a small shop's queue looks like: an hour of finished tasks, a few failing."""
    rng = random.Random(4)
    moment = now()
    finished = []
    for minute in range(60):
        when = moment - dt.timedelta(minutes=minute, seconds=5)
        load = 6 + int(5 * (1 + (minute % 17) / 8)) + rng.randint(0, 4)
        for i in range(load):
            failed = rng.random() < 0.04
            finished.append(
                Task(
                    id=uuid7_at(when),
                    task_path=rng.choice(
                        ["tests.testapp.tasks.send_email", "tests.testapp.tasks.record"]
                    ),
                    queue_name="emails" if i % 3 == 0 else "default",
                    status=TaskStatus.FAILED if failed else TaskStatus.SUCCESSFUL,
                    attempts=1,
                    max_attempts=3,
                    enqueued_at=when,
                    run_after=when,
                    started_at=when,
                    last_attempted_at=when,
                    finished_at=when + dt.timedelta(milliseconds=rng.randint(20, 900)),
                )
            )
    Task.objects.bulk_create(finished)
    failed = make_task(
        TaskStatus.FAILED,
        at=moment - dt.timedelta(minutes=10),
        finished_at=moment - dt.timedelta(minutes=6),
        last_attempted_at=moment - dt.timedelta(minutes=6),
        task_path="tests.testapp.tasks.always_fails",
        args=["card declined"],
        kwargs={"invoice_id": 1042, "headers": {"Authorization": "Bearer secret-token"}},
        max_attempts=3,
        attempts=3,
        history=[
            attempt(1, "RETRY", started=moment - dt.timedelta(minutes=9)),
            attempt(
                2, "LOST", worker_id="host-b:202:1:k2", started=moment - dt.timedelta(minutes=8)
            ),
            attempt(3, "FAILED", started=moment - dt.timedelta(minutes=6)),
        ],
    )
    running = make_task(
        TaskStatus.RUNNING,
        task_path="tests.testapp.tasks.record_then_sleep",
        args=["import", 60],
        progress=0.62,
        progress_message="6,200 of 10,000 rows",
    )
    for queue in ("default", "default", "emails"):
        make_task(queue_name=queue, run_after=moment - dt.timedelta(seconds=42))
    make_task(run_after=moment + dt.timedelta(minutes=30))
    make_worker("host-a:101", running=1, done=1840, failed=12)
    make_worker("host-c:303", threads=4, batch=10, running=0, done=5210, failed=31)
    job = Job.objects.create(
        name="nightly-report",
        task_path="tests.testapp.tasks.record_job",
        kwargs={"job": "nightly-report"},
        cron="30 2 * * 1-5",
        timezone="Europe/Berlin",
        next_run_at=moment + dt.timedelta(hours=5),
    )
    for days in range(1, 4):
        tick = (moment - dt.timedelta(days=days)).replace(
            hour=1, minute=30, second=0, microsecond=0
        )
        JobRecord.objects.create(
            job_name=job.name,
            key=tick.strftime("%Y-%m-%dT%H:%M:%SZ"),
            status="SUCCESSFUL",
            scheduled_for=tick,
            finished_at=tick + dt.timedelta(seconds=3),
            duration=dt.timedelta(seconds=2.8),
        )
    return {"failed": failed, "running": running, "job": job}


def log_in(page: Any, base: str, username: str, next_url: str = TASKS) -> None:
    page.goto(f"{base}/admin/login/?next={next_url}")
    page.fill("#id_username", username)
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(re.escape(next_url)))


def success_message(page: Any) -> str:
    return page.locator(".messagelist .success, .messagelist .info").first.inner_text()


def test_operator_finds_a_failed_task_reads_why_and_retries_it(live_server, page, screenshot):
    rows = seed_an_hour_of_work()
    failed: Task = rows["failed"]
    staff("operator", ["django_rdbtasks.retry_task", "django_rdbtasks.cancel_task"], superuser=True)
    log_in(page, live_server.url, "operator")
    page.click("#toggle-nav-sidebar")  # more room for the columns, as operators do

    # The task list: coloured statuses, progress, the failed one among them.
    assert page.locator("#result_list tbody tr").count() == 50
    assert page.locator("#result_list .rdbtasks-badge.rdbtasks-running").first.is_visible()
    assert page.locator("#result_list progress").first.is_visible()
    screenshot("task-list", docs=True, full_page=False)

    # Only the failed ones, then the one that failed for good after three attempts.
    page.locator("#changelist-filter").get_by_role("link", name="Failed", exact=True).click()
    page.wait_for_url(re.compile(r"status=FAILED"))
    page.locator("#result_list a", has_text="always_fails").first.click()
    page.wait_for_url(re.compile(str(failed.pk)))

    history = page.locator("table.rdbtasks-history")
    assert history.locator("tbody tr").count() == 3
    assert history.locator(".rdbtasks-lost").is_visible()
    assert "ValueError" in history.inner_text()
    assert page.locator("pre.rdbtasks-json", has_text="card declined").is_visible()
    assert "secret-token" not in page.content()
    last_traceback = history.locator("details").last
    assert last_traceback.locator("pre").is_visible()  # the last one is open
    history.locator("details").first.locator("summary").click()  # and the first opens
    assert "raise ValueError" in history.locator("details").first.locator("pre").inner_text()
    screenshot("task-failed", docs=True)

    # Retry it: the page says so and the row is READY, with its history kept.
    page.click("#rdbtasks-retry")
    page.wait_for_load_state()
    assert "requeued" in success_message(page)
    assert page.locator(".field-status_display .rdbtasks-badge").inner_text() == "Ready"
    failed.refresh_from_db()
    assert failed.status == TaskStatus.READY and failed.attempts == 0
    assert len(failed.history) == 3
    screenshot("task-requeued")

    # The dashboard: counts per queue, the chart of the last hour, the workers.
    page.get_by_role("link", name="Dashboard").first.click()
    page.wait_for_url(re.compile(r"/dashboard/"))
    assert page.locator("#rdbtasks-chart rect.rdbtasks-bar-ok").count() >= 55
    assert page.locator("#rdbtasks-chart rect.rdbtasks-bar-failed").count() >= 1
    queues = page.locator("#rdbtasks-queues")
    assert queues.get_by_role("link", name="emails").is_visible()
    assert page.locator("#rdbtasks-workers").get_by_text("host-c:303").is_visible()
    screenshot("dashboard", docs=True)

    # From the dashboard into a filtered list: the ready tasks of "default".
    queues.locator("a.rdbtasks-count-ready").first.click()
    page.wait_for_url(re.compile(r"status=READY"))
    assert page.locator("#result_list tbody tr").count() >= 2

    # A job: its schedule in words, the next five runs, recent runs; run it now.
    job: Job = rows["job"]
    page.goto(f"{live_server.url}/admin/django_rdbtasks/job/{job.pk}/change/")
    assert page.get_by_text("At 02:30, Monday through Friday").first.is_visible()
    assert page.locator("ol.rdbtasks-ticks li").count() == 5
    assert page.locator(".field-recent_records table tbody tr").count() == 3
    screenshot("job", docs=True)
    page.click("#rdbtasks-run")
    page.wait_for_load_state()
    assert "will run within seconds" in success_message(page)
    job.refresh_from_db()
    assert job.next_run_at <= now()


def test_retry_from_the_list_and_retry_all_failed(live_server, page, screenshot):
    first = make_task(TaskStatus.FAILED, task_path="tests.testapp.tasks.always_fails")
    others = [make_task(TaskStatus.FAILED, queue_name="emails") for _ in range(3)]
    staff("operator", ["django_rdbtasks.view_task", "django_rdbtasks.retry_task"])
    log_in(page, live_server.url, "operator", f"{TASKS}?status=FAILED")

    # The action on one selected row.
    page.locator(f"#result_list input[value='{first.pk}']").check()
    page.select_option("select[name=action]", "retry_tasks")
    page.click("button[name=index], input[name=index]")
    page.wait_for_load_state()
    assert "Requeued 1 task." in success_message(page)
    assert Task.objects.get(pk=first.pk).status == TaskStatus.READY

    # Every failed task, after a confirmation page that says how many.
    page.goto(f"{live_server.url}{TASKS}")
    page.get_by_role("link", name="Retry all failed…").click()
    assert "3 failed tasks will be set READY again" in page.locator("#content-main").inner_text()
    screenshot("retry-all-failed")
    page.click("#rdbtasks-confirm input[type=submit]")
    page.wait_for_url(re.compile(r"status=READY"))
    assert "Requeued 3 failed tasks." in success_message(page)
    assert {t.status for t in Task.objects.filter(pk__in=[o.pk for o in others])} == {"READY"}


def test_an_operator_without_the_permission_gets_no_retry_button(live_server, page):
    failed = make_task(TaskStatus.FAILED)
    staff("viewer", ["django_rdbtasks.view_task"])
    log_in(page, live_server.url, "viewer", f"{TASKS}{failed.pk}/change/")
    assert page.locator("table.rdbtasks-history").is_visible()
    assert page.locator("#rdbtasks-retry").count() == 0
    assert page.locator("#rdbtasks-cancel").count() == 0
    page.goto(f"{live_server.url}{TASKS}")
    assert page.locator("select[name=action] option[value=retry_tasks]").count() == 0
    assert Task.objects.get(pk=failed.pk).status == TaskStatus.FAILED
