"""Cron arithmetic, the CAS fire of a tick, misfires, declared jobs, checks."""

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.utils import timezone

from django_rdbtasks.conf import MIN_RETIRE_AFTER
from django_rdbtasks.db.functions import DbNow
from django_rdbtasks.job_validation import validate_cron
from django_rdbtasks.jobs import (
    JobSpec,
    database_now,
    fire,
    fire_due_jobs,
    next_tick,
    redeclare_jobs,
    retire_after,
    retire_undeclared_jobs,
    sync_declared_jobs,
    tick_key,
    upcoming_ticks,
)
from django_rdbtasks.models import Job, JobRecord, Task
from django_rdbtasks.worker import Worker
from tests.testapp.models import SideEffect

UTC = dt.UTC
BERLIN = ZoneInfo("Europe/Berlin")


# -- cron ------------------------------------------------------------------------------


@pytest.mark.parametrize("expression", ["61 * * * *", "* * *", "every minute", "", "* * * * * * *"])
def test_invalid_cron_is_refused(expression):
    with pytest.raises(ValidationError, match="cron"):
        validate_cron(expression)


def test_every_minute_and_hourly():
    start = dt.datetime(2026, 5, 1, 10, 0, 30, tzinfo=UTC)
    assert upcoming_ticks("* * * * *", "UTC", start, 3) == [
        dt.datetime(2026, 5, 1, 10, m, tzinfo=UTC) for m in (1, 2, 3)
    ]
    assert upcoming_ticks("0 * * * *", "UTC", start, 2) == [
        dt.datetime(2026, 5, 1, 11, tzinfo=UTC),
        dt.datetime(2026, 5, 1, 12, tzinfo=UTC),
    ]
    # Strictly after: a tick is never fired twice by asking again at the tick.
    tick = dt.datetime(2026, 5, 1, 11, tzinfo=UTC)
    assert next_tick("0 * * * *", "UTC", tick) == dt.datetime(2026, 5, 1, 12, tzinfo=UTC)


def test_daily_job_across_spring_forward_in_berlin():
    # 2026-03-29: 02:00 local becomes 03:00; 02:30 does not exist that day.
    start = dt.datetime(2026, 3, 27, 12, tzinfo=BERLIN)
    ticks = [t.astimezone(BERLIN) for t in upcoming_ticks("30 2 * * *", "Europe/Berlin", start, 3)]
    assert [t.isoformat() for t in ticks] == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",  # fired once, at the first time that exists
        "2026-03-30T02:30:00+02:00",
    ]


def test_hourly_job_across_fall_back_in_berlin():
    # 2026-10-25: 03:00 local becomes 02:00; the hour 02:00-03:00 happens twice.
    start = dt.datetime(2026, 10, 25, 0, 30, tzinfo=BERLIN)
    ticks = upcoming_ticks("0 * * * *", "Europe/Berlin", start, 4)
    # Every real hour once: four ticks one hour apart in UTC, none repeated.
    assert [t.isoformat() for t in ticks] == [
        "2026-10-24T23:00:00+00:00",
        "2026-10-25T00:00:00+00:00",
        "2026-10-25T01:00:00+00:00",
        "2026-10-25T02:00:00+00:00",
    ]


def test_daily_job_across_fall_back_fires_once():
    start = dt.datetime(2026, 10, 24, 12, tzinfo=BERLIN)
    ticks = [t.astimezone(BERLIN) for t in upcoming_ticks("30 2 * * *", "Europe/Berlin", start, 2)]
    assert [t.date().isoformat() for t in ticks] == ["2026-10-25", "2026-10-26"]


# -- firing ----------------------------------------------------------------------------

pytestmark_db = pytest.mark.django_db(transaction=True)


def make_job(name="j", cron="* * * * *", next_run_at=None, **fields):
    now = database_now("default")
    return Job.objects.create(
        name=name,
        task_path="tests.testapp.tasks.record_job",
        kwargs={"job": name},
        cron=cron,
        next_run_at=next_run_at or now - dt.timedelta(seconds=5),
        **fields,
    )


@pytestmark_db
def test_a_due_tick_fires_once_and_moves_on():
    # Yearly: the following tick cannot pass while the test runs, whatever the minute.
    job = make_job(cron="0 0 1 1 *")
    tick = job.next_run_at
    assert fire(job, using="default") is True
    assert fire(job, using="default") is False  # stale version: someone else's tick now
    job.refresh_from_db()
    assert job.version == 1 and job.last_run_at == tick
    assert job.next_run_at == next_tick(job.cron, job.timezone, tick)
    record = JobRecord.objects.get()
    assert (record.job_name, record.key, record.scheduled_for) == ("j", tick_key(tick), tick)
    task = Task.objects.get()
    assert str(record.task_id) == str(task.id) and task.job_name == "j"
    assert task.kwargs == {"job": "j"}


