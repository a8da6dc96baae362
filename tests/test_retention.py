"""Retention: old finished tasks deleted in batches, by age and status, and by setting."""

from __future__ import annotations

import datetime as dt
import subprocess
import threading
import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models.signals import post_delete
from django.test.utils import CaptureQueriesContext

from django_rdbtasks import retention
from django_rdbtasks.locks import LeasedLock
from django_rdbtasks.models import (
    JobRecord,
    Task,
    TaskDependency,
    TaskStatus,
    Worker,
    Workflow,
    WorkflowStep,
)
from django_rdbtasks.retention import prune, prune_by_setting, prune_workers
from django_rdbtasks.states import StepRole
from tests.browser.support import make_task, make_worker, now

pytestmark = pytest.mark.django_db

DAY = dt.timedelta(days=1)


def _old(status: str, days: float, **fields) -> Task:
    return make_task(status, at=now() - dt.timedelta(days=days), **fields)


def test_prune_deletes_only_old_finished_tasks() -> None:
    old = [_old(s, 10) for s in ("SUCCESSFUL", "FAILED", "CANCELLED")]
    young = _old("SUCCESSFUL", 2)
    # Unfinished tasks are never pruned, however old.
    waiting = [_old(s, 30) for s in ("READY", "RUNNING", "WAITING")]
    result = prune(7 * DAY)
    assert result.deleted == {"SUCCESSFUL": 1, "FAILED": 1, "CANCELLED": 1}
    assert result.total == 3 and not result.incomplete
    assert not Task.objects.filter(pk__in=[t.pk for t in old]).exists()
    assert Task.objects.filter(pk__in=[young.pk, *(t.pk for t in waiting)]).count() == 4


def test_prune_by_status() -> None:
    ok, failed = _old("SUCCESSFUL", 10), _old("FAILED", 10)
    assert prune(DAY, ["successful"]).deleted == {"SUCCESSFUL": 1}
    assert Task.objects.filter(pk=failed.pk).exists()
    assert not Task.objects.filter(pk=ok.pk).exists()
    with pytest.raises(ValueError, match="Only finished tasks"):
        prune(DAY, ["READY"])


def test_prune_works_in_batches_and_can_be_bounded() -> None:
    for _ in range(7):
        _old("SUCCESSFUL", 10)
    seen: list[int] = []
    first = prune(DAY, batch_size=3, max_batches=2, progress=lambda r: seen.append(r.total))
    assert (first.total, first.batches, first.incomplete) == (6, 2, True)
    assert seen == [3, 6]
    rest = prune(DAY, batch_size=3)
    assert (rest.total, rest.batches, rest.incomplete) == (1, 1, False)
    assert prune(DAY, batch_size=3, time_budget=0).incomplete  # no time: nothing done
    assert not Task.objects.exists()


def test_prune_takes_dependencies_and_unlinks_job_records() -> None:
    parent = _old("SUCCESSFUL", 10)
    child = _old("SUCCESSFUL", 10)
    keeper = make_task(TaskStatus.READY)
    TaskDependency.objects.create(parent=parent, child=child)
    TaskDependency.objects.create(parent=parent, child=keeper)
    record = JobRecord.objects.create(job_name="nightly", key="k", status="SUCCESSFUL", task=parent)
    assert prune(7 * DAY).total == 2
    assert not TaskDependency.objects.exists()
    record.refresh_from_db()
    assert record.task is None  # the ledger entry stays: its key must not run again


def test_prune_takes_workflow_steps_and_unlinks_their_compensations() -> None:
    workflow = Workflow.objects.create(name="order")
    step = _old("SUCCESSFUL", 10)
    undo = make_task(TaskStatus.READY)
    WorkflowStep.objects.create(task=step, workflow=workflow, name="charge")
    WorkflowStep.objects.create(
        task=undo, workflow=workflow, name="refund", role=StepRole.COMPENSATION, undoes=step
    )
    assert prune(7 * DAY).total == 1
    assert list(WorkflowStep.objects.values_list("task_id", "undoes_id")) == [(undo.pk, None)]
    assert Workflow.objects.filter(pk=workflow.pk).exists()


