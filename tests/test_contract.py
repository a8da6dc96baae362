"""The Tasks framework's public contract, through this backend and the real worker.

Modelled on Django 6.1's own ``tests/tasks`` suite (its DummyBackend and
ImmediateBackend tests), adapted to a database backend: ``enqueue()`` returns a
READY result, the worker (the engine ``runworkers`` runs, here in this process)
runs it, and every later read -- ``get_result``, ``aget_result``, ``refresh``,
``arefresh``, the signals -- tells the same story. Runs on Django 5.2 with the
backport and on Django 6.1, on every database.

The tasks are declared here: a worker in this process may import them, since
their module is already imported.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import traceback
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from django.utils import timezone

from django_rdbtasks.backend import RDBTaskBackend, RDBTaskResult
from django_rdbtasks.compat import (
    HAS_DJANGO_TASKS,
    Task,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    framework_signals,
    task_backends,
)
from django_rdbtasks.db.functions import DbNow
from django_rdbtasks.models import Task as TaskRow
from django_rdbtasks.worker import Worker
from tests.testapp.models import SideEffect

if HAS_DJANGO_TASKS:
    from django.tasks import task
    from django.tasks.checks import check_tasks
else:
    from django_tasks import task
    from django_tasks.checks import check_tasks

pytestmark = pytest.mark.django_db(transaction=True)

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


# -- the tasks (named as in Django's tests/tasks/tasks.py where they match) ----------


@task()
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task()
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task(max_attempts=1)
def failing_task_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task(max_attempts=1)
def failing_task_system_exit() -> None:
    raise SystemExit("This task failed due to SystemExit")


@task(max_attempts=1)
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task()
def complex_return_value() -> Any:
    # Neither JSON nor anything a retry could change.
    return lambda: True


@task(takes_context=True)
def get_task_id(context: Any) -> str:
    return context.task_result.id


@task(takes_context=True)
def status_seen_while_running(context: Any) -> str:
    """What another reader of the result sees while this runs."""
    return str(task_backends["default"].get_result(context.task_result.id).status)


@task(takes_context=True, max_attempts=3, backoff=0)
def fails_twice(context: Any) -> int:
    """Fails on its first two attempts; records what its context said on each."""
    result = context.task_result
    SideEffect.objects.create(
        key=f"attempt {context.attempt}: attempts={result.attempts} "
        f"workers={len(result.worker_ids)} id_ok={result.id == str(result.id)}"
    )
    if context.attempt < 3:
        raise RuntimeError(f"attempt {context.attempt} fails on purpose")
    return context.attempt


@task()
def record_key(key: str) -> str:
    SideEffect.objects.create(key=key)
    return key


# -- helpers ------------------------------------------------------------------------


def drain() -> None:
    """Run the worker until nothing is runnable (retries with no backoff included)."""
    assert Worker(burst=True).run(install_signals=False) == 0


def backend() -> RDBTaskBackend:
    found = task_backends["default"]
    assert isinstance(found, RDBTaskBackend)
    return found


@pytest.fixture
def signals_seen() -> Iterator[list[tuple[str, Any, dict[str, Any]]]]:
    """(signal name, sender, a snapshot of the result) for every signal sent."""
    seen: list[tuple[str, Any, dict[str, Any]]] = []
    module = framework_signals  # django.tasks, or the backport on 5.2
    receivers = {}
    for name in ("task_enqueued", "task_started", "task_finished"):

        def receiver(sender: Any, task_result: Any, _name: str = name, **kwargs: Any) -> None:
            snapshot = {
                "id": task_result.id,
                "status": task_result.status,
                "task": task_result.task,
                "backend": task_result.backend,
                "worker_ids": list(task_result.worker_ids),
                "started_at": task_result.started_at,
                "finished_at": task_result.finished_at,
                "errors": list(task_result.errors),
                "return_value": task_result._return_value,
            }
            seen.append((_name, sender, snapshot))

        receivers[name] = receiver
        getattr(module, name).connect(receiver, weak=False)
    try:
        yield seen
    finally:
        for name, receiver in receivers.items():
            getattr(module, name).disconnect(receiver)


def variant(name: str) -> Task:
    """The same task as enqueued with each of ``using()``'s options."""
    later = timezone.now() + timedelta(hours=1)
    return {
        "plain": noop_task,
        "async": noop_task_async,
        "priority": noop_task.using(priority=7),
        "queue_name": noop_task.using(queue_name="emails"),
        "run_after": noop_task.using(run_after=later),
        "all": noop_task.using(priority=-3, queue_name="other", run_after=later),
    }[name]


