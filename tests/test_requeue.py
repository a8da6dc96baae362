"""``manage.py requeue``: a typo in what to requeue is named, and the command fails.

(Its selection by id, task, queue and time is tested in test_commands.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_rdbtasks.models import Task, TaskStatus
from tests.browser.support import make_task
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db


def requeue(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("requeue", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def failed(**fields) -> Task:
    return make_task(TaskStatus.FAILED, **fields)


def test_an_unknown_task_path_is_named_with_the_near_ones_and_nothing_is_requeued() -> None:
    row = failed(task_path="tests.testapp.tasks.always_fails")
    with pytest.raises(CommandError) as refused:
        requeue("--task", "tests.testapp.tasks.allways_fails")
    message = str(refused.value)
    assert "No task has the path 'tests.testapp.tasks.allways_fails'" in message
    assert "Did you mean 'tests.testapp.tasks.always_fails'?" in message
    assert Task.objects.get(pk=row.pk).status == TaskStatus.FAILED


def test_a_task_path_is_known_by_its_rows_or_by_the_code() -> None:
    # No row has it, but it is a task: nothing to requeue is an answer, not an error.
    assert requeue("--task", "tests.testapp.tasks.record") == ("Requeued 0 tasks.\n", "")
    # A row has it, though the code no longer does (renamed since): requeued.
    failed(task_path="tests.testapp.tasks.renamed_since")
    assert requeue("--task", "tests.testapp.tasks.renamed_since")[0] == "Requeued 1 task.\n"


def test_an_unknown_queue_is_named_with_the_configured_ones() -> None:
    failed()
    with pytest.raises(CommandError, match=r"No queue 'emials'.*default, emails, other"):
        requeue("--queue", "emials")
    # Configured but empty, or not configured but holding tasks: known.
    assert requeue("--queue", "other")[0] == "Requeued 0 tasks.\n"
    failed(queue_name="removed")
    assert requeue("--queue", "removed")[0] == "Requeued 1 task.\n"
    assert Task.objects.filter(status=TaskStatus.FAILED).count() == 1


def test_an_unknown_id_is_named_and_nothing_is_requeued() -> None:
    row = failed()
    unknown = uuid.uuid4()
    with pytest.raises(CommandError, match=f"No task has the id {unknown}"):
        requeue(str(row.pk), str(unknown))
    assert Task.objects.get(pk=row.pk).status == TaskStatus.FAILED


def test_an_id_in_another_status_is_reported() -> None:
    done = make_task(TaskStatus.SUCCESSFUL)
    out, err = requeue(str(done.pk))
    assert out == "Requeued 0 tasks.\n"
    assert err == f"Task {done.pk} is SUCCESSFUL, not FAILED.\n"


@pytest.mark.django_db(transaction=True)
def test_the_command_exits_non_zero_on_an_unknown_path() -> None:
    failed()
    done = subprocess.run(
        [sys.executable, "-m", "django", "requeue", "--task", "myapp.tasks.nope"],
        env={
            **os.environ,
            "RDBTASKS_TEST_WORKER": "1",  # the test database
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "No task has the path 'myapp.tasks.nope', and it names no task." in done.stderr
    assert "Requeued" not in done.stdout
    assert Task.objects.get().status == TaskStatus.FAILED


@pytest.mark.parametrize("flag", ["--since", "--until"])
def test_an_age_reaching_before_year_one_is_refused_clearly(flag) -> None:
    """Issue 39: ``--since 99999999d`` ended in an OverflowError traceback."""
    row = failed()
    with pytest.raises(CommandError, match=f"{flag}: '99999999d' is too long an age"):
        requeue(flag, "99999999d")
    assert Task.objects.get(pk=row.pk).status == TaskStatus.FAILED


def test_every_bad_argument_is_named_at_once_before_any_query(django_assert_num_queries) -> None:
    with django_assert_num_queries(0), pytest.raises(CommandError) as refused:
        requeue("not-an-id", "--since", "soon", "--limit", "0")
    message = str(refused.value)
    assert message.startswith("Refused, nothing was done:")
    assert "'not-an-id' is not a task id." in message
    assert "--since: 'soon' is neither an age (7d, 12h, 30min, 45s, 2w or 1d12h)" in message
    assert "--limit must be at least 1, not 0." in message


def test_a_dry_run_of_one_task_says_task() -> None:
    failed()
    assert requeue("--all", "--dry-run")[0] == "Would requeue 1 task.\n"
    failed()
    assert requeue("--all", "--dry-run")[0] == "Would requeue 2 tasks.\n"


def test_an_iso_time_still_selects() -> None:
    failed()
    assert requeue("--since", "2000-01-01T00:00:00", "--dry-run")[0] == "Would requeue 1 task.\n"
