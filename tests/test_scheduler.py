"""Scheduler processes racing over due jobs, a scheduler killed mid-fire, and schedulers
of different code versions side by side (rolling deploys)."""

import datetime as dt
import os
import signal
import threading
import time

import pytest
from django.db import connection, connections
from django.db.models import F

from django_rdbtasks.db.functions import DbNow
from django_rdbtasks.jobs import JobSpec, database_now, tick_key
from django_rdbtasks.models import Job, JobRecord, Task, TaskStatus
from django_rdbtasks.worker.scheduler import Scheduler
from tests.browser.support import make_task, now
from tests.conftest import wait_until, worker_children
from tests.testapp.models import SideEffect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_racing_schedulers_fire_each_tick_exactly_once(run_workers, vendor):
    jobs, schedulers, rounds = (200, 8, 3) if vendor != "sqlite" else (50, 4, 3)
    now = database_now("default")
    base = (now - dt.timedelta(minutes=30)).replace(second=0, microsecond=0)
    Job.objects.bulk_create(
        Job(
            name=f"job-{i}",
            task_path="tests.testapp.tasks.record_job",
            kwargs={"job": f"job-{i}"},
            # Yearly: a real minute boundary passing mid-test must not fire a
            # tick of its own (the ticks below are set by hand).
            cron="0 0 1 1 *",
            next_run_at=None,
        )
        for i in range(jobs)
    )
    running = [
        run_workers("--processes", "0", "--poll-interval", "0.1", "--log-level", "WARNING")
        for _ in range(schedulers)
    ]

    for round_ in range(rounds):
        tick = base + dt.timedelta(minutes=round_)
        # Time "passes": every job is due at this round's tick, as after an edit.
        Job.objects.update(next_run_at=tick, version=round_ * 10 + 1)
        try:
            wait_until(lambda n=round_ + 1: JobRecord.objects.count() == jobs * n, timeout=120)
            wait_until(lambda: not Job.objects.due().exists(), timeout=60)
        except BaseException:
            print(
                f"round {round_}: {JobRecord.objects.count()} records, due:",
                list(Job.objects.due().values_list("name", "next_run_at", "version")[:5]),
            )
            for scheduler in running:
                print(scheduler.log()[-3000:])
            raise
    time.sleep(1)  # a late duplicate would show up now

    assert JobRecord.objects.count() == jobs * rounds
    keys = {tick_key(base + dt.timedelta(minutes=r)) for r in range(rounds)}
    assert set(JobRecord.objects.values_list("key", flat=True)) == keys
    assert Task.objects.count() == jobs * rounds

    # Run the enqueued tasks and count their side effects: one per job and tick.
    drain = run_workers(
        "--burst", "--no-scheduler", "--processes", "2", "--batch", "50", "--log-level", "WARNING"
    )
    assert drain.wait(timeout=300) == 0, drain.log()
    runs = {i: SideEffect.objects.filter(key=f"job:job-{i}").count() for i in range(jobs)}
    short = [i for i, count in runs.items() if count != rounds]
    if short:  # what became of the ticks that did not run
        rows = Task.objects.filter(job_name=f"job-{short[0]}").values(
            "id", "status", "attempts", "run_after", "history", "finished_at", "enqueued_at"
        )
        print(list(rows), drain.log()[-3000:])
    assert short == []


def _block_the_ledger_row(job_name, key, ready, release):
    """Hold an uncommitted JobRecord with this key: the scheduler's insert waits on it."""
    from django.db import transaction

    from django_rdbtasks.models import JobRecord

    try:
        with transaction.atomic():
            JobRecord.objects.create(job_name=job_name, key=key)
            ready.set()
            release.wait(120)
            transaction.set_rollback(True)
    finally:
        connections.close_all()


def _scheduler_waiting_on_the_ledger(vendor):
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'INSERT INTO \"django_rdbtasks_jobrecord\"%%'"
            )
        else:
            cursor.execute(
                "SELECT count(*) FROM information_schema.processlist "
                "WHERE info LIKE 'INSERT INTO `django_rdbtasks_jobrecord`%%'"
            )
        return cursor.fetchone()[0]