VARIANTS = ["plain", "async", "priority", "queue_name", "run_after", "all"]


# -- enqueue ------------------------------------------------------------------------


def test_the_backend_is_ours_and_supports_everything() -> None:
    found = backend()
    assert found.alias == "default"
    assert (
        found.supports_defer,
        found.supports_priority,
        found.supports_get_result,
        found.supports_async_task,
    ) == (True, True, True, True)
    assert noop_task.get_backend() is found


def assert_new_result(result: Any, task: Task, args: list, kwargs: dict) -> None:
    assert isinstance(result, RDBTaskResult)
    assert result.status == READY
    assert result.is_finished is False
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None, None, None)
    assert result.enqueued_at is not None and timezone.is_aware(result.enqueued_at)
    with pytest.raises(ValueError, match="Task has not finished yet"):
        _ = result.return_value
    assert result.task == task
    assert result.task.run_after is None
    assert (result.args, result.kwargs) == (args, kwargs)
    assert result.backend == "default"
    assert (result.attempts, result.errors, result.worker_ids) == (0, [], [])
    assert str(uuid.UUID(result.id)) == result.id


@pytest.mark.parametrize("task_", [noop_task, noop_task_async], ids=["sync", "async"])
def test_enqueue_task(task_: Task) -> None:
    result = task_.enqueue(1, two=3)
    assert_new_result(result, task_, [1], {"two": 3})
    assert TaskRow.objects.get(pk=result.id).status == "READY"


@pytest.mark.parametrize("task_", [noop_task, noop_task_async], ids=["sync", "async"])
def test_aenqueue_task(task_: Task) -> None:
    result = async_to_sync(task_.aenqueue)()
    assert_new_result(result, task_, [], {})
    assert TaskRow.objects.get(pk=result.id).status == "READY"


def test_enqueue_and_aenqueue_refuse_arguments_that_are_not_json() -> None:
    with pytest.raises(TypeError, match="Unsupported type"):
        noop_task.enqueue(datetime.now())
    with pytest.raises(TypeError, match="Unsupported type"):
        async_to_sync(noop_task.aenqueue)(datetime.now())
    assert not TaskRow.objects.exists()


def test_enqueue_validates_against_the_backend_enqueued_to() -> None:
    unknown_queue = noop_task.using(queue_name="emails")
    with override_settings(
        TASKS={
            "default": {
                "BACKEND": "django_rdbtasks.backend.RDBTaskBackend",
                "QUEUES": ["default"],
            }
        }
    ):
        from django_rdbtasks.compat import InvalidTask

        with pytest.raises(InvalidTask, match="Queue 'emails' is not valid"):
            unknown_queue.enqueue()
        with pytest.raises(InvalidTask, match="Queue 'emails' is not valid"):
            async_to_sync(unknown_queue.aenqueue)()
    assert not TaskRow.objects.exists()


# -- get_result ---------------------------------------------------------------------


@pytest.mark.parametrize("name", VARIANTS)
def test_get_result_equals_the_result_enqueue_returned(name: str) -> None:
    enqueued_task = variant(name)
    result = enqueued_task.enqueue(1, two=[3])

    fetched = enqueued_task.get_result(result.id)
    assert fetched == result
    assert backend().get_result(result.id) == result
    assert async_to_sync(enqueued_task.aget_result)(result.id) == result
    assert async_to_sync(backend().aget_result)(result.id) == result
    # Spelled out, since equality is what is under test:
    assert fetched.task.run_after == enqueued_task.run_after
    assert (fetched.task.priority, fetched.task.queue_name, fetched.task.backend) == (
        enqueued_task.priority,
        enqueued_task.queue_name,
        "default",
    )
    assert (fetched.id, fetched.status, fetched.args, fetched.kwargs, fetched.backend) == (
        result.id,
        READY,
        [1],
        {"two": [3]},
        "default",
    )
    assert fetched.enqueued_at == result.enqueued_at


def test_a_deferred_task_reads_back_the_time_asked_for() -> None:
    later = timezone.now() + timedelta(minutes=5)
    result = noop_task.using(run_after=later).enqueue()
    assert noop_task.get_result(result.id).task.run_after == later
    assert noop_task.get_result(result.id) == result


