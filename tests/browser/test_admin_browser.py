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
    assert "Requeued 1 task" in success_message(page)
    assert page.locator(".field-status_display .rdbtasks-badge").inner_text() == "Ready"
    failed.refresh_from_db()
    assert failed.status == TaskStatus.READY and failed.attempts == 0
    assert len(failed.history) == 3
    screenshot("task-requeued")

    # The dashboard: counts per queue, the chart of the last hour, the workers.
    page.locator("#content").get_by_role("link", name="Dashboard").first.click()
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
    assert "Requeued 1 task;" in success_message(page)
    assert page.locator(".messagelist .warning").count() == 0  # no "-1 tasks were not requeued"
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


def _layout(page: Any, names: str = "") -> dict[str, Any]:
    """How wide the page is against the window, and which cells are cut short.

    ``names``: a selector of the cells naming the rows, which must show all of
    their text (wrapped, but no part hidden and no ellipsis).
    """
    return page.evaluate(
        """(names) => {
            const visible = el => el.getClientRects().length > 0;
            const cut = el => el.scrollWidth > el.clientWidth + 1;
            const cells = [...document.querySelectorAll('#result_list thead th')];
            const fixed = [...document.querySelectorAll('#result_list td')].filter(
                td => td.querySelector('time, .rdbtasks-badge'));
            const named = names ? [...document.querySelectorAll(names)].filter(visible) : [];
            return {
                scroll: document.documentElement.scrollWidth,
                client: document.documentElement.clientWidth,
                viewport: window.innerWidth,
                right: Math.max(0, ...cells.map(c => c.getBoundingClientRect().right)),
                rows: document.querySelectorAll('#result_list tbody tr').length,
                names: named.length,
                cut: [...fixed, ...named, ...cells.filter(visible)].filter(cut).map(
                    el => el.className + ': ' + el.innerText),
                ellipsis: named.filter(el => [el, ...el.querySelectorAll('*')].some(
                    e => getComputedStyle(e).textOverflow === 'ellipsis' && cut(e))).map(
                    el => el.innerText),
            };
        }""",
        names,
    )


#: Each list, and the cells that name its rows: what must never be cut.
LISTS = (
    ("task-list", TASKS, "#result_list .field-task_name"),
    ("task-list-failed", f"{TASKS}?status=FAILED", "#result_list .field-task_name"),
    (
        "job-list",
        "/admin/django_rdbtasks/job/",
        "#result_list .field-name_display, #result_list .field-task_display",
    ),
    (
        "worker-list",
        "/admin/django_rdbtasks/worker/",
        "#result_list .field-name, #result_list .field-queues_display,"
        " #result_list .field-concurrency",
    ),
    ("jobrecord-list", "/admin/django_rdbtasks/jobrecord/", "#result_list .field-job_display"),
)


def seed_long_names() -> dict[str, Any]:
    """An hour of work, plus the long names, errors and worker ids that get cut first."""
    rows = seed_an_hour_of_work()
    for i in range(3):
        make_task(
            TaskStatus.FAILED,
            task_path="tests.testapp.tasks.a_task_with_a_rather_long_descriptive_name_" + str(i),
            worker_id="a-very-long-host-name.internal.example.com:123456:0:abcdef",
            history=[
                {
                    **attempt(1, "FAILED"),
                    "exception_class_path": "app.payments.gateway.PaymentGatewayError",
                    "traceback": "app.payments.gateway.PaymentGatewayError: "
                    + "card declined " * 30,
                }
            ],
        )
    make_worker(
        "a-very-long-host-name.internal.example.com:123456",
        queues=["default", "emails", "reports", "a-queue-with-a-long-name"],
        threads=1,
        batch=0,
    )
    Job.objects.create(
        name="a-job-with-a-long-name-for-the-weekly-finance-reports",
        task_path="tests.testapp.tasks.record_job",
        cron="*/15 8-18 * * 1-5",
        timezone="America/Argentina/Buenos_Aires",
        next_run_at=now() + dt.timedelta(minutes=10),
        last_run_at=now() - dt.timedelta(minutes=5),
    )
    JobRecord.objects.create(job_name=rows["job"].name, key="latest", status="FAILED", error="x")
    return rows


