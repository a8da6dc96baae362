"""PostgreSQL: finished rows move to a table of their own (db/postgresql/finished.py)."""

import datetime as dt
import threading
import time

import pytest
from django.db import IntegrityError, connection, connections, transaction

from django_rdbtasks.compat import task_backends
from django_rdbtasks.db import dialect_for, forget_what_claims_learnt
from django_rdbtasks.db.postgresql.finished import FINISHED_TABLE
from django_rdbtasks.db.rows import ClaimRequest, Outcome
from django_rdbtasks.dependencies import enqueue_after
from django_rdbtasks.models import JobRecord, Task, TaskDependency
from django_rdbtasks.retention import prune
from django_rdbtasks.snapshots import estimated_task_rows
from django_rdbtasks.states import ClaimMode, OutcomeKind, TaskStatus
from django_rdbtasks.worker import Worker
from tests.conftest import tables_holding
from tests.testapp import tasks

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="PostgreSQL's table of finished rows"
    ),
]

TASK_TABLE = Task._meta.db_table


def in_both() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM ONLY {TASK_TABLE} t JOIN ONLY {FINISHED_TABLE} f USING (id)"
        )
        return cursor.fetchone()[0]


def run_burst() -> None:
    Worker(burst=True).run(install_signals=False)


def claim(worker_id, lease=30.0):
    with transaction.atomic(), connection.cursor() as cursor:
        request = ClaimRequest(["default"], 10, worker_id, lease, ClaimMode.OPTIMISTIC)
        rows, _ = dialect_for(connection).claim(cursor, request)
        return rows


def success(row, value):
    return Outcome(row.id, row.version, OutcomeKind.SUCCESS, return_value=value, entry={})


def test_a_finished_task_moves_and_reads_as_before():
    ok = tasks.add.enqueue(2, 3)
    failed = tasks.always_fails.enqueue("no")
    run_burst()
    assert tables_holding(ok.id) == tables_holding(failed.id) == ["finished"]
    backend = task_backends["default"]
    result = backend.get_result(ok.id)
    assert result.status == "SUCCESSFUL" and result.return_value == 5
    row = Task.objects.get(pk=failed.id)
    assert row.status == TaskStatus.FAILED and row.attempts == 2
    assert [entry["outcome"] for entry in row.history] == ["RETRY", "FAILED"]
    assert Task.objects.count() == 2 and Task.objects.finished().count() == 2


def test_every_column_but_the_outcome_s_is_moved_as_it_was():
    result = tasks.add.using(priority=7, queue_name="default").enqueue(1, 1)
    [row] = claim("w")
    before = Task.objects.filter(pk=result.id).values().get()
    with transaction.atomic(), connection.cursor() as cursor:
        written = dialect_for(connection).finish(cursor, [success(row, 2)], "w")
    assert list(written) == [row.id]
    assert tables_holding(result.id) == ["finished"]
    after = Task.objects.filter(pk=result.id).values().get()
    outcome = {"status", "version", "lease_expires_at", "return_value", "finished_at", "history"}
    assert {k: v for k, v in after.items() if k not in outcome} == {
        k: v for k, v in before.items() if k not in outcome
    }
    assert (after["status"], after["version"], after["return_value"]) == ("SUCCESSFUL", 2, 2)
    assert after["lease_expires_at"] is None and after["finished_at"] >= before["started_at"]


def test_a_stale_holder_s_outcome_neither_deletes_nor_inserts():
    result = tasks.add.enqueue(1, 2)
    [old] = claim("w", lease=0.2)
    time.sleep(0.4)
    [taken] = claim("other")  # the lease ran out: "w" is stale
    with transaction.atomic(), connection.cursor() as cursor:
        dialect = dialect_for(connection)
        request = ClaimRequest(["default"], 5, "w", 30.0, ClaimMode.OPTIMISTIC)
        assert dialect.exchange(cursor, [success(old, 0)], "w", request).written == {}
    assert tables_holding(result.id) == ["task"]
    row = Task.objects.get(pk=result.id)
    assert (row.status, row.worker_id, row.version) == ("RUNNING", "other", taken.version)
    with transaction.atomic(), connection.cursor() as cursor:
        assert dialect.exchange(cursor, [success(taken, 3)], "other", None).written
    assert tables_holding(result.id) == ["finished"]
    assert Task.objects.get(pk=result.id).return_value == 3


def test_requeue_moves_a_failed_task_back_and_it_runs_and_moves_again():
    failed = tasks.fails_until.enqueue("k", 3)  # three attempts fail, the fourth succeeds
    run_burst()
    row = Task.objects.get(pk=failed.id)
    assert tables_holding(failed.id) == ["finished"] and row.status == TaskStatus.FAILED
    assert task_backends["default"].requeue(failed.id)
    assert tables_holding(failed.id) == ["task"]
    again = Task.objects.get(pk=failed.id)
    assert (again.status, again.attempts, again.version) == ("READY", 0, row.version + 1)
    assert again.history == row.history
    run_burst()
    assert tables_holding(failed.id) == ["finished"]
    assert Task.objects.get(pk=failed.id).status == TaskStatus.SUCCESSFUL
    assert in_both() == 0
    assert Task.objects.none().requeue() == Task.objects.filter(pk__in=[]).requeue() == 0


