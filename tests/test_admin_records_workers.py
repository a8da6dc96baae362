"""Job records and workers in the admin."""

from __future__ import annotations

import pytest

from django_rdbtasks.models import Job, JobRecord, TaskStatus
from tests.browser.support import (
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

pytestmark = [
    pytest.mark.django_db,
    *admin_urls(),
    pytest.mark.usefixtures("require_admin"),
]
__all__ = ["require_admin"]


def test_job_records_filter_and_link_to_their_task_and_job() -> None:
    job = Job.objects.create(
        name="nightly", task_path="tests.testapp.tasks.record_job", cron="0 3 * * *"
    )
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
    detail = text(client.get(url("jobrecord_change", ok.pk)))
    assert "Task queue" in detail.split('class="breadcrumbs"')[1][:600]


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
    assert " ago</span>" in page and "UTC" in page  # heartbeat age; started in the one format
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


def test_worker_concurrency_says_thread_or_threads_on_the_list_and_the_dashboard() -> None:
    make_worker("host-a:101", threads=1, batch=0)
    make_worker("host-b:202", threads=4, batch=1)
    client = client_for(VIEW[0], "django_rdbtasks.view_worker")
    for page in (
        text(client.get(url("worker_changelist"))),
        text(client.get(url("task_dashboard"))),
    ):
        assert "optimistic, 1 thread, adaptive batch" in page
        assert "optimistic, 4 threads, 1 task per claim" in page
        assert "1 threads" not in page and "\u00d7 0" not in page
