import datetime as dt
import math
import os
import re
import subprocess
import sys
import threading

import psycopg
import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_rdbtasks.backend import RDBTask, RDBTaskBackend, bulk_enqueue
from django_rdbtasks.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    framework_signals,
    task_backends,
)
from django_rdbtasks.exceptions import ArgumentsNotJSON
from django_rdbtasks.models import Task
from django_rdbtasks.worker import Worker
from django_rdbtasks.worker.listener import parse_ready
from tests.conftest import ROOT, listen_connection
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


def test_a_refused_argument_is_named_and_nothing_is_written():
    when = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    with pytest.raises(ArgumentsNotJSON, match=r"kwargs\['b'\] is a datetime\.datetime"):
        tasks.add.enqueue(1, b=when)
    assert not Task.objects.exists()


def test_tuples_become_lists_like_the_framework():
    """As the framework's own backends do (documented in the README): not refused."""
    result = tasks.add.enqueue((1, 2), {"k": (3,)})
    assert result.args == [[1, 2], {"k": [3]}]
    assert Task.objects.get().args == [[1, 2], {"k": [3]}]


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


NOT_AN_APP = (
    "'tests.not_an_app.report': module 'tests.not_an_app' is not part of an installed app, "
    "nor of a distribution an installed app requires, so workers do not import it "
    "(add its package to RDBTASKS_TASK_MODULES to allow it)."
)


def test_a_task_a_worker_cannot_import_is_refused_at_enqueue():
    from tests import not_an_app

    for _ in range(2):  # refused every time, not only the first
        with pytest.raises(InvalidTask, match=re.escape(NOT_AN_APP)):
            not_an_app.report.enqueue("monday")
    with pytest.raises(InvalidTask, match=re.escape(NOT_AN_APP)):
        bulk_enqueue(not_an_app.report, [(("tuesday",), {})])
    with pytest.raises(InvalidTask, match=re.escape(NOT_AN_APP)):
        not_an_app.report.using(priority=3).enqueue("wednesday")
    assert not Task.objects.exists()


MAIN_SCRIPT = """
import django
django.setup()
from django_rdbtasks.compat import HAS_DJANGO_TASKS, InvalidTask
if HAS_DJANGO_TASKS:
    from django.tasks import task
else:
    from django_tasks import task

@task()
def nightly():
    return 1

try:
    nightly.enqueue()
except InvalidTask as exc:
    print("refused:", exc)
"""


def test_a_task_defined_in_main_is_refused_at_enqueue(tmp_path):
    """A script that declares a task and enqueues it: a worker's __main__ is manage.py."""
    script = tmp_path / "script.py"
    script.write_text(MAIN_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: '__main__.nightly' is defined in __main__"), (
        done.stdout + done.stderr
    )
    assert not Task.objects.exists()


def test_get_result_reads_a_row_whose_task_cannot_be_loaded():
    """Renamed, removed, or never importable: the row is there, so is its result."""
    row = Task.objects.create(
        task_path="tests.testapp.tasks.renamed_since", args=[1], max_attempts=3, status="FAILED"
    )
    backend = task_backends["default"]
    result = backend.get_result(str(row.id))
    assert result.status == TaskResultStatus.FAILED
    assert result.task.module_path == "tests.testapp.tasks.renamed_since"
    assert result.args == [1] and result.backend == "default"
    assert backend.get_result(str(row.id)) == result
    result.refresh()
    with pytest.raises(TaskResultMismatch):
        tasks.add.get_result(str(row.id))


def test_get_result_reads_a_row_whose_queue_is_no_longer_configured():
    row = Task.objects.create(
        task_path="tests.testapp.tasks.add", args=[1, 2], queue_name="removed", status="READY"
    )
    result = tasks.add.get_result(str(row.id))
    assert result.status == TaskResultStatus.READY
    assert result.task.queue_name == "removed" and result.task.func is tasks.add.func


@pytest.mark.slow
def test_a_row_a_worker_cannot_import_fails_with_the_message_enqueue_gives(run_workers):
    """A row written before enqueue refused such tasks: a real worker fails it with
    the message enqueue now gives, and its result reads."""
    row = Task.objects.create(task_path="tests.not_an_app.report", args=["monday"])
    workers = run_workers("--burst")
    assert workers.wait(timeout=120) == 0, workers.log()
    row.refresh_from_db()
    assert row.status == "FAILED"
    assert NOT_AN_APP in row.history[-1]["traceback"]
    result = task_backends["default"].get_result(str(row.id))
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path.endswith("InvalidTaskPath")


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


