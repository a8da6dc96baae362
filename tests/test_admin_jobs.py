"""The job admin: schedules in words, next runs, run now, pause, and jobs declared in code."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from django_rdbtasks.jobs import fire_due_jobs
from django_rdbtasks.models import Job, JobRecord
from tests.browser.support import (
    JOB_VIEW,
    admin_urls,
    client_for,
    log_messages,
    now,
    require_admin,
    text,
    url,
)

pytestmark = [
    pytest.mark.django_db,
    *admin_urls(),
    pytest.mark.usefixtures("require_admin"),
]
__all__ = ["require_admin"]

FORM = {
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
    row = listing.split(url("job_change", job.pk))[1].split("</tr>")[0]
    assert "<br" not in row  # one line
    page = text(client.get(url("job_change", job.pk)))
    ticks = re.findall(r"<li>(\w{3}) <time[^>]*>(\d{4}-\d\d-\d\d 02:30:00 CES?T)</time>", page)
    assert len(ticks) == 5
    assert all(day not in ("Sat", "Sun") for day, _ in ticks)
    assert re.search(r"\(\d{4}-\d\d-\d\d 0[01]:30:00 UTC\)", page)  # and in UTC
    assert "2026-01-05T01:30:00Z" in page  # the recent records table
    assert "ValueError: nope" in page


def test_a_paused_job_shows_no_next_runs() -> None:
    job = _job(enabled=False)
    client = client_for(*JOB_VIEW)
    page = text(client.get(url("job_change", job.pk)))
    assert 'class="rdbtasks-ticks"' not in page
    assert "None while the job is paused" in page
    listing = text(client.get(url("job_changelist")))
    row = listing.split(url("job_change", job.pk))[1].split("</tr>")[0]
    assert ">Paused</span>" in row
    assert "<time" not in row.split("field-next_run")[1].split("</td>")[0]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("cron", "61 * * * *", "Invalid cron expression"),
        ("timezone", "Mars/Olympus", "Unknown time zone"),
        ("task_path", "os.system", "is not a task"),
        ("task_path", "elsewhere.tasks.job", "not part of an installed app"),
        ("task_path", "tests.testapp.tasks.not_a_task", "is not a task"),
        ("kwargs", "[1, 2]", "must be a JSON object"),
        # Issue 39: accepted, and then every tick failed to enqueue.
        (
            "queue_name",
            "emials",
            "Queue &#x27;emials&#x27; is not in TASKS[&#x27;default&#x27;][&#x27;QUEUES&#x27;] "
            "(default, emails, other), so every tick would fail to enqueue. "
            "Did you mean &#x27;emails&#x27;?",
        ),
        ("priority", "1000", "priority must be a whole number between -100 and 100"),
    ],
)
def test_job_form_validates_cron_timezone_task_and_kwargs(field, value, message) -> None:
    data = {**FORM, field: value}
    client = client_for(*JOB_VIEW, "django_rdbtasks.add_job", "django_rdbtasks.pause_job")
    response = client.post(url("job_add"), data)
    assert response.status_code == 200
    assert message in text(response)
    assert not Job.objects.exists()


def test_adding_and_editing_a_job_schedules_its_next_tick() -> None:
    client = client_for(*JOB_VIEW, "django_rdbtasks.add_job", "django_rdbtasks.pause_job")
    data = dict(FORM)
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
    assert "1 job will run within seconds." in text(response)
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
    assert "paused and was not run; enable it first" in text(response)
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


def test_a_live_job_declared_in_code_is_read_only_but_can_be_paused_and_run() -> None:
    job = _job(from_code=True, last_declared_at=now())
    client = client_for(
        *JOB_VIEW,
        "django_rdbtasks.delete_job",
        "django_rdbtasks.pause_job",
        "django_rdbtasks.run_job",
    )
    page = text(client.get(url("job_change", job.pk)))
    assert 'name="cron"' not in page and 'name="enabled"' not in page
    assert 'name="_save"' not in page and url("job_delete", job.pk) not in page
    assert "Declared in code" in page
    assert url("job_pause", job.pk) in page and url("job_run", job.pk) in page
    assert client.post(url("job_change", job.pk), {**FORM, "cron": "* * * * *"}).status_code == 403
    assert client.post(url("job_delete", job.pk), {"post": "yes"}).status_code == 403
    client.post(
        url("job_changelist"),
        {"action": "delete_selected", "_selected_action": [job.pk], "post": "yes"},
    )
    assert Job.objects.get(pk=job.pk).cron == "30 2 * * 1-5"
    client.post(url("job_pause", job.pk))
    assert not Job.objects.get(pk=job.pk).enabled


def test_a_retired_job_is_shown_as_such_does_not_run_and_may_be_deleted() -> None:
    live = _job(name="live", from_code=True, last_declared_at=now())
    retired = _job(
        name="gone-from-code",
        from_code=True,
        last_declared_at=now() - dt.timedelta(days=2),
        retired_at=now() - dt.timedelta(days=1),
    )
    made_here = _job(name="made-here")
    client = client_for(*JOB_VIEW, "django_rdbtasks.delete_job", "django_rdbtasks.run_job")
    listing = text(client.get(url("job_changelist")))
    row = listing.split(url("job_change", retired.pk))[1].split("</tr>")[0]
    assert ">Retired</span>" in row
    only = text(client.get(url("job_changelist"), {"declared": "retired"}))
    assert url("job_change", retired.pk) in only
    assert url("job_change", live.pk) not in only and url("job_change", made_here.pk) not in only
    page = text(client.get(url("job_change", retired.pk)))
    assert "the job is retired" in page and 'class="rdbtasks-ticks"' not in page
    assert url("job_run", retired.pk) not in page
    response = client.post(url("job_run", retired.pk), follow=True)
    assert "retired (no longer in the code) and was not run" in text(response)
    assert url("job_delete", retired.pk) in page and 'name="_save"' not in page
    assert client.post(url("job_delete", retired.pk), {"post": "yes"}).status_code == 302
    assert not Job.objects.filter(pk=retired.pk).exists()
