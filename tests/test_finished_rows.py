"""Rows finished in the task table, moved by the scheduler (PostgreSQL; finished_rows.py)."""

import datetime as dt
import threading

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_rdbtasks.finished_rows import move_finished_rows
from django_rdbtasks.models import Task
from django_rdbtasks.states import TaskStatus
from django_rdbtasks.worker.scheduler import Scheduler
from tests.conftest import rows_by_table, tables_holding
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def finished_in_place(count: int, status: str = TaskStatus.SUCCESSFUL) -> list:
    """Rows finished in the task table, as those finished before migration 0015 are,
    oldest first."""
    now = timezone.now()
    rows = [
        Task.objects.create(
            task_path="tests.testapp.tasks.add",
            args=[i, i],
            status=status,
            attempts=1,
            started_at=now - dt.timedelta(hours=1, seconds=count - i),
            finished_at=now - dt.timedelta(minutes=1, seconds=count - i),
            return_value=2 * i,
            history=[{"outcome": status}],
        )
        for i in range(count)
    ]
    return [row.pk for row in rows]


def test_elsewhere_than_postgresql_nothing_moves(vendor):
    if vendor == "postgresql":
        pytest.skip("PostgreSQL moves them: the tests below")
    finished_in_place(2)
    assert move_finished_rows().rows == 0
    assert Task.objects.filter(status=TaskStatus.SUCCESSFUL).count() == 2


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's finished rows")
def test_rows_finished_in_place_move_oldest_first_in_bounded_batches():
    ids = finished_in_place(5)
    ready = tasks.add.enqueue(9, 9)
    before = {row["id"]: row for row in Task.objects.values()}
    first = move_finished_rows(batch_size=2, max_batches=1)
    assert (first.rows, first.more) == (2, True)
    assert [tables_holding(pk) for pk in ids] == [["finished"]] * 2 + [["task"]] * 3
    rest = move_finished_rows(batch_size=2)
    assert (rest.rows, rest.more) == (3, False)
    assert rows_by_table() == {"task": 1, "finished": 5}
    assert tables_holding(ready.id) == ["task"]  # unfinished rows never move
    assert {row["id"]: row for row in Task.objects.values()} == before  # moved as they were
    assert move_finished_rows().rows == 0


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's finished rows")
def test_failed_and_cancelled_rows_stay_for_a_requeue_or_a_discard():
    """A requeue or a discard waiting for a row this moved would find nothing."""
    kept = finished_in_place(1, TaskStatus.FAILED) + finished_in_place(1, TaskStatus.CANCELLED)
    assert move_finished_rows().rows == 0
    assert [tables_holding(pk) for pk in kept] == [["task"], ["task"]]
    assert Task.objects.filter(pk__in=kept).requeue() == 2


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's finished rows")
def test_a_row_someone_holds_is_skipped_not_waited_for():
    held, free = finished_in_place(2)
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Task.objects.select_for_update().get(pk=held)
                locked.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert locked.wait(10)
        # Had it waited, the holder's 10 s would end first and both would move.
        assert move_finished_rows().rows == 1
        assert tables_holding(held) == ["task"] and tables_holding(free) == ["finished"]
    finally:
        release.set()
        thread.join(15)
    assert move_finished_rows().rows == 1
    assert tables_holding(held) == ["finished"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's finished rows")
def test_the_scheduler_moves_them_when_retention_is_due(settings):
    settings.RDBTASKS_RETENTION = None  # it moves them whether or not retention is set
    ids = finished_in_place(3)
    scheduler = Scheduler(jobs={}, declare_every=3600)
    scheduler.step()
    assert [tables_holding(pk) for pk in ids] == [["finished"]] * 3
    more = finished_in_place(1)
    scheduler.step()  # retention is not due again for a minute: nor is the mover
    assert tables_holding(more[0]) == ["task"]
