"""The dashboard: counts, lag, the chart over an hour, a day or a week, and where it is linked."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_rdbtasks import snapshots
from django_rdbtasks.models import Job, TaskStatus
from django_rdbtasks.snapshots import Throughput
from tests.browser.support import (
    RETRY,
    VIEW,
    admin_urls,
    client_for,
    make_task,
    make_worker,
    now,
    require_admin,
    text,
    url,
)
from tests.conftest import held_snapshot

if "django.contrib.admin" in settings.INSTALLED_APPS:
    from django_rdbtasks.admin import Chart

pytestmark = [
    pytest.mark.django_db,
    *admin_urls(),
    pytest.mark.usefixtures("require_admin"),
]
__all__ = ["require_admin"]


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
    workers = page.split('id="rdbtasks-workers"')[1]
    assert "host-a:<wbr>101" in workers and "host-b:<wbr>202" not in workers  # may wrap at ":"
    assert "1 gone" in page
    assert "nightly" in page and "At 03:00" in page
    assert url("task_retry_failed") in page
    assert "<script" not in page.split('id="content-main"')[1]  # no JavaScript, no CDN
    assert "cdn" not in page.lower()


@pytest.mark.parametrize(("range_key", "bars"), [("1h", 60), ("24h", 96), ("7d", 84)])
def test_the_chart_covers_an_hour_a_day_or_a_week(range_key: str, bars: int) -> None:
    moment = now()
    make_task(TaskStatus.SUCCESSFUL, at=moment - dt.timedelta(minutes=20))
    make_task(TaskStatus.FAILED, at=moment - dt.timedelta(hours=20))
    make_task(TaskStatus.SUCCESSFUL, at=moment - dt.timedelta(days=5))
    page = text(client_for(*VIEW).get(url("task_dashboard"), {"range": range_key}))
    assert page.count('class="rdbtasks-hit"') == bars
    expected = {"1h": (1, 0), "24h": (1, 1), "7d": (2, 1)}[range_key]
    assert (
        page.count('class="rdbtasks-bar-ok"'),
        page.count('class="rdbtasks-bar-failed"'),
    ) == expected
    assert f"finished={range_key}" in page  # the counts link to the same window
    ranges = page.split('id="rdbtasks-ranges"')[1].split("</ul>")[0]
    assert f'<strong aria-current="true">{range_key}</strong>' in ranges


def test_the_week_is_counted_in_one_query_of_a_few_rows() -> None:
    moment = now()
    for hours in range(0, 160, 3):
        make_task(TaskStatus.SUCCESSFUL, at=moment - dt.timedelta(hours=hours))
    with CaptureQueriesContext(connection) as queries:
        series = snapshots.snapshot(window=dt.timedelta(days=7)).throughput
    finished = [q["sql"] for q in queries if "finished_at" in q["sql"] and "GROUP BY" in q["sql"]]
    assert len(finished) == 1
    assert series.bucket == dt.timedelta(hours=2) and len(series.starts) == 84
    assert sum(series.succeeded) == len(range(0, 160, 3))


def test_dashboard_is_in_the_app_list_of_the_index_and_the_sidebar() -> None:
    client = client_for(*VIEW)
    entry = url("dashboard_changelist")
    index = text(client.get("/admin/"))
    assert f'href="{entry}"' in index and ">Dashboard</a>" in index
    sidebar = text(client.get(url("task_changelist"))).split('id="nav-sidebar"')[1]
    assert f'href="{entry}"' in sidebar
    response = client.get(entry)
    assert response.status_code == 302 and response["Location"] == url("task_dashboard")
    # Only the entry: no page of the proxy shows a task.
    task = make_task()
    assert client.get(f"{entry}{task.pk}/change/").status_code in (302, 404)
    nobody = client_for("django_rdbtasks.view_job", name="jobs-only")
    assert f'href="{entry}"' not in text(nobody.get("/admin/"))


def test_dashboard_breadcrumb() -> None:
    page = text(client_for(*VIEW).get(url("task_dashboard")))
    crumbs = page.split('class="breadcrumbs"')[1].split("</div>")[0].split("</ol>")[0]
    assert "Task queue" in crumbs and "Dashboard" in crumbs and ">Tasks<" not in crumbs


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
    assert "2026-01-01 12:59:00 UTC" in last.title
    assert [label for _, label in chart.x_ticks] == [
        "12:00",
        "12:10",
        "12:20",
        "12:30",
        "12:40",
        "12:50",
    ]


def test_dashboard_shows_what_holds_back_cleanup(vendor, monkeypatch) -> None:
    from django_rdbtasks import cleanup

    client = client_for(*VIEW)
    if vendor == "sqlite":
        assert 'id="rdbtasks-cleanup"' not in text(client.get(url("task_dashboard")))
        return
    monkeypatch.setattr(cleanup, "SHOWN_AFTER", 1.0)
    with held_snapshot(application="rdbtasks-dashboard-test") as session:
        time.sleep(1.5)
        page = text(client.get(url("task_dashboard")))
    section = page.split('id="rdbtasks-cleanup"')[1].split("</section>")[0]
    assert "Oldest open transaction: 1." in section or "Oldest open transaction: 2." in section
    holders = section.split('id="rdbtasks-cleanup-holders"')[1].split("</table>")[0]
    assert f"session <code>{session}</code>" in holders and "idle in transaction" in holders
    if vendor == "postgresql":
        assert "rdbtasks-dashboard-test" in holders
        tables = section.split('id="rdbtasks-cleanup-tables"')[1].split("</table>")[0]
        assert "<code>django_rdbtasks_task</code>" in tables
    else:
        assert "InnoDB history list length" in section
    assert "What holds back cleanup" in section  # where docs/admin.md says what to do