def test_scheduler_killed_between_preempting_and_committing(run_workers, vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite's single writer lock blocks before the preemption, not after")
    now = database_now("default")
    tick = (now - dt.timedelta(seconds=10)).replace(microsecond=0)
    job = Job.objects.create(
        name="nightly",
        task_path="tests.testapp.tasks.record_job",
        kwargs={"job": "nightly"},
        cron="0 0 * * *",
        next_run_at=tick,
    )
    ready, release = threading.Event(), threading.Event()
    blocker = threading.Thread(
        target=_block_the_ledger_row, args=("nightly", tick_key(tick), ready, release)
    )
    blocker.start()
    try:
        assert ready.wait(30)
        doomed = run_workers("--processes", "0", "--poll-interval", "0.1")
        # It has preempted the tick (CAS done, uncommitted) and waits on the ledger row.
        wait_until(lambda: _scheduler_waiting_on_the_ledger(vendor), timeout=60)
        for pid in worker_children(doomed.pid):
            os.kill(pid, signal.SIGKILL)
        os.kill(doomed.pid, signal.SIGKILL)
    finally:
        release.set()
        blocker.join()
    # Nothing of the killed scheduler's transaction survives: the tick is still due.
    wait_until(lambda: not _scheduler_waiting_on_the_ledger(vendor), timeout=60)
    job.refresh_from_db()
    assert (job.version, job.next_run_at) == (0, tick)
    assert not JobRecord.objects.exists() and not Task.objects.exists()

    run_workers("--processes", "0", "--poll-interval", "0.1")
    wait_until(lambda: JobRecord.objects.filter(key=tick_key(tick)).exists(), timeout=60)
    time.sleep(0.5)
    assert JobRecord.objects.count() == 1 and Task.objects.filter(job_name="nightly").count() == 1


# -- rolling deploys: schedulers declaring different sets of jobs ---------------------


def _specs(*names):
    return {
        name: JobSpec(
            name=name, task_path="tests.testapp.tasks.record_job", cron="0 0 1 1 *", kwargs={}
        )
        for name in names
    }


def _a_minute_passes(*schedulers):
    """Simulated time: every declaration ages a minute, then the live schedulers run."""
    Job.objects.update(last_declared_at=F("last_declared_at") - dt.timedelta(minutes=1))
    for scheduler in schedulers:
        scheduler.step()


def _retired():
    return set(Job.objects.retired().values_list("name", flat=True))


def test_rolling_deploy_does_not_flap_and_retires_what_no_live_scheduler_declares():
    # declare_every=0: each step declares, as each real minute would.
    old = Scheduler(jobs=_specs("shared", "old-only"), declare_every=0)
    new = Scheduler(jobs=_specs("shared", "new-only"), declare_every=0)
    old.step()
    new.step()
    assert set(Job.objects.values_list("name", flat=True)) == {"shared", "old-only", "new-only"}
    versions = dict(Job.objects.values_list("name", "version"))

    for _ in range(30):  # half an hour of old and new code side by side
        _a_minute_passes(old, new)
        assert _retired() == set()
    assert dict(Job.objects.values_list("name", "version")) == versions  # nothing rewritten

    # The deploy is complete: the old code's schedulers are gone.
    for minute in range(1, 16):
        _a_minute_passes(new)
        assert _retired() == ({"old-only"} if minute >= 10 else set())

    # A retired job never fires, even when its tick has come.
    Job.objects.update(next_run_at=DbNow() - dt.timedelta(seconds=5))
    assert new.step() == 2
    assert set(JobRecord.objects.values_list("job_name", flat=True)) == {"shared", "new-only"}

    # Rolled back: the old code declares it again and it is live from its next tick.
    old.step()
    job = Job.objects.get(name="old-only")
    assert job.retired_at is None and job.next_run_at > database_now("default")
    for _ in range(15):
        _a_minute_passes(old, new)
    assert _retired() == set()


def test_a_scheduler_back_after_a_long_outage_declares_before_it_retires():
    first = Scheduler(jobs=_specs("mine"), declare_every=0)
    first.step()
    Job.objects.update(last_declared_at=DbNow() - dt.timedelta(hours=2))
    restarted = Scheduler(jobs=_specs("mine"), declare_every=0)
    restarted.step()
    assert _retired() == set()


def test_running_scheduler_declares_every_interval():
    scheduler = Scheduler(jobs=_specs("looped"), interval=0.05, declare_every=0.2)
    thread = threading.Thread(target=scheduler.run, kwargs={"install_signals": False})
    thread.start()
    try:
        wait_until(lambda: Job.objects.filter(name="looped").exists(), timeout=30)
        Job.objects.update(last_declared_at=DbNow() - dt.timedelta(minutes=9))
        wait_until(
            lambda: Job.objects.filter(
                name="looped", last_declared_at__gt=DbNow() - dt.timedelta(minutes=1)
            ).exists(),
            timeout=30,
        )
    finally:
        scheduler.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert _retired() == set()


def _finished_long_ago(count):
    """``count`` SUCCESSFUL tasks finished ten days ago, in one statement."""
    template = make_task(TaskStatus.SUCCESSFUL, at=now() - dt.timedelta(days=10))
    fields = {
        f.attname: getattr(template, f.attname)
        for f in Task._meta.concrete_fields
        if f.attname != "id" and not f.generated
    }
    Task.objects.bulk_create([Task(**fields) for _ in range(count - 1)])


def test_retention_left_unfinished_goes_on_at_the_next_round(settings):
    """A call that runs out of time is followed by another at the next round, not a period
    later: at thousands of tasks a second, a period's finished rows outlast one call."""
    settings.RDBTASKS_RETENTION = {"SUCCESSFUL": "1d"}
    _finished_long_ago(4500)  # five batches; a 20 ms budget leaves some after the first
    scheduler = Scheduler(jobs={}, retention_budget=0.02)
    scheduler.step()
    left = Task.objects.count()
    assert 0 < left < 4500
    rounds = 1
    while Task.objects.exists() and rounds < 50:
        scheduler.step()
        rounds += 1
    assert not Task.objects.exists() and rounds <= 6
    # All deleted: the next application waits for its period again.
    _finished_long_ago(10)
    scheduler.step()
    assert Task.objects.count() == 10