def test_a_finished_row_cannot_be_made_unfinished_where_no_claim_reads():
    """Only requeue moves a row back; any other write that would leave a READY row
    among the finished ones fails, and the row stays as it was."""
    result = tasks.add.enqueue(1, 1)
    run_burst()
    with pytest.raises(IntegrityError), transaction.atomic():
        Task.objects.filter(pk=result.id).update(status=TaskStatus.READY)
    assert tables_holding(result.id) == ["finished"]
    assert Task.objects.get(pk=result.id).status == TaskStatus.SUCCESSFUL


def test_a_parent_with_dependants_moves_and_releases_them():
    parent = tasks.step.enqueue("a")
    child = enqueue_after([parent], tasks.step, "b")
    run_burst()
    assert tables_holding(parent.id) == tables_holding(child.id) == ["finished"]
    assert Task.objects.get(pk=child.id).status == TaskStatus.SUCCESSFUL
    assert TaskDependency.objects.filter(parent_id=parent.id, child_id=child.id).exists()


def test_a_dependant_enqueued_while_its_parent_moves_sees_it_finished():
    """The enqueue flags the parent, and waits for the transaction that is moving
    it; the row it waited for is then gone from the task table, and only a new
    statement sees it among the finished ones."""
    parent = tasks.add.enqueue(1, 1)
    [row] = claim("w")
    moving, blocked, failures = threading.Event(), threading.Event(), []

    def finish_parent() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                dialect_for(connection).finish(cursor, [success(row, 2)], "w")
                moving.set()
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and not blocked.is_set():
                    cursor.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND datname = current_database()"
                    )
                    if cursor.fetchone()[0]:
                        blocked.set()
                    time.sleep(0.02)
        except Exception as exc:  # pragma: no cover - reported below
            failures.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=finish_parent)
    thread.start()
    assert moving.wait(10)
    child = enqueue_after([parent], tasks.add, 2, 2)
    thread.join(15)
    assert blocked.is_set() and not failures
    assert tables_holding(parent.id) == ["finished"]
    parent_row = Task.objects.get(pk=parent.id)
    assert parent_row.status == TaskStatus.SUCCESSFUL and parent_row.has_children
    assert Task.objects.get(pk=child.id).status == TaskStatus.READY


def test_retention_prunes_moved_rows_and_what_hangs_off_them():
    parent = tasks.step.enqueue("a")
    child = enqueue_after([parent], tasks.step, "b")
    run_burst()
    JobRecord.objects.create(job_name="j", key="k", task_id=parent.id)
    assert tables_holding(parent.id) == ["finished"]
    result = prune(dt.timedelta(0), now=dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1))
    assert result.deleted == {"SUCCESSFUL": 2}
    assert tables_holding(parent.id) == tables_holding(child.id) == []
    assert not TaskDependency.objects.exists()
    assert JobRecord.objects.get().task_id is None


def test_the_row_estimate_counts_the_finished_rows_too():
    for i in range(30):
        tasks.add.enqueue(i, i)
    run_burst()
    tasks.add.enqueue(0, 0)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {TASK_TABLE}")
        cursor.execute(f"ANALYZE {FINISHED_TABLE}")
    count = estimated_task_rows()
    assert count.estimate and count.value == 31


def test_the_table_is_made_by_the_migration_with_its_check_and_indexes():
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT inhparent::regclass::text FROM pg_inherits WHERE inhrelid = %s::regclass",
            [FINISHED_TABLE],
        )
        assert cursor.fetchall() == [(TASK_TABLE,)]
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s", [FINISHED_TABLE])
        names = {row[0] for row in cursor.fetchall()}
    assert names == {
        "rdbtasks_finishedtask_pkey",
        "rdbtasks_finishedtask_finished",
        "rdbtasks_finishedtask_failed",
        "rdbtasks_finishedtask_path",
        "rdbtasks_finishedtask_job_search",
        "rdbtasks_finishedtask_dedup_search",
    }


def test_a_column_the_model_does_not_know_is_moved_with_the_row():
    """As a worker of the release before copies a column a newer migration added,
    during a rolling deploy: the columns come from the database, not the model."""
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TASK_TABLE} ADD COLUMN newer text")
    try:
        forget_what_claims_learnt()  # as a worker started now
        result = tasks.add.enqueue(1, 1)
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {TASK_TABLE} SET newer = 'kept' WHERE id = %s", [result.id])
        run_burst()
        assert tables_holding(result.id) == ["finished"]
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT newer FROM ONLY {FINISHED_TABLE} WHERE id = %s", [result.id])
            assert cursor.fetchone() == ("kept",)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {TASK_TABLE} DROP COLUMN newer")
        forget_what_claims_learnt()
