import datetime as dt
import math
import threading

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_rdbtasks.backend import RDBTask, RDBTaskBackend, bulk_enqueue
from django_rdbtasks.compat import (
    SIGNAL_MODULES,
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
)
from django_rdbtasks.exceptions import ArgumentsNotJSON
from django_rdbtasks.models import Task
from django_rdbtasks.worker import Worker
from tests.testapp import backport_tasks, tasks
from tests.testapp.models import Invoice

pytestmark = pytest.mark.django_db(transaction=True)


def test_backend_features():
    backend = task_backends["default"]
    assert isinstance(backend, RDBTaskBackend)
    assert backend.supports_defer
    assert backend.supports_priority
    assert backend.supports_get_result
    assert backend.supports_async_task
    assert isinstance(tasks.add, RDBTask)


def test_enqueue_writes_one_row_and_returns_a_ready_result():
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.args == [2, 3]
    assert result.enqueued_at is not None
    row = Task.objects.get()
    assert str(row.id) == result.id
    assert (row.task_path, row.queue_name, row.status) == (
        "tests.testapp.tasks.add",
        "default",
        "READY",
    )
    assert row.max_attempts == 3  # OPTIONS["MAX_ATTEMPTS"] in tests/settings.py
    assert row.version == 0 and row.attempts == 0


def test_decorator_options_override_backend_defaults():
    tasks.always_fails.enqueue("x")
    assert Task.objects.get().max_attempts == 2
    with pytest.raises(InvalidTask, match="max_attempts"):
        RDBTask(func=tasks.add.func, max_attempts=0)
    with pytest.raises(InvalidTask, match="backoff"):
        RDBTask(func=tasks.add.func, backoff=-1)


def test_priority_queue_and_run_after_are_stored():
    later = timezone.now() + dt.timedelta(hours=1)
    result = tasks.send_email.using(run_after=later).enqueue("a@example.com")
    row = Task.objects.get(pk=result.id)
    assert (row.priority, row.queue_name) == (10, "emails")
    assert abs(row.run_after - later) < dt.timedelta(milliseconds=1)
    assert not Task.objects.runnable().exists()


def test_enqueue_is_part_of_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        Invoice.objects.create(number="1")
        tasks.add.enqueue(1, 1)
        raise RuntimeError("roll back")
    assert not Task.objects.exists()
    assert not Invoice.objects.exists()

    with transaction.atomic():
        Invoice.objects.create(number="2")
        tasks.add.enqueue(1, 1)
    assert Task.objects.count() == 1


@pytest.mark.parametrize(
    "args, kwargs",
    [
        ((dt.date(2026, 1, 1),), {}),
        (({1, 2},), {}),
        ((), {"data": {1: "int key"}}),
        ((math.nan,), {}),
        ((object(),), {}),
    ],
    ids=["date", "set", "int-key", "nan", "object"],
)
def test_arguments_json_cannot_round_trip_are_refused(args, kwargs):
    with pytest.raises(ArgumentsNotJSON, match="JSON"):
        tasks.add.enqueue(*args, **kwargs)
    assert not Task.objects.exists()


def test_tuples_become_lists_like_the_framework():
    result = tasks.add.enqueue((1, 2), {"k": (3,)})
    assert result.args == [[1, 2], {"k": [3]}]


def test_get_result_from_any_process_view():
    result = tasks.add.enqueue(20, 22)
    fetched = tasks.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.READY
    Worker(burst=True).run(install_signals=False)
    fetched = tasks.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL
    assert fetched.return_value == 42
    assert fetched.attempts == 1 and len(fetched.worker_ids) == 1
    assert fetched.started_at <= fetched.finished_at
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_get_result_of_unknown_id_raises():
    backend = task_backends["default"]
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result("00000000-0000-0000-0000-000000000000")
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result("not-a-uuid")


def test_failed_result_carries_every_attempts_error():
    result = tasks.always_fails.enqueue("boom")
    Worker(burst=True).run(install_signals=False)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 2
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"] * 2
    assert "ValueError: boom" in result.errors[-1].traceback


def test_bulk_enqueue_inserts_all_in_one_transaction():
    results = bulk_enqueue(tasks.add, [((i, i), {}) for i in range(2500)], batch_size=1000)
    assert len(results) == 2500
    assert Task.objects.count() == 2500
    assert {r.id for r in results} == {str(pk) for pk in Task.objects.values_list("pk", flat=True)}

    with pytest.raises(ArgumentsNotJSON):
        bulk_enqueue(tasks.add, [((1, 1), {}), ((object(), 1), {})])
    assert Task.objects.count() == 2500


def test_signals_are_sent(django_capture_on_commit_callbacks):
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result.status))

    signals = SIGNAL_MODULES[0]
    for name in ("task_enqueued", "task_started", "task_finished"):
        getattr(signals, name).connect(receiver, weak=False)
    try:
        tasks.add.enqueue(1, 2)
        Worker(burst=True).run(install_signals=False)
    finally:
        for name in ("task_enqueued", "task_started", "task_finished"):
            getattr(signals, name).disconnect(receiver)
    assert [status for _, status in seen] == [
        TaskResultStatus.READY,
        TaskResultStatus.RUNNING,
        TaskResultStatus.SUCCESSFUL,
    ]
    assert all(sender is RDBTaskBackend for sender, _ in seen)


def test_tasks_declared_through_the_backport_run_on_our_workers():
    result = backport_tasks.multiply.enqueue(6, 7)
    Worker(burst=True).run(install_signals=False)
    assert task_backends["default"].get_result(result.id).return_value == 42


def test_async_task_runs():
    result = tasks.async_add.enqueue(1, 2)
    Worker(burst=True).run(install_signals=False)
    result.refresh()
    assert result.return_value == 3


def test_notify_is_delivered_on_commit_only(vendor):
    if vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; other databases poll")
    params = connection.get_connection_params()
    with psycopg.connect(
        **{k: v for k, v in params.items() if k != "cursor_factory"}, autocommit=True
    ) as listener:
        listener.execute("LISTEN rdbtasks")
        received = []

        def listen():
            for notify in listener.notifies(timeout=5, stop_after=1):
                received.append(notify.payload)

        with pytest.raises(RuntimeError), transaction.atomic():
            tasks.add.enqueue(1, 1)
            raise RuntimeError
        thread = threading.Thread(target=listen)
        thread.start()
        with transaction.atomic():
            tasks.send_email.enqueue("x@example.com")
        thread.join()
    assert received == ["emails"]