def test_lists_show_whole_names_at_1440_and_390_pixels(live_server, page, screenshot):
    seed_long_names()
    staff("operator", [], superuser=True)
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, live_server.url, "operator", f"{TASKS}?refresh=off")
    for width, sidebar in ((1440, "open"), (1440, "folded"), (390, "phone")):
        if sidebar == "folded":
            page.goto(f"{live_server.url}{TASKS}?refresh=off")
            page.click("#toggle-nav-sidebar")  # Django remembers it
        page.set_viewport_size({"width": width, "height": 900})
        for name, list_url, names in LISTS:
            page.goto(f"{live_server.url}{list_url}")
            layout = _layout(page, names)
            screenshot(f"{name}-{width}-{sidebar}", full_page=False)
            assert layout["rows"] and layout["names"] >= layout["rows"], (name, layout)
            # Nothing sideways: the page is as wide as the window.
            assert layout["scroll"] <= layout["viewport"], (name, sidebar, layout)
            if width > 767:  # on a phone the list scrolls inside its own box
                assert layout["right"] <= layout["viewport"], (name, sidebar, layout)
            # No name, time, status or header cut short, with or without an ellipsis.
            assert layout["cut"] == [], (name, sidebar, layout["cut"])
            assert layout["ellipsis"] == [], (name, sidebar, layout["ellipsis"])
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{live_server.url}{TASKS}?status=FAILED")
    errors = page.locator("#result_list .rdbtasks-error")
    assert errors.count() >= 3 and "PaymentGatewayError: card declined" in errors.first.inner_text()
    page.goto(f"{live_server.url}{TASKS}")
    screenshot("task-list", docs=True, full_page=False)


def test_the_dashboard_reflows_at_390_and_fits_1440_pixels(live_server, page, screenshot):
    seed_long_names()
    staff("operator", [], superuser=True)
    log_in(page, live_server.url, "operator", "/admin/django_rdbtasks/task/dashboard/")
    names = "#rdbtasks-workers td, #rdbtasks-jobs td, #rdbtasks-queues th"
    for width in (1440, 390):
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{live_server.url}/admin/django_rdbtasks/task/dashboard/?refresh=off")
        layout = _layout(page, names)
        screenshot(f"dashboard-{width}")
        assert layout["names"] > 10, layout
        assert layout["scroll"] <= layout["viewport"], (width, layout)
        assert layout["cut"] == [] and layout["ellipsis"] == [], (width, layout)
        # Every card and table inside the window: reflowed, not scrolled.
        overflow = page.evaluate(
            """() => [...document.querySelectorAll(
                    '#rdbtasks-cards li, #rdbtasks-queues, #rdbtasks-workers, #rdbtasks-chart')]
                .filter(el => el.getBoundingClientRect().right > window.innerWidth + 1)
                .map(el => el.id || el.className)"""
        )
        assert overflow == [], (width, overflow)


def test_a_failed_task_page_is_no_wider_than_the_window(live_server, page, screenshot):
    long_line = (
        "    raise PaymentGatewayError(" + "'card declined by the issuing bank', " * 20 + ")"
    )
    failed = make_task(
        TaskStatus.FAILED,
        task_path="tests.testapp.tasks.always_fails",
        history=[
            {
                **attempt(1, "FAILED"),
                "exception_class_path": "app.tasks.PaymentGatewayError",
                "traceback": "\n".join(
                    [
                        "Traceback (most recent call last):",
                        '  File "/srv/venv/site-packages/django_rdbtasks/worker/process.py", '
                        "line 480, in _call",
                        "    return task.call(*args, **row.kwargs)",
                        '  File "/srv/app/app/tasks.py", line 12, in charge',
                        long_line,
                        "app.tasks.PaymentGatewayError: card declined",
                    ]
                ),
            }
        ],
    )
    staff("operator", [], superuser=True)
    page.set_viewport_size({"width": 1440, "height": 900})
    log_in(page, live_server.url, "operator", f"{TASKS}{failed.pk}/change/")
    layout = _layout(page, "table.rdbtasks-history td, table.rdbtasks-history th")
    assert layout["scroll"] <= layout["client"], layout
    # The attempts' worker ids and times wrap rather than end in an ellipsis.
    assert layout["names"] >= 7 and layout["cut"] == [] and layout["ellipsis"] == [], layout
    traceback = page.locator(".rdbtasks-traceback")
    assert traceback.locator("details.rdbtasks-frames").count() == 1
    assert not traceback.locator("details.rdbtasks-frames").get_attribute("open")
    assert "1 frame of the task queue" in traceback.inner_text()
    assert page.get_by_text("/srv/app/app/tasks.py").is_visible()
    summary = page.locator("table.rdbtasks-history summary").first.inner_text()
    assert summary.count("PaymentGatewayError") == 1
    screenshot("task-failed-1440", full_page=True)


