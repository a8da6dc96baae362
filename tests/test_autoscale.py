"""Autoscaling: the policy alone (no database, no clock), the backlog sample, a real burst."""

from __future__ import annotations

import datetime as dt
import re
import signal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_rdbtasks.backend import bulk_enqueue
from django_rdbtasks.db.functions import DbNow
from django_rdbtasks.models import Task
from django_rdbtasks.models.ready import ready_conditions
from django_rdbtasks.states import TaskStatus
from django_rdbtasks.worker.autoscale import AutoscalePolicy, Load, parse_range, sample_load
from tests.conftest import wait_until, worker_children
from tests.testapp import tasks
from tests.testapp.models import SideEffect

IDLE = Load(ready=0, running=0, lag=None)


def policy(**overrides) -> AutoscalePolicy:
    options = {"minimum": 1, "maximum": 8, "backlog_per_process": 100, "idle_after": 30.0}
    return AutoscalePolicy(**{**options, **overrides})


# -- the policy ---------------------------------------------------------------------------


def test_a_backlog_grows_straight_to_what_it_needs_within_the_maximum():
    assert policy().desired(Load(ready=450, running=1), current=1, now=0) == 5
    assert policy().desired(Load(ready=5000, running=1), current=1, now=0) == 8
    # Just over the threshold: at least one more.
    assert policy().desired(Load(ready=201, running=2), current=2, now=0) == 3


def test_lag_grows_by_one_even_with_a_small_backlog():
    slow = Load(ready=3, running=2, lag=12.0)
    assert policy(lag_threshold=5.0).desired(slow, current=2, now=0) == 3
    # The same lag with nothing ready (all claimed) is no reason to grow.
    assert policy(lag_threshold=5.0).desired(Load(0, 2, None), current=2, now=0) == 2


def test_between_the_thresholds_it_holds():
    steady = policy()
    for now in range(0, 300, 5):
        assert steady.desired(Load(ready=150, running=4, lag=1.0), current=2, now=now) == 2


def test_shrinks_one_at_a_time_after_a_sustained_idle_period():
    idle = policy(idle_after=30.0)
    counts = []
    current = 4
    for now in range(0, 200, 5):
        current = idle.desired(IDLE, current=current, now=now)
        counts.append((now, current))
    # Idle from 0: one fewer at 30, 60, 90; then the minimum holds.
    assert [
        now for (now, c), (_, before) in zip(counts[1:], counts, strict=False) if c < before
    ] == [
        30,
        60,
        90,
    ]
    assert counts[-1][1] == 1


def test_any_backlog_restarts_the_idle_period():
    flapping = policy(idle_after=30.0)
    assert flapping.desired(IDLE, current=3, now=0) == 3
    assert flapping.desired(IDLE, current=3, now=25) == 3
    # A little work (in the dead band): not idle, the period starts over.
    assert flapping.desired(Load(ready=5, running=3), current=3, now=28) == 3
    assert flapping.desired(IDLE, current=3, now=31) == 3
    assert flapping.desired(IDLE, current=3, now=55) == 3
    assert flapping.desired(IDLE, current=3, now=61) == 2


def test_tasks_held_that_need_every_process_are_not_idle():
    busy = policy(idle_after=0.0, threads=2)
    # 3 processes x 2 threads; 5 tasks held would not fit in 2 processes.
    assert busy.desired(Load(ready=0, running=5), current=3, now=0) == 3
    assert busy.desired(Load(ready=0, running=5), current=3, now=100) == 3
    assert busy.desired(Load(ready=0, running=4), current=3, now=101) == 3  # idle starts
    assert busy.desired(Load(ready=0, running=4), current=3, now=102) == 2


def test_scaled_to_zero_any_task_wakes_one_process():
    zero = policy(minimum=0, idle_after=10.0)
    assert zero.desired(IDLE, current=0, now=0) == 0
    assert zero.desired(Load(ready=1, running=0, lag=0.1), current=0, now=1) == 1
    assert zero.desired(IDLE, current=1, now=2) == 1
    assert zero.desired(IDLE, current=1, now=12) == 0


def test_outside_the_range_it_comes_back_into_it():
    assert policy(minimum=2, maximum=4).desired(IDLE, current=0, now=0) == 2
    assert policy(minimum=2, maximum=4).desired(Load(9999, 0), current=6, now=0) == 4


@pytest.mark.parametrize(
    "text,expected",
    [("1:4", (1, 4)), ("0:2", (0, 2)), ("3:3", (3, 3))],
)
def test_parse_range(text, expected):
    assert parse_range(text) == expected


