"""Per-queue permissions: a team sees and acts on its own queues and jobs only."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_rdbtasks.models import Job, JobRecord, Task, TaskStatus
from tests.browser.support import (
    JOB_VIEW,
    RETRY,
    admin_urls,
    in_groups,
    make_task,
    require_admin,
    staff,
    text,
    url,
)

pytestmark = [
    pytest.mark.django_db,
    *admin_urls(),
    pytest.mark.usefixtures("require_admin", "queue_permissions"),
]
__all__ = ["require_admin"]


@pytest.fixture
def queue_permissions(settings) -> None:
    # The mailing team owns "emails"; ops own every queue not listed.
    settings.RDBTASKS_QUEUE_PERMISSIONS = {"emails": ["mailing"], "*": ["ops"]}


def client_of(name: str, *groups: str, permissions=(*RETRY, *JOB_VIEW, "django_rdbtasks.run_job")):
    from django.test import Client

    client = Client()
    client.force_login(in_groups(staff(name, permissions), *groups))
    return client


def seed() -> dict[str, Task]:
    return {
        "email": make_task(TaskStatus.FAILED, queue_name="emails"),
        "default": make_task(TaskStatus.FAILED, queue_name="default"),
        "other": make_task(TaskStatus.FAILED, queue_name="other"),
    }


def shown(page: str, tasks: dict[str, Task]) -> set[str]:
    return {name for name, task in tasks.items() if url("task_change", task.pk) in page}


def test_the_list_and_the_pages_show_each_team_its_queues() -> None:
    tasks = seed()
    mailing = client_of("mail", "mailing")
    ops_team = client_of("opsy", "ops")
    both = client_of("lead", "mailing", "ops")
    outsider = client_of("nobody")
    assert shown(text(mailing.get(url("task_changelist"))), tasks) == {"email"}
    assert shown(text(ops_team.get(url("task_changelist"))), tasks) == {"default", "other"}
    assert shown(text(both.get(url("task_changelist"))), tasks) == set(tasks)
    assert shown(text(outsider.get(url("task_changelist"))), tasks) == set()
    superuser = client_of("root", permissions=())
    superuser_user = staff("boss", (), superuser=True)
    superuser.force_login(superuser_user)
    assert shown(text(superuser.get(url("task_changelist"))), tasks) == set(tasks)
    assert mailing.get(url("task_change", tasks["default"].pk)).status_code == 302  # not found
    assert mailing.get(url("task_change", tasks["email"].pk)).status_code == 200
    filters = text(mailing.get(url("task_changelist")))
    assert "?queue=emails" in filters and "?queue=default" not in filters


def test_actions_and_buttons_reach_only_the_teams_queues() -> None:
    tasks = seed()
    mailing = client_of("mail", "mailing")
    selected = [str(t.pk) for t in tasks.values()]
    mailing.post(url("task_changelist"), {"action": "retry_tasks", "_selected_action": selected})
    statuses = {name: Task.objects.get(pk=t.pk).status for name, t in tasks.items()}
    assert statuses == {"email": "READY", "default": "FAILED", "other": "FAILED"}
    assert mailing.post(url("task_retry", tasks["default"].pk)).status_code == 404
    mailing.post(url("task_retry_failed"), {"confirm": "1"})
    assert Task.objects.get(pk=tasks["other"].pk).status == TaskStatus.FAILED
    ops_team = client_of("opsy", "ops")
    ops_team.post(url("task_retry_failed"), {"confirm": "1"})
    assert Task.objects.get(pk=tasks["other"].pk).status == TaskStatus.READY


def test_dashboard_counts_only_the_teams_queues() -> None:
    seed()
    page = text(client_of("mail", "mailing").get(url("task_dashboard")))
    queues = page.split('id="rdbtasks-queues"')[1].split("</table>")[0]
    assert "?queue=emails" in queues and "?queue=default" not in queues
    assert "tasks in the table" not in page  # the table's total is everyone's
    # Nor what holds back cleanup: other sessions' queries, of every queue.
    assert 'id="rdbtasks-cleanup"' not in page
    total = queues.split("rdbtasks-total")[1]
    assert total.count('class="rdbtasks-count-failed"') == 1 and ">1</a>" in total


def test_jobs_and_their_records_go_with_their_queue() -> None:
    mail_job = Job.objects.create(
        name="digest", task_path="tests.testapp.tasks.add", cron="0 3 * * *", queue_name="emails"
    )
    own_queue = Job.objects.create(
        name="report", task_path="tests.testapp.tasks.add", cron="0 4 * * *"
    )  # the task's own queue: "default"
    JobRecord.objects.create(job_name="digest", key="k1")
    JobRecord.objects.create(job_name="report", key="k2")
    mailing = client_of(
        "mail",
        "mailing",
        permissions=(*JOB_VIEW, "django_rdbtasks.view_jobrecord", "django_rdbtasks.run_job"),
    )
    listing = text(mailing.get(url("job_changelist")))
    assert (
        url("job_change", mail_job.pk) in listing and url("job_change", own_queue.pk) not in listing
    )
    assert mailing.post(url("job_run", own_queue.pk)).status_code == 404
    records = text(mailing.get(url("jobrecord_changelist")))
    assert ">k1<" in records and ">k2<" not in records


def test_requeue_command_acts_as_a_user() -> None:
    tasks = seed()
    in_groups(staff("mail", RETRY), "mailing")
    staff("viewer", ["django_rdbtasks.view_task"])
    out = StringIO()
    call_command("requeue", "--all", "--user", "mail", stdout=out)
    assert "Requeued 1 task." in out.getvalue()
    assert Task.objects.get(pk=tasks["email"].pk).status == TaskStatus.READY
    assert Task.objects.get(pk=tasks["default"].pk).status == TaskStatus.FAILED
    with pytest.raises(CommandError, match="may not retry"):
        call_command("requeue", "--all", "--user", "viewer", stdout=StringIO())
    with pytest.raises(CommandError, match="No user"):
        call_command("requeue", "--all", "--user", "ghost", stdout=StringIO())
    call_command("requeue", "--all", stdout=StringIO())  # the shell: every queue
    assert Task.objects.get(pk=tasks["default"].pk).status == TaskStatus.READY