def test_get_result_of_another_task_is_a_mismatch() -> None:
    result = noop_task_async.enqueue()
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        noop_task.get_result(result.id)
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        async_to_sync(noop_task.aget_result)(result.id)


@pytest.mark.parametrize("result_id", ["123", str(uuid.uuid4())], ids=["not-a-uuid", "unknown"])
def test_get_missing_result(result_id: str) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        noop_task.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(noop_task.aget_result)(result_id)


def test_refresh_of_an_unchanged_result_changes_nothing() -> None:
    result = async_to_sync(noop_task.aenqueue)()
    original = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == original
    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == original


@pytest.mark.skipif(
    not HAS_DJANGO_TASKS, reason="the backport's Task pickles its function by name, which fails"
)
def test_a_result_pickles() -> None:
    result = noop_task.enqueue(1, two=3)
    assert pickle.loads(pickle.dumps(result)) == result


# -- running: statuses, return values, errors ------------------------------------------


def test_successful_run_read_back_everywhere() -> None:
    result = calculate_meaning_of_life.enqueue()
    sibling = calculate_meaning_of_life.get_result(result.id)
    drain()
    assert result.status == READY  # a result is a snapshot until refreshed

    result.refresh()
    assert result.status == SUCCESSFUL and result.is_finished
    assert result.return_value == 42
    assert result.errors == []
    assert result.attempts == 1 and len(result.worker_ids) == 1
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at
    assert result.started_at <= result.finished_at
    assert result.task.run_after is None
    # The refreshed snapshot and a fresh read agree on every field.
    assert calculate_meaning_of_life.get_result(result.id) == result

    async_to_sync(sibling.arefresh)()
    assert sibling == result


def test_a_running_task_reads_back_as_running() -> None:
    result = status_seen_while_running.enqueue()
    drain()
    result.refresh()
    assert result.return_value == RUNNING


@pytest.mark.parametrize(
    "task_, exception, message",
    [
        (failing_task_value_error, ValueError, "This task failed due to ValueError"),
        (failing_task_system_exit, SystemExit, "This task failed due to SystemExit"),
    ],
    ids=["ValueError", "SystemExit"],
)
def test_failed_run_records_the_exception(
    task_: Task, exception: type[BaseException], message: str
) -> None:
    result = task_.enqueue()
    drain()
    result.refresh()
    assert result.status == FAILED and result.is_finished
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert result.started_at is not None and result.last_attempted_at is not None
    assert result.enqueued_at <= result.started_at <= result.finished_at
    [error] = result.errors
    assert error.exception_class is exception
    assert error.exception_class_path == f"builtins.{exception.__name__}"
    assert error.traceback.endswith(f"{exception.__name__}: {message}\n"), error.traceback
    assert result.task == task_
    assert (result.args, result.kwargs, result.attempts) == ([], {}, 1)
    assert task_.get_result(result.id) == result


def test_complex_exception() -> None:
    result = complex_exception.enqueue()
    drain()
    result.refresh()
    assert result.status == FAILED
    assert result._return_value is None
    assert result.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in result.errors[0].traceback


def test_complex_return_value(caplog: pytest.LogCaptureFixture) -> None:
    """Django's own test: the framework records ``TypeError`` itself, not a subclass."""
    result = complex_return_value.enqueue()
    with caplog.at_level(logging.ERROR):
        drain()
    # One record, the worker's (in place of the framework's: worker/task_logging.py).
    assert [r.name for r in caplog.records if r.levelno >= logging.ERROR] == [
        "django_rdbtasks.worker"
    ]
    result.refresh()
    assert result.status == FAILED
    assert result._return_value is None
    [error] = result.errors  # not retried: a retry cannot make it JSON
    assert error.exception_class is TypeError
    assert error.exception_class_path == "builtins.TypeError"
    assert "Unsupported type" in error.traceback  # the framework's own message, as the cause
    # Ours says which task returned it and where that task is defined.
    assert "tests.test_contract.complex_return_value (" in error.traceback
    assert "test_contract.py, line" in error.traceback


def test_takes_context() -> None:
    result = get_task_id.enqueue()
    drain()
    result.refresh()
    assert result.return_value == result.id