def test_each_bulk_result_reads_back_equal_its_batchs_clock_included(vendor):
    # Each batch is a statement of its own, with its own clock: the results
    # of the first batches carry theirs, not the last one's.
    results = bulk_enqueue(tasks.add, [((i, i), {}) for i in range(5)], batch_size=2)
    rows = {str(row.id): row for row in Task.objects.all()}
    if vendor == "postgresql":  # elsewhere two batches may share a millisecond
        assert len({row.enqueued_at for row in rows.values()}) == 3, "one clock per batch"
    for result in results:
        assert result.enqueued_at == rows[result.id].enqueued_at == rows[result.id].run_after
        assert tasks.add.get_result(result.id) == result


def test_a_bulk_enqueue_rolled_back_with_its_transaction_leaves_no_row():
    with pytest.raises(RuntimeError), transaction.atomic():
        bulk_enqueue(tasks.add, [((i, i), {}) for i in range(3)])
        assert Task.objects.count() == 3  # visible inside the caller's transaction
        raise RuntimeError("rolled back")
    assert Task.objects.count() == 0


def test_bulk_enqueue_sends_task_enqueued_once_per_task_once_the_rows_are_in():
    seen = []

    def receiver(sender, task_result, **kwargs):
        # The row is there when the signal comes, with the result's values.
        row = Task.objects.get(pk=task_result.id)
        seen.append((sender, task_result.id, row.enqueued_at == task_result.enqueued_at))

    framework_signals.task_enqueued.connect(receiver, weak=False)
    try:
        results = bulk_enqueue(tasks.add, [((i, i), {}) for i in range(4)], batch_size=3)
    finally:
        framework_signals.task_enqueued.disconnect(receiver)
    assert seen == [(RDBTaskBackend, r.id, True) for r in results]


def test_bulk_enqueue_writes_what_its_rows_share_and_their_arguments_exactly():
    # What every row shares is written once per batch (COPY's text on
    # PostgreSQL, SQL literals on MySQL): quoting and escaping must hold for
    # it as for the arguments; and 2,000 long rows make several statements.
    odd = "50% 'off' \\ \"x\" \t tab \n line %s %(k)s é"
    settings = {
        "default": {
            "BACKEND": "django_rdbtasks.backend.RDBTaskBackend",
            "QUEUES": ["default", odd],
        }
    }
    with override_settings(TASKS=settings):
        task = tasks.add.using(queue_name=odd)
        calls = [((f"%s %% %(k)s '{i}' \\ \t", "x" * 300), {"k": odd}) for i in range(2000)]
        results = bulk_enqueue(task, calls)
        rows = {str(row.id): row for row in Task.objects.all()}
        assert len(rows) == 2000
        for result, (args, kwargs) in zip(results, calls, strict=True):
            row = rows[result.id]
            assert (row.queue_name, row.args, row.kwargs) == (odd, list(args), kwargs)
            assert tasks.add.get_result(result.id) == result


def test_a_bulk_enqueue_with_dedup_keys_checks_every_call_first_and_keeps_one_per_key():
    with pytest.raises(ArgumentsNotJSON):
        bulk_enqueue(tasks.sync_account, [(("acme",), {}), (("globex",), {}), ((object(),), {})])
    assert Task.objects.count() == 0
    calls = [(("acme",), {}), (("globex",), {}), ((), {"account": "acme"})]
    acme, globex, again = bulk_enqueue(tasks.sync_account, calls)
    assert again.id == acme.id != globex.id
    assert Task.objects.count() == 2


def test_signals_are_sent(django_capture_on_commit_callbacks):
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result.status))

    signals = framework_signals
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
    params = listen_connection().get_connection_params()
    with psycopg.connect(
        **{k: v for k, v in params.items() if k != "cursor_factory"}, autocommit=True
    ) as listener:
        listener.execute("LISTEN rdbtasks_ready")
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
            result = tasks.send_email.enqueue("x@example.com")
        thread.join()
    # The queue, the priority, and the transaction's start, which no row it
    # wrote runs before (db/frontier.py).
    [(queue, priority, start)] = [parse_ready(payload) for payload in received]
    assert (queue, priority) == ("emails", 10)
    assert start <= Task.objects.get(pk=result.id).run_after