@pytestmark_db
def test_job_record_follows_its_task():
    make_job(name="ok")
    fire_due_jobs()
    Worker(burst=True).run(install_signals=False)
    record = JobRecord.objects.get(job_name="ok")
    assert record.status == "SUCCESSFUL"
    assert record.worker_id and record.started_at <= record.finished_at
    assert record.duration is not None and record.error == ""
    assert SideEffect.objects.filter(key="job:ok").count() == 1


@pytestmark_db
def test_failing_job_task_marks_its_record_failed():
    job = make_job(name="fails")
    Job.objects.filter(pk=job.pk).update(
        task_path="tests.testapp.tasks.always_fails", kwargs={"message": "nope"}
    )
    fire_due_jobs()
    Worker(burst=True).run(install_signals=False)
    record = JobRecord.objects.get()
    assert record.status == "FAILED"
    assert "ValueError: nope" in record.error


@pytestmark_db
def test_job_naming_no_task_spends_the_tick_and_says_why():
    job = make_job(name="ghost")
    Job.objects.filter(pk=job.pk).update(task_path="tests.testapp.tasks.plain_function")
    assert fire_due_jobs() == 1
    record = JobRecord.objects.get()
    assert record.status == "FAILED" and "not a task" in record.error
    assert not Task.objects.exists()


@pytestmark_db
def test_queue_and_priority_overrides():
    make_job(name="prio", queue_name="other", priority=42)
    fire_due_jobs()
    task = Task.objects.get()
    assert (task.queue_name, task.priority) == ("other", 42)


@pytestmark_db
def test_paused_job_does_not_fire():
    make_job(enabled=False)
    assert fire_due_jobs() == 0
    assert not JobRecord.objects.exists()


@pytestmark_db
def test_misfire_run_once_after_downtime():
    now = database_now("default")
    missed = (now - dt.timedelta(minutes=30)).replace(second=0, microsecond=0)
    job = make_job(next_run_at=missed)
    assert fire_due_jobs() == 1
    job.refresh_from_db()
    assert job.next_run_at > now  # the other 29 missed ticks are not run
    assert list(JobRecord.objects.values_list("key", flat=True)) == [tick_key(missed)]
    assert fire_due_jobs() == 0


@pytestmark_db
def test_misfire_skip_after_downtime():
    now = database_now("default")
    missed = (now - dt.timedelta(minutes=30)).replace(second=0, microsecond=0)
    job = make_job(next_run_at=missed, misfire_policy="skip")
    assert fire_due_jobs() == 0
    job.refresh_from_db()
    assert job.next_run_at > now
    assert not JobRecord.objects.exists() and not Task.objects.exists()


@pytestmark_db
def test_skip_policy_still_fires_a_tick_that_is_only_a_little_late():
    now = database_now("default")
    make_job(cron="0 0 1 1 *", next_run_at=now - dt.timedelta(seconds=5), misfire_policy="skip")
    assert fire_due_jobs() == 1


@pytestmark_db
def test_an_already_fired_tick_is_not_fired_again():
    job = make_job()
    tick = job.next_run_at
    fire(job, using="default")
    # An operator moves the job back to a tick that already ran.
    Job.objects.filter(pk=job.pk).update(next_run_at=tick, version=job.version + 5)
    assert fire_due_jobs() == 0
    assert JobRecord.objects.count() == 1 and Task.objects.count() == 1


# -- validation and declared jobs ------------------------------------------------------


@pytestmark_db
def test_job_model_validation():
    job = Job(name="x", task_path="os.system", cron="99 * * * *", timezone="Mars/Olympus")
    with pytest.raises(ValidationError) as error:
        job.full_clean()
    assert set(error.value.message_dict) >= {"cron", "timezone", "task_path"}
    Job(name="y", task_path="tests.testapp.tasks.noop", cron="*/5 * * * *").full_clean()


@pytestmark_db
def test_declared_jobs_are_synced_without_clobbering_a_pause(settings):
    settings.RDBTASKS_JOBS = {
        "nightly": {
            "task": "tests.testapp.tasks.noop",
            "cron": "0 3 * * *",
            "timezone": "Europe/Berlin",
        },
    }
    sync_declared_jobs()
    job = Job.objects.get(name="nightly")
    assert job.from_code and job.enabled
    assert job.next_run_at.astimezone(BERLIN).hour == 3

    Job.objects.filter(pk=job.pk).update(enabled=False)  # an operator pauses it
    settings.RDBTASKS_JOBS["nightly"]["cron"] = "0 4 * * *"
    sync_declared_jobs()
    job.refresh_from_db()
    assert job.enabled is False  # the pause stands
    assert job.cron == "0 4 * * *" and job.next_run_at.astimezone(BERLIN).hour == 4