def test_prune_takes_a_step_and_its_compensation_in_one_batch() -> None:
    """The compensation's row both goes (its task) and points at a task that goes (undoes)."""
    workflow = Workflow.objects.create(name="order")
    step, undo = _old("SUCCESSFUL", 10), _old("SUCCESSFUL", 10)
    WorkflowStep.objects.create(task=step, workflow=workflow, name="charge")
    WorkflowStep.objects.create(
        task=undo, workflow=workflow, name="refund", role=StepRole.COMPENSATION, undoes=step
    )
    with transaction.atomic():  # the foreign keys are checked at this commit, deferred
        assert prune(7 * DAY).total == 2
    assert not WorkflowStep.objects.exists()
    assert not Task.objects.exists()


def _old_copies(count: int, days: float = 10) -> None:
    """``count`` old SUCCESSFUL tasks, made in one statement (copies of one)."""
    template = _old("SUCCESSFUL", days)
    fields = {
        f.attname: getattr(template, f.attname)
        for f in Task._meta.concrete_fields
        if f.attname != "id" and not f.generated
    }
    Task.objects.bulk_create([Task(**fields) for _ in range(count - 1)])


def test_a_batch_is_the_same_few_statements_whatever_its_size() -> None:
    """Django's deletion collector loaded every task and deleted them 100 at a time."""

    def statements(count: int) -> int:
        _old_copies(count)
        with CaptureQueriesContext(connection) as queries:
            result = prune(DAY, batch_size=1000)
        assert (result.total, result.batches) == (count, 1)
        assert not Task.objects.exists()
        return len(queries)

    assert statements(150) == statements(900)


def test_on_postgresql_a_batch_is_one_statement(vendor) -> None:
    """Its tasks, what hangs off them, and the count: no id goes through Python."""
    if vendor != "postgresql":
        pytest.skip("one statement with data-modifying CTEs is PostgreSQL's")
    _old_copies(300)
    with CaptureQueriesContext(connection) as queries:
        assert prune(DAY).total == 300
    writes = [q["sql"] for q in queries if "DELETE" in q["sql"] or "UPDATE" in q["sql"]]
    assert len(writes) == 1, writes


def test_receivers_of_task_deletes_hear_of_every_pruned_task() -> None:
    """With a receiver the collector deletes, as it sends the signals."""
    old = [_old("SUCCESSFUL", 10) for _ in range(3)]
    heard: list = []

    def receiver(sender, instance, **kwargs) -> None:
        heard.append(instance.pk)

    post_delete.connect(receiver, sender=Task)
    try:
        assert prune(7 * DAY).total == 3
    finally:
        post_delete.disconnect(receiver, sender=Task)
    assert sorted(heard) == sorted(t.pk for t in old)
    assert not Task.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_prune_leaves_a_row_another_transaction_holds_rather_than_wait(vendor) -> None:
    if vendor == "sqlite":
        pytest.skip("SQLite locks the database, not rows: writers take turns")
    held, free = _old("SUCCESSFUL", 10), _old("SUCCESSFUL", 10)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Task.objects.select_for_update().get(pk=held.pk)
                locked.set()
                release.wait(20)  # a prune that waits for it waits this long
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30)
        started = time.monotonic()
        result = prune(7 * DAY)
        waited = time.monotonic() - started
    finally:
        release.set()
        holder.join(30)
    assert waited < 10
    assert result.deleted == {"SUCCESSFUL": 1} and result.incomplete  # the held row is left
    assert list(Task.objects.values_list("pk", flat=True)) == [held.pk]
    assert not Task.objects.filter(pk=free.pk).exists()
    again = prune(7 * DAY)
    assert again.deleted == {"SUCCESSFUL": 1} and not again.incomplete
    assert not Task.objects.exists()


def test_count_prunable() -> None:
    _old("SUCCESSFUL", 10)
    _old("SUCCESSFUL", 10)
    _old("FAILED", 3)
    assert retention.count_prunable(7 * DAY) == {"SUCCESSFUL": 2, "FAILED": 0, "CANCELLED": 0}
    assert retention.count_prunable(DAY, ["FAILED"]) == {"FAILED": 1}
    assert Task.objects.count() == 3


def test_count_prunable_by_queue_and_a_fixed_clock() -> None:
    _old("SUCCESSFUL", 10)
    _old("SUCCESSFUL", 10, queue_name="emails")
    _old("FAILED", 10, queue_name="emails")
    assert retention.count_prunable_by_queue(7 * DAY) == {
        ("SUCCESSFUL", "default"): 1,
        ("SUCCESSFUL", "emails"): 1,
        ("FAILED", "emails"): 1,
    }
    # A clock fixed 5 days back: nothing had finished 7 days before it.
    earlier = now() - 5 * DAY
    assert retention.count_prunable_by_queue(7 * DAY, now=earlier) == {}
    assert prune(7 * DAY, now=earlier).total == 0
    assert Task.objects.count() == 3