def test_context_counts_attempts_and_run_after_stays_as_asked() -> None:
    result = fails_twice.enqueue()
    drain()
    result.refresh()
    assert result.status == SUCCESSFUL
    assert result.return_value == 3
    assert result.attempts == 3 and len(result.worker_ids) == 3
    assert [e.exception_class for e in result.errors] == [RuntimeError, RuntimeError]
    assert "attempt 1 fails on purpose" in result.errors[0].traceback
    assert "attempt 2 fails on purpose" in result.errors[1].traceback
    seen = list(SideEffect.objects.order_by("id").values_list("key", flat=True))
    assert seen == [f"attempt {n}: attempts={n} workers={n} id_ok=True" for n in (1, 2, 3)]
    # The retries moved the row's run_after; the task still reads back as
    # never deferred, and still equal to what enqueue() returned.
    row = TaskRow.objects.get(pk=result.id)
    assert row.run_after > row.enqueued_at and row.requested_run_after is None
    fetched = fails_twice.get_result(result.id)
    assert fetched.task.run_after is None
    assert fetched.task == result.task == fails_twice
    assert fetched == result


# -- using() ------------------------------------------------------------------------


def test_using_run_after_priority_and_queue_name() -> None:
    later = timezone.now() + timedelta(hours=1)
    deferred_task = record_key.using(run_after=later, priority=-5, queue_name="other")
    deferred = deferred_task.enqueue("deferred")
    for priority in (-10, 10, 0):
        record_key.using(priority=priority).enqueue(f"p{priority}")
    drain()

    keys = list(SideEffect.objects.order_by("id").values_list("key", flat=True))
    assert keys == ["p10", "p0", "p-10"]  # by priority; the deferred one waits
    deferred.refresh()
    assert deferred.status == READY
    assert record_key.get_result(deferred.id) == deferred
    assert record_key.get_result(deferred.id).task == deferred_task

    # Time passes (the row's run_after is what the queue waits on).
    TaskRow.objects.filter(pk=deferred.id).update(run_after=DbNow())
    drain()
    deferred.refresh()
    assert deferred.status == SUCCESSFUL and deferred.return_value == "deferred"
    fetched = record_key.get_result(deferred.id)
    assert (fetched.task.run_after, fetched.task.priority, fetched.task.queue_name) == (
        later,
        -5,
        "other",
    )


# -- signals ------------------------------------------------------------------------


def test_signals_tell_the_whole_story(signals_seen: list) -> None:
    ok = calculate_meaning_of_life.enqueue()
    bad = failing_task_value_error.enqueue()
    drain()

    by_id: dict[str, list[tuple[str, Any, dict[str, Any]]]] = {ok.id: [], bad.id: []}
    for name, sender, snapshot in signals_seen:
        by_id[snapshot["id"]].append((name, sender, snapshot))
    for events in by_id.values():
        assert [name for name, _, _ in events] == ["task_enqueued", "task_started", "task_finished"]
        assert all(sender is RDBTaskBackend for _, sender, _ in events)
        assert all(s["backend"] == "default" for _, _, s in events)

    (_, _, enqueued), (_, _, started), (_, _, finished) = by_id[ok.id]
    assert (enqueued["status"], started["status"], finished["status"]) == (
        READY,
        RUNNING,
        SUCCESSFUL,
    )
    assert enqueued["task"] == calculate_meaning_of_life
    assert enqueued["worker_ids"] == [] and enqueued["started_at"] is None
    assert len(started["worker_ids"]) == 1 and started["started_at"] is not None
    assert finished["return_value"] == 42
    assert finished["finished_at"] >= finished["started_at"]

    _, _, bad_finished = by_id[bad.id][2]
    assert bad_finished["status"] == FAILED
    assert bad_finished["finished_at"] is not None


def test_aenqueue_sends_task_enqueued(signals_seen: list) -> None:
    result = async_to_sync(noop_task.aenqueue)(5)
    assert [(name, s["id"], s["status"]) for name, _, s in signals_seen] == [
        ("task_enqueued", result.id, READY)
    ]


def test_no_signal_for_a_refused_enqueue(signals_seen: list) -> None:
    with pytest.raises(TypeError):
        noop_task.enqueue({1, 2})
    assert signals_seen == []


# -- system checks -------------------------------------------------------------------


def broken_config() -> dict[str, Any]:
    return {
        "default": {
            "BACKEND": "django_rdbtasks.backend.RDBTaskBackend",
            "QUEUES": ["default"],
        },
        "broken": {
            "BACKEND": "django_rdbtasks.backend.RDBTaskBackend",
            "QUEUES": ["default"],
            "OPTIONS": {
                "DATABASE": "nowhere",
                "MAX_ATTEMPTS": 0,
                "BACKOFF": "soon",
                "MAX_ATEMPTS": 5,
            },
        },
    }