# -- run_after reads back as the producer asked (issue 10) -----------------------------

ROW_COLUMNS = (
    "task_path",
    "queue_name",
    "backend_name",
    "priority",
    "args",
    "kwargs",
    "max_attempts",
    "status",
    "version",
    "worker_id",
    "attempts",
    "history",
    "job_name",
    "dedup_key",
    "waiting_on",
    "on_parent_failure",
    "requested_run_after",
)


def test_a_task_not_deferred_reads_back_as_not_deferred():
    result = tasks.add.enqueue(1, 2)
    assert result.task.run_after is None
    row = Task.objects.get(pk=result.id)
    # The queue still orders by the enqueue time; the producer asked for nothing.
    assert row.requested_run_after is None and row.run_after == row.enqueued_at
    fetched = tasks.add.get_result(result.id)
    assert fetched.task.run_after is None
    assert fetched == result


def test_a_deferred_task_reads_back_the_time_asked_for():
    later = timezone.now() + dt.timedelta(minutes=3)
    result = tasks.add.using(run_after=later).enqueue(1, 2)
    row = Task.objects.get(pk=result.id)
    assert row.requested_run_after == later == row.run_after
    assert tasks.add.get_result(result.id).task.run_after == later
    assert tasks.add.get_result(result.id) == result


def test_run_after_read_back_survives_retries_and_requeue():
    later = timezone.now() + dt.timedelta(minutes=3)
    plain = tasks.always_fails.enqueue("x")
    deferred = tasks.always_fails.using(run_after=later).enqueue("y")
    Task.objects.filter(pk=deferred.id).update(run_after=timezone.now())  # due now
    Worker(burst=True).run(install_signals=False)
    backend = task_backends["default"]
    for result, asked in ((plain, None), (deferred, later)):
        row = Task.objects.get(pk=result.id)
        assert (row.status, row.attempts) == ("FAILED", 2)
        assert tasks.always_fails.get_result(result.id).task.run_after == asked
        assert backend.requeue(result.id)
        assert tasks.always_fails.get_result(result.id).task.run_after == asked


def test_one_row_and_batch_inserts_write_the_same_rows():
    later = timezone.now() + dt.timedelta(minutes=3)
    for run_after in (None, later):
        task = tasks.send_email.using(run_after=run_after) if run_after else tasks.send_email
        one = task.enqueue("a@example.com")
        batch = bulk_enqueue(task, [(("a@example.com",), {})] * 2)
        rows = Task.objects.filter(pk__in=[one.id, *(r.id for r in batch)])
        values = [tuple(getattr(row, column) for column in ROW_COLUMNS) for row in rows]
        assert len(values) == 3 and values[0] == values[1] == values[2], values
        written = values[0]
        assert written[ROW_COLUMNS.index("requested_run_after")] == run_after
        for row in rows:
            assert row.run_after == (run_after or row.enqueued_at)
        assert {tasks.send_email.get_result(r.id).task.run_after for r in [one, *batch]} == {
            run_after
        }


def test_one_row_insert_works_with_server_side_binding(vendor):
    if vendor != "postgresql":
        pytest.skip("server-side binding is a psycopg 3 option")
    from django_rdbtasks.db import dialect_for

    backend = task_backends["default"]
    dialect = dialect_for(connection)
    later = timezone.now() + dt.timedelta(minutes=3)
    connection.ensure_connection()
    for notify, run_after in ((True, None), (False, later)):
        new = backend.enqueuer.new_task(tasks.add.using(run_after=run_after), [1], {"b": 2})
        with transaction.atomic(), psycopg.Cursor(connection.connection) as cursor:
            enqueued_at = dialect.inserts.insert_tasks(cursor, [new], notify)
        row = Task.objects.get(pk=new.id)
        assert (row.args, row.kwargs, row.requested_run_after) == ([1], {"b": 2}, run_after)
        assert row.enqueued_at == enqueued_at


