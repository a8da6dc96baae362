"""The snapshot behind the dashboard, ``rdbtasks status`` and the metrics, and its helpers."""

from __future__ import annotations

import datetime as dt
import json
import time
import uuid

import pytest
from django.db import connection

from django_rdbtasks import snapshots
from django_rdbtasks.compat import task_backends
from django_rdbtasks.models import Task, TaskStatus, uuid7
from tests.browser.support import make_task, make_worker, now

pytestmark = pytest.mark.django_db


def test_snapshot_counts_each_queue_by_status() -> None:
    moment = now()
    make_task(run_after=moment - dt.timedelta(seconds=90))
    make_task()
    make_task(run_after=moment + dt.timedelta(hours=1))  # scheduled
    make_task(queue_name="emails")
    make_task(TaskStatus.WAITING)
    make_task(TaskStatus.RUNNING)
    make_task(TaskStatus.RUNNING, lease_expires_at=moment - dt.timedelta(seconds=30))
    make_task(TaskStatus.SUCCESSFUL, at=moment - dt.timedelta(minutes=3))
    make_task(TaskStatus.FAILED, queue_name="emails", at=moment - dt.timedelta(minutes=10))
    make_task(TaskStatus.CANCELLED)
    make_task(TaskStatus.SUCCESSFUL, at=moment - dt.timedelta(hours=3))  # outside the window

    snap = snapshots.snapshot()
    default, emails, other = (snap.queues[q] for q in ("default", "emails", "other"))
    assert (default.ready, default.scheduled, default.waiting) == (2, 1, 1)
    assert (default.running, default.stalled) == (2, 1)
    assert (default.succeeded, default.failed, default.cancelled) == (1, 0, 1)
    assert (emails.ready, emails.failed) == (1, 1)
    assert other == snapshots.QueueStats("other")  # configured, empty: listed all the same
    assert snap.total.ready == 3 and snap.total.running == 2 and snap.total.failed == 1
    # The lag is that of the task waiting since 90 seconds ago.
    assert 89 <= snap.lag < 120
    assert 89 <= default.lag(snap.now) < 120
    assert emails.lag(snap.now) < 30
    assert other.lag(snap.now) is None
    assert snap.rows == snapshots.RowCount(11, estimate=False) or snap.rows.estimate


def test_a_stalled_task_counts_into_the_lag_since_its_lease_lapsed() -> None:
    make_task(TaskStatus.RUNNING, lease_expires_at=now() - dt.timedelta(minutes=5))
    snap = snapshots.snapshot()
    assert snap.total.ready == 0
    assert 299 <= snap.lag < 330


def test_snapshot_of_some_queues_only() -> None:
    make_task()
    make_task(queue_name="emails")
    snap = snapshots.snapshot(queues=["emails"])
    assert list(snap.queues) == ["emails"]
    assert snap.total.ready == 1


def test_throughput_per_minute_over_the_window() -> None:
    moment = now()
    for minutes_ago, status in [
        (0, TaskStatus.SUCCESSFUL),
        (1, TaskStatus.SUCCESSFUL),
        (1, TaskStatus.FAILED),
        (59, TaskStatus.CANCELLED),
    ]:
        make_task(status, finished_at=moment - dt.timedelta(minutes=minutes_ago, seconds=1))
    series = snapshots.snapshot().throughput
    assert len(series.starts) == 60 and series.bucket == dt.timedelta(minutes=1)
    assert series.starts[-1] == moment.replace(second=0, microsecond=0)
    assert series.starts == sorted(series.starts)
    assert sum(series.succeeded) == 2 and sum(series.failed) == 1 and sum(series.cancelled) == 1
    assert sum(series.failed[-3:]) == 1
    assert series.cancelled[0] + series.cancelled[1] == 1
    assert series.peak == 2


@pytest.mark.parametrize(
    ("window", "bucket", "bars"),
    [
        (dt.timedelta(hours=1), dt.timedelta(minutes=1), 60),
        (dt.timedelta(days=1), dt.timedelta(minutes=15), 96),
        (dt.timedelta(days=7), dt.timedelta(hours=2), 84),
    ],
)
def test_throughput_buckets_fall_on_round_times(window, bucket, bars) -> None:
    moment = now()
    # Not within two seconds of a bucket's edge: the snapshot reads the clock
    # again, and the edge tasks must stay in the first and last buckets.
    offset = moment.timestamp() % bucket.total_seconds()
    if offset < 2 or offset > bucket.total_seconds() - 2:
        time.sleep((2.5 - offset) % bucket.total_seconds())
        moment = now()
    make_task(TaskStatus.SUCCESSFUL, finished_at=moment - window + dt.timedelta(seconds=30))
    make_task(TaskStatus.FAILED, finished_at=moment - dt.timedelta(seconds=1))
    series = snapshots.snapshot(window=window).throughput
    assert series.bucket == bucket and len(series.starts) == bars
    assert all(start.timestamp() % bucket.total_seconds() == 0 for start in series.starts)
    assert series.starts[-1] <= moment < series.starts[-1] + bucket
    assert series.succeeded[0] == 1 and series.failed[-1] == 1  # the edges are counted


