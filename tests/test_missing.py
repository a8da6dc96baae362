"""Tasks a worker's code does not have (a rolling deploy): handed back, run by a worker
that has them, failed only when none has for MISSING_TASK_GRACE."""

import dataclasses
import datetime as dt
import signal

import pytest

from django_rdbtasks.exceptions import InvalidTaskPath
from django_rdbtasks.loading import TaskNotHere, load_task
from django_rdbtasks.models import Task
from django_rdbtasks.states import OutcomeKind, TaskStatus
from django_rdbtasks.worker.missing import FIRST_DELAY, MissingTasks
from tests.conftest import wait_until, worker_children
from tests.test_execution import NOW, claimed, execute
from tests.testapp import release_tasks
from tests.testapp.models import SideEffect

NEW = "tests.testapp.release_tasks.added_in_new_release"
OLD_RELEASE = {"RDBTASKS_TEST_OLD_RELEASE": "1"}


# -- which paths another worker may have ---------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["tests.testapp.tasks.added_later", "tests.testapp.module_added_later.task"],
    ids=["task", "module"],
)
def test_a_task_or_module_missing_from_an_installed_app_may_be_elsewhere(path):
    with pytest.raises(TaskNotHere):
        load_task(path)


@pytest.mark.parametrize(
    "path",
    [
        "no.such.module.task",  # not under an installed app: never imported, never waited for
        "tests.testapp.broken_import.task",  # there, but its own import fails
        "tests.testapp.tasks.plain_function",  # there, and not a task
        "garbage",
    ],
)
def test_other_bad_paths_are_no_release_matter(path):
    with pytest.raises(InvalidTaskPath) as raised:
        load_task(path)
    assert not isinstance(raised.value, TaskNotHere)


# -- what the worker does with one (no database) -------------------------------------------


def row(path, **changes):
    return dataclasses.replace(claimed("add"), task_path=path, **changes)


def test_a_missing_task_is_handed_back_unspent_later_and_later():
    path = "tests.testapp.tasks.handed_back_later_and_later"
    first, _ = execute(row(path))
    second, _ = execute(row(path))
    assert first.kind == OutcomeKind.POSTPONE and not first.kind.spends_attempt
    assert isinstance(first.error, TaskNotHere) and first.entry is None  # no attempt recorded
    assert (first.delay, second.delay) == (FIRST_DELAY, 2 * FIRST_DELAY)


def test_a_missing_task_fails_once_nobody_ran_it_for_the_grace_saying_so():
    late = row(
        "tests.testapp.tasks.missing_for_long",
        started_at=NOW - dt.timedelta(seconds=601),
        attempts=1,
        max_attempts=3,
    )
    outcome, _ = execute(late)
    assert outcome.kind == OutcomeKind.FAILURE  # not retried: no attempt would find it
    assert isinstance(outcome.error, InvalidTaskPath)
    assert "no worker ran it for 601s (MISSING_TASK_GRACE is 600s)" in str(outcome.error)
    assert "Deploy the code that has it" in str(outcome.error)


def test_the_grace_counts_from_the_last_attempt_of_a_task_that_ran_before():
    # Ran (and failed) on a newer worker a minute ago; claimed now by an older one.
    ran = row(
        "tests.testapp.tasks.ran_elsewhere_before",
        started_at=NOW - dt.timedelta(hours=2),
        history=[{"finished_at": (NOW - dt.timedelta(minutes=1)).isoformat()}],
    )
    outcome, _ = execute(ran)
    assert outcome.kind == OutcomeKind.POSTPONE


def test_the_record_takes_the_backends_grace():
    from django_rdbtasks.backend import RDBTaskBackend
    from django_rdbtasks.worker.missing import missing_tasks

    backend = RDBTaskBackend(
        "grace-2min", {"OPTIONS": {"MISSING_TASK_GRACE": dt.timedelta(minutes=2)}}
    )
    assert missing_tasks(backend).grace == 120
    assert MissingTasks(5).grace == 5


# -- two releases side by side, in real processes ------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_task_only_the_new_release_has_is_run_by_it_once_attempts_unspent(run_workers):
    old = run_workers("--poll-interval", "0.1", "--no-scheduler", env=OLD_RELEASE)
    old_pids = set(wait_until(lambda: worker_children(old.pid), timeout=60))
    wait_until(lambda: "started" in old.log(), timeout=60)
    results = [release_tasks.added_in_new_release.enqueue(f"n{i}") for i in range(5)]
    # The old worker claims them first, and hands each back.
    wait_until(lambda: old.log().count(f"{NEW} postponed") >= 3, timeout=60)
    new = run_workers("--poll-interval", "0.1", "--no-scheduler")
    # A rolling deploy: the new release is up, then the old one is stopped.
    # (While both run, the old one may claim a task again each time it is due,
    # up to 10 s later each time: with the two side by side for long, the
    # drain's length was a coin toss, and once took over 90 s in CI.)
    wait_until(lambda: "started" in new.log(), timeout=60)
    old.signal(signal.SIGTERM)
    assert old.wait(timeout=60) == 0, old.log()

    def all_done():
        return Task.objects.filter(status=TaskStatus.SUCCESSFUL).count() == len(results)

    wait_until(all_done, timeout=90)
    for result in results:
        done = Task.objects.get(pk=result.id)
        assert done.attempts == 1, done.history  # handing back spent none
        assert [e["outcome"] for e in done.history] == ["SUCCESSFUL"]
    assert SideEffect.objects.count() == len(results)  # each ran exactly once
    assert not set(SideEffect.objects.values_list("pid", flat=True)) & old_pids
    assert "failed" not in old.log(), old.log()
    new.signal(signal.SIGTERM)
    assert new.wait(timeout=60) == 0, new.log()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_with_only_old_workers_it_fails_after_the_grace_saying_why(run_workers):
    result = release_tasks.added_in_new_release.enqueue("orphan")
    old = run_workers(
        "--poll-interval",
        "0.1",
        "--no-scheduler",
        env={**OLD_RELEASE, "RDBTASKS_TEST_MISSING_TASK_GRACE": "3"},
    )
    wait_until(lambda: Task.objects.get(pk=result.id).status == TaskStatus.FAILED, timeout=60)
    failed = Task.objects.get(pk=result.id)
    # Handed back a few times first, each time unspent; then failed, not retried.
    assert old.log().count(f"{NEW} postponed") >= 2, old.log()
    assert failed.attempts == 1
    assert (failed.finished_at - failed.started_at).total_seconds() >= 3
    [entry] = failed.history
    assert entry["exception_class_path"] == "django_rdbtasks.exceptions.InvalidTaskPath"
    assert "no worker ran it for" in entry["traceback"]
    assert "MISSING_TASK_GRACE is 3s" in entry["traceback"]
    assert not SideEffect.objects.exists()
    old.signal(signal.SIGTERM)
    assert old.wait(timeout=60) == 0, old.log()


def test_a_bad_grace_is_reported_by_the_backend_check():
    from django_rdbtasks.backend import RDBTaskBackend

    def messages(grace):
        backend = RDBTaskBackend("x", {"OPTIONS": {"MISSING_TASK_GRACE": grace}})
        return [m.id for m in backend.check()]

    assert "django_rdbtasks.E003" in messages("soon")
    assert "django_rdbtasks.E003" in messages(-1)
    for fine in (30, "45", dt.timedelta(minutes=5)):
        assert not {"django_rdbtasks.E003", "django_rdbtasks.W001"} & set(messages(fine))