def test_prune_workers_deletes_rows_of_long_gone_workers() -> None:
    make_worker("alive:1")
    make_worker("gone-long:2", age=2 * 86400)
    make_worker("stopped-long:3", age=3 * 86400, stopped_at=now() - 2 * DAY)
    make_worker("gone-recently:4", age=600)
    assert prune_workers() == 2
    assert sorted(Worker.objects.values_list("name", flat=True)) == ["alive:1", "gone-recently:4"]


def test_prune_by_setting(settings) -> None:
    settings.RDBTASKS_RETENTION = {"SUCCESSFUL": "1d", "FAILED": "30d"}
    ok, failed_young, failed_old, cancelled = (
        _old("SUCCESSFUL", 2),
        _old("FAILED", 10),
        _old("FAILED", 40),
        _old("CANCELLED", 400),  # not in the setting: kept forever
    )
    make_worker("gone-long:2", age=2 * 86400)
    result = prune_by_setting()
    assert result is not None
    assert result.deleted == {"SUCCESSFUL": 1, "FAILED": 1}
    assert result.workers == 1
    left = set(Task.objects.values_list("pk", flat=True))
    assert left == {failed_young.pk, cancelled.pk}
    assert ok.pk not in left and failed_old.pk not in left


def test_prune_by_setting_without_a_setting_deletes_no_task(settings) -> None:
    settings.RDBTASKS_RETENTION = None
    _old("SUCCESSFUL", 400)
    result = prune_by_setting()
    assert result is not None and result.total == 0
    assert Task.objects.count() == 1


def test_prune_by_setting_lets_one_process_work_at_a_time(settings) -> None:
    settings.RDBTASKS_RETENTION = {"SUCCESSFUL": "1d"}
    _old("SUCCESSFUL", 3)
    with LeasedLock("rdbtasks:retention", lease=60):
        assert prune_by_setting() is None
    assert Task.objects.count() == 1
    assert prune_by_setting().total == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"READY": "1d"}, "not a finished status"),
        ({"SUCCESSFUL": "soon"}, "is not an age"),
        ({"SUCCESSFUL": 7}, "has no unit"),
        ({"SUCCESSFUL": 7.0}, "has no unit"),
        ({"SUCCESSFUL": "7"}, "has no unit"),
        ({"SUCCESSFUL": "1m"}, "ambiguous"),
        (["SUCCESSFUL", "7d"], "must be a dict"),
    ],
)
def test_a_bad_retention_setting_deletes_nothing(settings, value, message) -> None:
    """What the schedulers call every minute refuses the setting, deleting nothing."""
    settings.RDBTASKS_RETENTION = value
    old = _old("SUCCESSFUL", 400)
    with pytest.raises(ImproperlyConfigured, match=message):
        prune_by_setting()
    assert Task.objects.filter(pk=old.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_runworkers_with_a_retention_without_a_unit_refuses_to_start(run_workers) -> None:
    """The schedulers prune by the setting on their own: a bare 7 stops them at the door."""
    old = _old("SUCCESSFUL", 400)
    worker = run_workers(
        "--processes", "0", env={"DJANGO_SETTINGS_MODULE": "tests.settings_retention"}
    )
    try:
        code = worker.wait(60)
    except subprocess.TimeoutExpired:
        code = None  # it started: the scheduler would have pruned
    log = worker.log()
    assert code not in (None, 0), log
    assert "django_rdbtasks.E020" in log and "7 has no unit" in log
    assert Task.objects.filter(pk=old.pk).exists()


def test_retention_takes_a_timedelta(settings) -> None:
    settings.RDBTASKS_RETENTION = {"SUCCESSFUL": dt.timedelta(days=1)}
    old, young = _old("SUCCESSFUL", 2), _old("SUCCESSFUL", 0.5)
    assert prune_by_setting().deleted == {"SUCCESSFUL": 1}
    assert list(Task.objects.values_list("pk", flat=True)) == [young.pk]
    assert not Task.objects.filter(pk=old.pk).exists()