def test_snapshot_as_json_is_complete() -> None:
    make_task()
    make_worker("host-a:101")
    data = snapshots.snapshot().as_dict()
    assert data["vendor"] == connection.vendor
    assert data["queues"]["default"]["ready"] == 1
    assert data["workers"]["alive"] == 1
    assert data["workers"]["list"][0]["state"] == "alive"
    assert isinstance(data["lag_seconds"], float)
    json.dumps(data)  # all of it serialisable


def test_estimated_rows_use_the_planner_where_there_is_one() -> None:
    for _ in range(5):
        make_task(TaskStatus.SUCCESSFUL)
    rows = snapshots.estimated_task_rows()
    if connection.vendor == "sqlite":
        assert rows == snapshots.RowCount(5, estimate=False)
    else:
        assert rows.estimate is True or rows.value == 5
        assert rows.value >= 0


def test_capped_count() -> None:
    for _ in range(4):
        make_task()
    assert snapshots.capped_count(Task.objects.all(), cap=10) == snapshots.RowCount(4, False)
    assert snapshots.capped_count(Task.objects.all(), cap=3) == snapshots.RowCount(3, True)


def test_uuid7_floor_orders_like_enqueue_time() -> None:
    before = uuid7()
    moment = dt.datetime.now(dt.UTC)
    floor = snapshots.uuid7_floor(moment + dt.timedelta(milliseconds=2))
    after = uuid7()
    assert floor.version == 7
    assert before < floor or before.int >> 80 == floor.int >> 80
    assert snapshots.uuid7_floor(moment - dt.timedelta(seconds=1)) < after
    assert snapshots.uuid7_floor(moment + dt.timedelta(seconds=1)) > after


def test_workers_alive_gone_and_stopped() -> None:
    alive = make_worker("host-a:101")
    gone = make_worker("host-b:202", age=600)
    stopped = make_worker("host-c:303", stopped_at=now())
    snap = snapshots.snapshot()
    assert [w.name for w in snap.workers] == ["host-a:101"]
    assert snap.gone_workers == 1
    assert list(snapshots.gone_workers()) == [gone]
    assert snapshots.worker_state(alive, snap.now) == "alive"
    assert snapshots.worker_state(gone, snap.now) == "gone"
    assert snapshots.worker_state(stopped, snap.now) == "stopped"


# -- health -------------------------------------------------------------------------------


def test_health_limits_from_the_setting_and_overrides(settings) -> None:
    settings.RDBTASKS_HEALTH = {"MAX_LAG": 60, "min_workers": 2}
    assert snapshots.health_limits() == {"MAX_LAG": 60.0, "MIN_WORKERS": 2.0}
    assert snapshots.health_limits(max_lag=5, max_failed=None) == {
        "MAX_LAG": 5.0,
        "MIN_WORKERS": 2.0,
    }
    settings.RDBTASKS_HEALTH = {"MAX_LAGG": 1}
    with pytest.raises(ValueError, match="MAX_LAGG"):
        snapshots.health_limits()


def test_health_checks() -> None:
    make_task(run_after=now() - dt.timedelta(seconds=120))
    make_task(TaskStatus.FAILED)
    make_worker()
    snap = snapshots.snapshot()
    checks = {
        c.name: c
        for c in snapshots.check_health(
            snap,
            {"MAX_LAG": 60, "MIN_WORKERS": 1, "MAX_FAILED": 0, "MAX_READY": 10, "MAX_STALLED": 0},
        )
    }
    assert not checks["MAX_LAG"].ok and checks["MAX_LAG"].value >= 120
    assert checks["MIN_WORKERS"].ok
    assert not checks["MAX_FAILED"].ok
    assert checks["MAX_READY"].ok and checks["MAX_STALLED"].ok
    assert "must be <= 60" in checks["MAX_LAG"].describe()
    assert snapshots.check_health(snap, {"MIN_WORKERS": 2})[0].ok is False
    assert snapshots.check_health(snap, {}) == []


def test_backend_for_database() -> None:
    assert snapshots.backend_for_database("default") is task_backends["default"]
    with pytest.raises(LookupError):
        snapshots.backend_for_database("elsewhere")
    assert uuid.UUID(str(uuid7())).version == 7