def test_bulk_enqueue_wakes_each_queue_once_on_commit(vendor):
    if vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; other databases poll")
    params = listen_connection().get_connection_params()
    with psycopg.connect(
        **{k: v for k, v in params.items() if k != "cursor_factory"}, autocommit=True
    ) as listener:
        listener.execute("LISTEN rdbtasks_ready")
        with transaction.atomic():
            bulk_enqueue(tasks.add, [((1, 1), {})] * 3)
            bulk_enqueue(tasks.send_email, [(("x@example.com",), {})] * 3)
            assert list(listener.notifies(timeout=0.2)) == []  # nothing before the commit
        payloads = [n.payload for n in listener.notifies(timeout=2, stop_after=2)]
    ready = [parse_ready(payload) for payload in payloads]
    assert sorted((queue, priority) for queue, priority, _ in ready) == [
        ("default", 0),
        ("emails", 10),
    ]
    # One transaction: one start, before every row it wrote.
    assert len({start for _, _, start in ready}) == 1
    assert ready[0][2] <= Task.objects.order_by("run_after").first().run_after


# -- results -------------------------------------------------------------------------


def test_refresh_reads_once_and_brings_progress(django_assert_num_queries):
    result = tasks.add.enqueue(1, 2)
    Task.objects.filter(pk=result.id).update(
        status="RUNNING", progress=0.5, progress_message="half"
    )
    with django_assert_num_queries(1):
        result.refresh()
    assert (result.status, result.progress, result.progress_message) == (
        TaskResultStatus.RUNNING,
        0.5,
        "half",
    )
    Task.objects.filter(pk=result.id).update(progress=0.75, progress_message="most")
    async_to_sync(result.arefresh)()
    assert (result.progress, result.progress_message) == (0.75, "most")


def test_arguments_not_json_is_a_type_error():
    assert issubclass(ArgumentsNotJSON, TypeError)


# -- OPTIONS -------------------------------------------------------------------------


def options_backend(**options):
    return RDBTaskBackend("opts", {"QUEUES": ["default"], "OPTIONS": options})


def test_options_may_be_text_from_the_environment():
    backend = options_backend(MAX_ATTEMPTS="5", BACKOFF="0.5", MAX_BACKOFF=60)
    assert (backend.max_attempts, backend.backoff, backend.max_backoff) == (5, 0.5, 60.0)
    assert backend.check() == []


@pytest.mark.parametrize(
    "name, value",
    [
        ("MAX_ATTEMPTS", 0),
        ("MAX_ATTEMPTS", 2.5),
        ("MAX_ATTEMPTS", "three"),
        ("MAX_ATTEMPTS", True),
        ("MAX_ATTEMPTS", None),
        ("BACKOFF", -1),
        ("BACKOFF", "nan"),
        ("MAX_BACKOFF", -0.5),
    ],
)
def test_bad_options_are_reported_and_refused(name, value):
    backend = options_backend(**{name: value})
    [error] = backend.check()
    assert error.id == "django_rdbtasks.E003"
    assert name in error.msg and repr(value) in error.msg
    with pytest.raises(ImproperlyConfigured, match=name):
        backend.enqueue(tasks.add, [1, 2], {})
    with pytest.raises(ImproperlyConfigured, match=name):
        backend.bulk_enqueue(tasks.add, [([1, 2], {})])
    assert not Task.objects.exists()


def test_unknown_options_are_a_warning():
    [warning] = options_backend(MAX_ATTEMPT=3, NOTIFY=False).check()
    assert warning.id == "django_rdbtasks.W001"
    assert "MAX_ATTEMPT" in warning.msg and "MAX_ATTEMPTS" in warning.hint


def test_bulk_and_single_enqueue_keep_awkward_values_exactly():
    import zoneinfo

    awkward = [
        "quote ' double \" backslash \\ tab \t newline \n",
        "accents é ü, CJK 漢字, emoji 🎉, RTL עברית",
        2**62,
        -1.5e-300,
        {"nested": [True, False, None, {"k": ["v"]}]},
        "",
    ]
    when = dt.datetime(2031, 7, 15, 14, 30, 15, 123456, tzinfo=zoneinfo.ZoneInfo("Europe/Berlin"))
    task = tasks.add.using(run_after=when)
    single = task.enqueue(*awkward, k="ß")
    batch = bulk_enqueue(task, [(awkward, {"k": "ß"})] * 3)
    for result in [single, *batch]:
        fetched = tasks.add.get_result(result.id)
        assert (fetched.args, fetched.kwargs) == (awkward, {"k": "ß"})
        assert fetched.task.run_after == when
        assert fetched == result
        row = Task.objects.get(pk=result.id)
        assert row.run_after == row.requested_run_after == when