@pytestmark_db
def test_periodic_decorator_declares_a_job():
    from tests.testapp import periodic_tasks  # noqa: F401 - declares on import

    sync_declared_jobs()
    job = Job.objects.get(name="tests.testapp.periodic_tasks.heartbeat")
    assert job.cron == "*/5 * * * *" and job.task_path == job.name


@pytestmark_db
def test_bad_declared_jobs_fail_the_system_check(settings):
    settings.RDBTASKS_JOBS = {
        "bad-cron": {"task": "tests.testapp.tasks.noop", "cron": "* * * 13 *"},
        "bad-task": {"task": "tests.testapp.tasks.plain_function", "cron": "* * * * *"},
        "bad-zone": {"task": "tests.testapp.tasks.noop", "cron": "* * * * *", "timezone": "X/Y"},
    }
    with pytest.raises(SystemCheckError) as error:
        call_command("check")
    message = str(error.value)
    assert "'bad-cron'" in message and "'bad-task'" in message and "'bad-zone'" in message


def test_periodic_refuses_a_bad_cron_at_import():
    from django.core.exceptions import ImproperlyConfigured

    from django_rdbtasks.jobs import periodic
    from tests.testapp.tasks import noop

    with pytest.raises(ImproperlyConfigured, match="cron"):
        periodic("not a cron")(noop)


def test_periodic_on_a_plain_function_says_it_needs_a_task():
    from django_rdbtasks.jobs import periodic
    from tests.testapp.tasks import plain_function

    with pytest.raises(ImproperlyConfigured) as refused:
        periodic("0 3 * * *")(plain_function)
    assert str(refused.value) == (
        "@periodic on tests.testapp.tasks.plain_function: it needs a task, made with "
        "@task(); put @periodic above @task()."
    )


def test_periodic_without_a_cron_expression_says_so():
    from django_rdbtasks.jobs import periodic
    from tests.testapp.tasks import noop

    expected = r"@periodic needs a cron expression, not the task tests\.testapp\.tasks\.noop"
    with pytest.raises(TypeError, match=expected):
        periodic(noop)  # type: ignore[arg-type]


@pytestmark_db
def test_a_declared_job_naming_a_missing_task_says_which_path(settings):
    settings.RDBTASKS_JOBS = {
        "ghost": {"task": "tests.testapp.tasks.missing", "cron": "* * * * *"},
        "outside": {"task": "tests.not_an_app.report", "cron": "* * * * *"},
    }
    with pytest.raises(SystemCheckError) as error:
        call_command("check")
    message = str(error.value)
    assert (
        "Job 'ghost': 'tests.testapp.tasks.missing': module 'tests.testapp.tasks' "
        "has no 'missing'." in message
    )
    # Refused as enqueue() would refuse it: no worker would import that module.
    assert "Job 'outside': 'tests.not_an_app.report': module 'tests.not_an_app' is not" in message
    assert "NoneType" not in message


@pytestmark_db
def test_a_job_whose_task_is_gone_records_which_path():
    job = make_job(name="renamed")
    Job.objects.filter(pk=job.pk).update(task_path="tests.testapp.tasks.renamed_since")
    assert fire_due_jobs() == 1
    record = JobRecord.objects.get()
    assert record.status == "FAILED"
    # TaskNotHere: an InvalidTaskPath a later release may mend (see worker/missing.py).
    assert record.error == (
        "TaskNotHere: 'tests.testapp.tasks.renamed_since': module 'tests.testapp.tasks' "
        "has no 'renamed_since'."
    )


def test_tick_key_is_utc_to_the_second():
    tick = timezone.make_aware(dt.datetime(2026, 3, 29, 3, 0), BERLIN)
    assert tick_key(tick) == "2026-03-29T01:00:00Z"


# -- retirement of jobs no live scheduler declares --------------------------------------


def specs(*names, cron="0 0 1 1 *"):
    return {
        name: JobSpec(name=name, task_path="tests.testapp.tasks.record_job", cron=cron)
        for name in names
    }


def declared_minutes_ago(name, minutes):
    Job.objects.filter(name=name).update(last_declared_at=DbNow() - dt.timedelta(minutes=minutes))


@pytestmark_db
def test_retired_job_never_fires():
    job = make_job(name="gone", from_code=True)
    Job.objects.filter(pk=job.pk).update(retired_at=DbNow())
    assert not Job.objects.due().exists()
    assert list(Job.objects.retired()) == [job]
    assert fire_due_jobs() == 0
    # A scheduler that read the job before it was retired loses its CAS.
    assert fire(job, using="default") is False
    assert not JobRecord.objects.exists() and not Task.objects.exists()