def test_a_good_config_passes_the_checks() -> None:
    assert backend().check() == []
    assert list(check_tasks()) == []


def test_the_framework_checks_report_a_bad_config() -> None:
    with override_settings(TASKS=broken_config()):
        messages = list(check_tasks())
        broken = task_backends["broken"]
        with pytest.raises(ImproperlyConfigured, match="MAX_ATTEMPTS"):
            broken.enqueue(noop_task.using(backend="broken"), [], {})
    by_id = {m.id: m for m in messages}
    assert sorted(m.id for m in messages) == [
        "django_rdbtasks.E001",
        "django_rdbtasks.E003",
        "django_rdbtasks.E003",
        "django_rdbtasks.W001",
    ]
    assert "'nowhere'" in by_id["django_rdbtasks.E001"].msg
    e003 = " ".join(m.msg for m in messages if m.id == "django_rdbtasks.E003")
    assert "MAX_ATTEMPTS" in e003 and "0" in e003 and "BACKOFF" in e003 and "'soon'" in e003
    assert "MAX_ATEMPTS" in by_id["django_rdbtasks.W001"].msg
    assert all(m.msg.startswith("Task backend 'broken'") for m in messages)
    assert not TaskRow.objects.exists()


# -- the running result, as the framework's own backends give it ---------------------


def test_the_running_result_has_the_task_as_enqueued(signals_seen: list) -> None:
    later = timezone.now() + timedelta(hours=1)
    enqueued_tasks = [
        get_task_id.using(priority=5, queue_name="emails"),
        get_task_id.using(priority=-5, run_after=later),
    ]
    results = [t.enqueue() for t in enqueued_tasks]
    TaskRow.objects.filter(pk=results[1].id).update(run_after=DbNow())  # due now
    drain()
    started = {s["id"]: s["task"] for name, _, s in signals_seen if name == "task_started"}
    assert [started[r.id] for r in results] == enqueued_tasks
    for result, enqueued_task in zip(results, enqueued_tasks, strict=True):
        assert get_task_id.get_result(result.id).task == enqueued_task


def test_task_finished_of_a_failure_carries_its_error(signals_seen: list) -> None:
    failing_task_value_error.enqueue()
    drain()
    [finished] = [s for name, _, s in signals_seen if name == "task_finished"]
    assert [e.exception_class for e in finished["errors"]] == [ValueError]


@pytest.mark.slow
def test_a_failure_in_a_worker_process_logs_its_traceback_once(run_workers: Any) -> None:
    """The same through ``runworkers``: one record, the worker's, with the traceback."""
    result = failing_task_value_error.enqueue()
    workers = run_workers("--burst")
    assert workers.wait(timeout=120) == 0, workers.log()
    log = workers.log()
    assert "NoneType: None" not in log, log
    assert f"Task id={result.id}" not in log, log  # the framework's records: not written
    finished = log.split(f"task {result.id} tests.test_contract.failing_task_value_error failed")
    assert len(finished) == 2, log
    assert finished[1].startswith(" (ran "), log
    assert "attempt 1 of 1)\nTraceback (most recent call last):" in finished[1], log
    assert "in failing_task_value_error" in finished[1]
    assert finished[1].count("ValueError: This task failed due to ValueError") == 1


def test_a_failure_logs_one_error_record_with_the_task_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One ERROR record per failure, the worker's, with the task's exception and its
    own stack (not ``NoneType: None``): an error tracker gets one event. The
    framework's record of it (its receiver of ``task_finished``) is not written,
    though the signal is sent while the exception is being handled, as the
    framework's own backends send it (worker/task_logging.py)."""
    caplog.set_level(logging.DEBUG)
    failing_task_value_error.enqueue()
    drain()
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == 1, [(r.name, r.getMessage(), r.exc_info) for r in errors]
    [record] = errors
    assert record.name == "django_rdbtasks.worker"
    assert record.exc_info is not None
    kind, error, stack = record.exc_info
    assert kind is ValueError and str(error) == "This task failed due to ValueError"
    frames = traceback.extract_tb(stack)
    # The task's own stack, from the worker's call to the raise; nothing of the reporter.
    assert frames[-1].name == "failing_task_value_error"
    assert all("reporting.py" not in frame.filename for frame in frames)