def _watch_navigations(page: Any) -> list[str]:
    """The page's navigations from now on, and a mark that a reload would wipe."""
    seen: list[str] = []
    page.on("framenavigated", lambda frame: seen.append(frame.url))
    page.evaluate("window.rdbtasksMark = 'still here'")
    return seen


def _not_reloaded(page: Any, seen: list[str]) -> None:
    assert seen == [], seen
    assert page.evaluate("window.rdbtasksMark") == "still here"
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1


def test_a_list_updates_in_place_and_waits_while_rows_are_ticked(live_server, page):
    from playwright.sync_api import expect

    first = make_task(TaskStatus.READY, task_path="tests.testapp.tasks.send_email")
    second = make_task(TaskStatus.READY, task_path="tests.testapp.tasks.record")
    staff("operator", ["django_rdbtasks.view_task", "django_rdbtasks.retry_task"])
    log_in(page, live_server.url, "operator", f"{TASKS}?refresh=1")
    toggle = page.locator("#rdbtasks-live")
    expect(toggle).to_have_text("Pause updates")
    seen = _watch_navigations(page)

    def badge(task: Task) -> Any:
        return page.locator(f"#result_list tr:has(input[value='{task.pk}']) .rdbtasks-badge")

    # A row changed in the database shows its new status, with no navigation.
    Task.objects.filter(pk=first.pk).update(status=TaskStatus.FAILED, attempts=3)
    expect(badge(first)).to_have_text("Failed", timeout=5_000)
    _not_reloaded(page, seen)

    # A ticked row holds the page still: nothing moves under the operator.
    page.locator(f"#result_list input[value='{second.pk}']").check()
    Task.objects.filter(pk=second.pk).update(status=TaskStatus.CANCELLED)
    page.wait_for_timeout(1_600)
    expect(badge(second)).to_have_text("Ready")
    page.locator(f"#result_list input[value='{second.pk}']").uncheck()
    expect(badge(second)).to_have_text("Cancelled", timeout=5_000)

    # The admin's actions work on the rows swapped in: select all, counted.
    page.locator("#action-toggle").check()
    assert page.locator("#result_list input.action-select:checked").count() == 2
    expect(page.locator("span.action-counter")).to_have_text("2 of 2 selected")
    page.locator("#action-toggle").uncheck()

    # Paused by the toggle, and still paused on the next page (the browser remembers).
    toggle.click()
    expect(toggle).to_have_text("Resume updates")
    Task.objects.filter(pk=first.pk).update(status=TaskStatus.READY)
    page.wait_for_timeout(1_600)
    expect(badge(first)).to_have_text("Failed")
    _not_reloaded(page, seen)
    page.goto(f"{live_server.url}{TASKS}?refresh=1")
    expect(page.locator("#rdbtasks-live")).to_have_text("Resume updates")
    page.locator("#rdbtasks-live").click()
    expect(page.locator("#rdbtasks-live")).to_have_text("Pause updates")


def test_the_dashboard_updates_in_place(live_server, page):
    from playwright.sync_api import expect

    make_worker("host-a:101")
    staff("operator", ["django_rdbtasks.view_task"])
    log_in(page, live_server.url, "operator", "/admin/django_rdbtasks/task/dashboard/?refresh=1")
    seen = _watch_navigations(page)
    workers = page.locator("#rdbtasks-workers")
    expect(workers.get_by_text("host-a:101")).to_be_visible()
    make_worker("host-z:909")
    expect(workers.get_by_text("host-z:909")).to_be_visible(timeout=5_000)
    _not_reloaded(page, seen)


def test_updates_stop_once_the_operator_is_logged_out(live_server, page):
    from django.contrib.sessions.models import Session
    from playwright.sync_api import expect

    staff("operator", ["django_rdbtasks.view_task"])
    log_in(page, live_server.url, "operator", f"{TASKS}?refresh=1")
    toggle = page.locator("#rdbtasks-live")
    expect(toggle).to_have_text("Pause updates")
    fetches = []
    page.on("request", lambda r: fetches.append(r.url) if TASKS in r.url else None)
    Session.objects.all().delete()  # logged out elsewhere, or the session expired
    expect(toggle).to_have_text("Resume updates", timeout=5_000)
    assert "logged out" in (toggle.get_attribute("title") or "")
    seen = len(fetches)
    page.wait_for_timeout(3_000)  # three intervals: nothing more is asked
    assert len(fetches) == seen, fetches