@pytestmark_db
def test_code_job_nobody_declares_is_retired_after_the_window():
    sync_declared_jobs(jobs=specs("kept", "removed"))
    admin_job = make_job(name="from-the-admin", next_run_at=database_now("default"))
    declared_minutes_ago("removed", 9)
    declared_minutes_ago("from-the-admin", 60)
    assert retire_undeclared_jobs() == []  # 9 minutes: within the 10-minute window
    declared_minutes_ago("removed", 11)
    version = Job.objects.get(name="removed").version
    assert retire_undeclared_jobs() == ["removed"]
    removed = Job.objects.get(name="removed")
    assert removed.retired_at is not None and removed.version == version + 1
    assert set(Job.objects.filter(retired_at__isnull=True).values_list("name", flat=True)) == {
        "kept",
        admin_job.name,  # created in the admin: never retired
    }
    assert retire_undeclared_jobs() == []  # once


@pytestmark_db
def test_retirement_window_follows_the_setting(settings):
    sync_declared_jobs(jobs=specs("hourly-window"))
    declared_minutes_ago("hourly-window", 30)
    settings.RDBTASKS_RETIRE_AFTER = 3600
    assert retire_undeclared_jobs() == []
    declared_minutes_ago("hourly-window", 61)
    assert retire_undeclared_jobs() == ["hourly-window"]


def test_retire_after_setting(settings):
    assert retire_after() == 600
    settings.RDBTASKS_RETIRE_AFTER = 1800
    assert retire_after() == 1800
    settings.RDBTASKS_RETIRE_AFTER = 5  # a late re-declaration would retire live jobs
    assert retire_after() == MIN_RETIRE_AFTER
    settings.RDBTASKS_RETIRE_AFTER = "10m"
    with pytest.raises(ImproperlyConfigured, match="RDBTASKS_RETIRE_AFTER"):
        retire_after()


@pytestmark_db
def test_code_job_declared_before_declarations_were_recorded_gets_a_whole_window():
    job = make_job(name="from-0.1", from_code=True)
    assert job.last_declared_at is None  # synced by a version that did not record it
    assert retire_undeclared_jobs() == []
    job.refresh_from_db()
    assert job.retired_at is None
    assert abs(job.last_declared_at - database_now("default")) < dt.timedelta(seconds=5)


@pytestmark_db
def test_retired_job_declared_again_comes_back_from_its_next_tick():
    sync_declared_jobs(jobs=specs("back", cron="* * * * *"))
    declared_minutes_ago("back", 11)
    assert retire_undeclared_jobs() == ["back"]
    # Retired for an hour: its stored tick is long past.
    stale_tick = database_now("default") - dt.timedelta(hours=1)
    Job.objects.filter(name="back").update(next_run_at=stale_tick)
    assert fire_due_jobs() == 0

    redeclare_jobs(jobs=specs("back", cron="* * * * *"))  # its code is deployed again
    job = Job.objects.get(name="back")
    now = database_now("default")
    assert job.retired_at is None and job.next_run_at > now
    assert now - job.last_declared_at < dt.timedelta(seconds=5)
    assert fire_due_jobs() == 0  # the ticks it missed while retired are not owed
    assert retire_undeclared_jobs() == []


@pytestmark_db
def test_redeclaring_is_one_update_unless_a_row_needs_a_sync(django_assert_max_num_queries):
    jobs = specs("a", "b", "c")
    sync_declared_jobs(jobs=jobs)
    Job.objects.filter(name="b").update(enabled=False)  # an operator's pause
    declared_minutes_ago("a", 5)
    with django_assert_max_num_queries(1):
        redeclare_jobs(jobs=jobs)
    assert Job.objects.filter(last_declared_at__lt=DbNow() - dt.timedelta(minutes=1)).count() == 0
    # An operator deleted a code job: the next declaration puts it back.
    Job.objects.filter(name="c").delete()
    redeclare_jobs(jobs=jobs)
    assert set(Job.objects.values_list("name", flat=True)) == {"a", "b", "c"}
    assert Job.objects.get(name="b").enabled is False  # the pause stands


@pytestmark_db
def test_scheduler_applies_retention(settings):
    from django_rdbtasks.worker.scheduler import Scheduler

    old = database_now("default") - dt.timedelta(days=10)
    Task.objects.create(task_path="a.b", status="SUCCESSFUL", finished_at=old)
    Task.objects.create(task_path="a.b", status="FAILED", finished_at=old)
    Task.objects.create(task_path="a.b", status="SUCCESSFUL", finished_at=database_now("default"))
    settings.RDBTASKS_RETENTION = {"SUCCESSFUL": "7d"}
    Scheduler(database="default")._apply_retention()
    assert sorted(Task.objects.values_list("status", flat=True)) == ["FAILED", "SUCCESSFUL"]


@pytestmark_db
def test_bad_retention_fails_the_system_check(settings):
    settings.RDBTASKS_RETENTION = {"RUNNING": "7d"}
    with pytest.raises(SystemCheckError, match="RDBTASKS_RETENTION"):
        call_command("check")