@pytest.mark.parametrize("text", ["4", "4:1", "0:0", "-1:2", "a:b", "1:", ":3", "1:2:3"])
def test_parse_range_refuses(text):
    with pytest.raises(ValueError, match="--autoscale"):
        parse_range(text)


# -- the sample ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_sample_counts_ready_running_and_the_oldest_wait_of_the_served_queues():
    bulk_enqueue(tasks.record, [((f"s{i}",), {}) for i in range(6)])
    tasks.send_email.enqueue("other-queue@example.com")
    tasks.record.using(run_after=timezone.now() + dt.timedelta(hours=1)).enqueue("later")
    default = Task.objects.filter(queue_name="default", status=TaskStatus.READY)
    ids = list(default.filter(run_after__lte=DbNow()).values_list("pk", flat=True)[:2])
    Task.objects.filter(pk__in=ids).update(status=TaskStatus.RUNNING, worker_id="w:1")
    Task.objects.filter(pk__in=ids).update(run_after=timezone.now() - dt.timedelta(minutes=9))
    oldest = default.filter(run_after__lte=DbNow()).values_list("pk", flat=True).first()
    Task.objects.filter(pk=oldest).update(run_after=timezone.now() - dt.timedelta(minutes=2))

    load = sample_load("default", ["default"])
    assert (load.ready, load.running) == (4, 2)  # not the deferred one, not the other queue
    assert 110 <= load.lag <= 200
    both = sample_load("default", ["default", "emails"])
    assert (both.ready, both.running) == (5, 2)
    assert sample_load("default", ["other"]) == Load(0, 0, None)


@pytest.mark.django_db
def test_a_sample_reads_at_most_its_cap_of_each_kind_whatever_the_backlog():
    bulk_enqueue(tasks.record, [((f"s{i}",), {}) for i in range(30)])
    held = list(Task.objects.values_list("pk", flat=True)[:12])
    Task.objects.filter(pk__in=held).update(status=TaskStatus.RUNNING, worker_id="w:1")
    with CaptureQueriesContext(connection) as queries:
        load = sample_load("default", ["default"], cap=5)
    assert (load.ready, load.running) == (5, 5)
    assert load.lag is not None
    # Each read of the table stops at the cap: a LIMIT, whatever the database.
    # One read per index of READY rows (``ready_conditions``: three where indexes
    # can be partial, one on MySQL and MariaDB), one of RUNNING rows.
    reads = [q["sql"] for q in queries.captured_queries if Task._meta.db_table in q["sql"]]
    assert len(reads) == len(ready_conditions("default")) + 1, reads
    assert all("LIMIT 5" in sql for sql in reads), reads


# -- a burst, with real processes ---------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_burst_grows_the_processes_then_they_shrink_back_and_nothing_is_lost(run_workers):
    count = 2000
    workers = run_workers(
        "--autoscale",
        "1:4",
        "--autoscale-interval",
        "0.3",
        "--autoscale-idle",
        "1.5",
        "--autoscale-backlog",
        "50",
        "--no-scheduler",
        "--poll-interval",
        "0.2",
    )
    # Starts with the minimum.
    wait_until(lambda: len(worker_children(workers.pid)) == 1, timeout=60)
    bulk_enqueue(tasks.record_then_sleep, [((f"burst-{i}", 0.005), {}) for i in range(count)])

    most = 0

    def grown():
        nonlocal most
        most = max(most, len(worker_children(workers.pid)))
        return most == 4

    wait_until(grown, timeout=60, interval=0.02)
    wait_until(lambda: SideEffect.objects.count() >= count, timeout=300)
    # Then idle: back to one process, one at a time.
    wait_until(lambda: len(worker_children(workers.pid)) == 1, timeout=60)
    workers.signal(signal.SIGTERM)
    assert workers.wait(timeout=60) == 0, workers.log()

    # Every task ran exactly once: count the bodies, not the statuses.
    assert SideEffect.objects.count() == count
    assert SideEffect.objects.values("key").distinct().count() == count
    assert Task.objects.filter(status=TaskStatus.SUCCESSFUL, attempts=1).count() == count
    assert SideEffect.objects.values("pid").distinct().count() > 1
    log = workers.log()
    assert "Traceback" not in log and "restarting" not in log, log
    decisions = re.findall(r"autoscale: (\d+) -> (\d+) worker processes", log)
    grew = [(int(a), int(b)) for a, b in decisions if int(b) > int(a)]
    shrank = [(int(a), int(b)) for a, b in decisions if int(b) < int(a)]
    assert grew and grew[0][0] == 1 and max(b for _, b in grew) == 4, decisions
    assert shrank[-3:] == [(4, 3), (3, 2), (2, 1)], decisions  # one at a time
    assert log.count("stopped (autoscale)") == len(shrank)
