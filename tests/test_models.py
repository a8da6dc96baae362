import datetime as dt
import time
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_rdbtasks.db import dialect_for
from django_rdbtasks.models import Task, task_path_in, uuid7
from django_rdbtasks.states import TaskStatus
from tests.server_rows import analyze, insert_rows

pytestmark = pytest.mark.django_db(transaction=True)


def test_uuid7_is_time_ordered():
    ids = []
    for _ in range(5):
        ids.append(uuid7())
        time.sleep(0.002)
    assert ids == sorted(ids)
    assert all(isinstance(i, uuid.UUID) and i.version == 7 for i in ids)
    assert len({uuid7() for _ in range(10_000)}) == 10_000


def test_querysets_use_the_database_clock():
    past = timezone.now() - dt.timedelta(minutes=1)
    future = timezone.now() + dt.timedelta(minutes=1)
    due = Task.objects.create(task_path="a.b", run_after=past)
    Task.objects.create(task_path="a.b", run_after=future)
    expired = Task.objects.create(
        task_path="a.b", status="RUNNING", worker_id="w", lease_expires_at=past
    )
    live = Task.objects.create(
        task_path="a.b", status="RUNNING", worker_id="w", lease_expires_at=future
    )
    done = Task.objects.create(task_path="a.b", status="SUCCESSFUL")
    assert list(Task.objects.runnable()) == [due]
    assert list(Task.objects.expired()) == [expired]
    assert set(Task.objects.claimable()) == {due, expired}
    assert set(Task.objects.held_by("w")) == {expired, live}
    assert list(Task.objects.finished()) == [done]
    assert Task.objects.ready().count() == 2


def test_db_defaults_come_from_the_database():
    row = Task.objects.create(task_path="a.b")
    row.refresh_from_db()
    assert abs(row.enqueued_at - timezone.now()) < dt.timedelta(seconds=5)
    assert row.run_after == row.enqueued_at


def _explain(sql, params):
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("EXPLAIN " + sql, params)
        elif connection.vendor == "mysql":
            cursor.execute("EXPLAIN " + sql, params)
            columns = [c[0] for c in cursor.description]
            return "\n".join(str(dict(zip(columns, row, strict=True))) for row in cursor.fetchall())
        else:
            cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        return "\n".join(str(row[-1]) for row in cursor.fetchall())


def test_finding_runnable_tasks_uses_the_index_not_a_scan():
    insert_rows(20_000, TaskStatus.SUCCESSFUL)
    insert_rows(20, TaskStatus.READY)
    analyze()
    dialect = dialect_for(connection)
    sql = dialect.candidates_sql(2)
    plan = _explain(sql, dialect.candidates_params(["default", "emails"], 40))
    assert "rdbtasks_task_ready" in plan, plan
    assert "rdbtasks_task_lease" in plan, plan
    if connection.vendor == "postgresql":
        assert "Seq Scan" not in plan, plan
    elif connection.vendor == "mysql":
        assert "'table': 'django_rdbtasks_task', 'type': 'ALL'" not in plan, plan
    else:
        assert "SCAN django_rdbtasks_task" not in plan, plan


def index_columns(name):
    """The columns of the index ``name`` (none if the database has no such index)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", [name])
        elif connection.vendor == "mysql":
            cursor.execute(
                "SELECT column_name FROM information_schema.statistics "
                "WHERE table_schema = DATABASE() AND index_name = %s ORDER BY seq_in_index",
                [name],
            )
            return [row[0].lower() for row in cursor.fetchall()]
        else:
            cursor.execute("SELECT sql FROM sqlite_master WHERE name = %s", [name])
        row = cursor.fetchone()
        return row[0] if row else None


def test_status_index_is_partial_where_possible():
    if connection.vendor == "mysql":
        # No partial indexes: a leading status column, and the READY rows
        # with and without a limit in one index each, the unlimited ones the
        # ``limit_key IS NULL`` range of the key index.
        assert index_columns("rdbtasks_task_ready") == [
            "status",
            "queue_name",
            "priority",
            "run_after",
        ]
        assert index_columns("rdbtasks_task_ready_key") == [
            "status",
            "queue_name",
            "limit_key",
            "priority",
            "run_after",
        ]
        for name in ("fresh", "deferred", "limited"):
            assert index_columns(f"rdbtasks_task_ready_{name}") == []
        return
    assert index_columns("rdbtasks_task_ready") is None  # replaced by the four below
    assert index_columns("rdbtasks_task_ready_unlimited") is None  # split in two (0014)
    fresh = index_columns("rdbtasks_task_ready_fresh")
    deferred = index_columns("rdbtasks_task_ready_deferred")
    limited = index_columns("rdbtasks_task_ready_limited")
    by_key = index_columns("rdbtasks_task_ready_key")
    if connection.vendor == "postgresql":
        ready = "((status)::text = 'READY'::text)"
        assert (
            "WHERE ((limit_key IS NULL) AND (requested_run_after IS NULL) "
            f"AND (started_at IS NULL) AND {ready})"
        ) in fresh
        assert (
            f"WHERE ((limit_key IS NULL) AND {ready} AND "
            "((requested_run_after IS NOT NULL) OR (started_at IS NOT NULL)))"
        ) in deferred
        assert f"WHERE ((limit_key IS NOT NULL) AND {ready})" in limited
        assert "(queue_name, limit_key, priority DESC, run_after)" in by_key
    for sql in (fresh, deferred, limited, by_key):
        assert "WHERE" in sql and "READY" in sql


def test_the_claims_conditions_are_its_indexes_conditions():
    """The claim's reads spell each arm as ``db/ready_arms.py`` does; the indexes are
    made from the model's conditions (``models/ready.py``, made from the same arms). A
    partial index serves only a read whose WHERE states its condition: the two must
    say the same, on rows of every arm and status."""
    from django_rdbtasks.db import ready_arms
    from django_rdbtasks.models.ready import READY_DEFERRED, READY_FRESH, READY_LIMITED

    now = timezone.now()
    for status in ("READY", "RUNNING", "WAITING", "SUCCESSFUL"):
        for requested in (None, now):
            for started in (None, now):
                for limit_key in (None, "concurrency:k"):
                    Task.objects.create(
                        task_path="tests.testapp.tasks.noop",
                        status=status,
                        requested_run_after=requested,
                        started_at=started,
                        limit_key=limit_key,
                    )
    arms = (
        (ready_arms.FRESH, READY_FRESH, 1),
        (ready_arms.DEFERRED, READY_DEFERRED, 3),
        (ready_arms.LIMITED, READY_LIMITED, 4),
    )
    every: set = set()
    with connection.cursor() as cursor:
        for arm, condition, count in arms:
            ids = set(Task.objects.filter(condition).values_list("pk", flat=True))
            cursor.execute(f"SELECT id FROM django_rdbtasks_task WHERE status = 'READY' AND {arm}")
            assert {Task._meta.pk.to_python(row[0]) for row in cursor.fetchall()} == ids
            assert len(ids) == count
            assert not ids & every  # the arms split the READY rows
            every |= ids
    assert every == set(Task.objects.filter(status="READY").values_list("pk", flat=True))


def test_the_finished_index_holds_only_finished_rows_where_it_can():
    finished = index_columns("rdbtasks_task_finished")
    if connection.vendor == "mysql":
        assert finished == ["finished_at", "status", "queue_name"]  # no partial indexes
        return
    assert "(finished_at, status, queue_name)" in finished.replace('"', "")
    assert "WHERE" in finished and "finished_at IS NOT NULL" in finished.replace('"', "")


def test_unfinished_is_every_task_not_yet_finished():
    for status in ("READY", "RUNNING", "WAITING", "SUCCESSFUL", "FAILED", "CANCELLED"):
        Task.objects.create(task_path="a.b", status=status)
    Task.objects.create(task_path="a.b", limit_key="concurrency:k", limit_count=1)
    unfinished = Task.objects.unfinished()
    assert sorted(unfinished.values_list("status", flat=True)) == [
        "READY", "READY", "RUNNING", "WAITING",
    ]  # fmt: skip
    assert set(unfinished) == set(Task.objects.exclude(status__in=TaskStatus.finished()))


def test_the_unfinished_and_the_finished_by_age_are_read_off_indexes():
    """With the finished index partial, neither read scans the table."""
    insert_rows(20_000, TaskStatus.SUCCESSFUL)
    Task.objects.bulk_create([Task(task_path="a.b", status=s) for s in ("READY", "RUNNING")])
    analyze()
    hour_ago = timezone.now() - dt.timedelta(hours=1)
    reads = {
        "unfinished": Task.objects.unfinished().order_by("-pk")[:100],
        "finished by age": Task.objects.finished().filter(finished_at__lt=hour_ago).values("pk"),
    }
    for name, queryset in reads.items():
        plan = queryset.explain()
        if connection.vendor == "postgresql":
            assert "Seq Scan" not in plan, (name, plan)
    if connection.vendor == "sqlite":  # its planner walks the pkey for the order of the first
        plan = reads["finished by age"].explain()
        assert "rdbtasks_task_finished" in plan, plan


def test_task_paths_are_the_distinct_paths_in_order_read_off_their_index():
    paths = ["b.tasks.two", "a.tasks.one", "c.tasks.three", "a.tasks.one_more"]
    Task.objects.bulk_create(
        [Task(task_path=path, status="SUCCESSFUL") for path in paths for _ in range(500)],
        batch_size=1000,
    )
    assert Task.objects.task_paths() == sorted(paths)
    # The whole table's paths, whatever the queryset's own filters.
    assert Task.objects.filter(task_path="b.tasks.two").task_paths() == sorted(paths)
    assert Task.objects.none().task_paths() == sorted(paths)


def test_task_paths_never_reads_the_table():
    for n in range(7):
        insert_rows(3_000, TaskStatus.SUCCESSFUL, task_path=f"app.tasks.t{n}")
    analyze()
    with CaptureQueriesContext(connection) as queries:
        assert len(Task.objects.task_paths()) == 7
    # One look-up per distinct path, and one that finds none after the last; where the
    # index holds only finished rows, one more read for the unfinished rows' paths.
    partial = connection.features.supports_partial_indexes
    assert len(queries.captured_queries) == 8 + partial
    plan = _explain(queries.captured_queries[3]["sql"], [])
    assert "rdbtasks_task_finished_path" in plan, plan
    if connection.vendor == "postgresql":
        assert "Seq Scan" not in plan, plan
    elif connection.vendor == "mysql":
        assert "'type': 'range'" in plan, plan
    else:
        assert "SEARCH" in plan, plan


def _one_of_each_status(path):
    return [Task(task_path=path, status=status) for status in TaskStatus]


def test_task_paths_and_task_path_in_see_rows_in_every_status():
    # Finished rows are in the path index; the unfinished ones only where the database
    # cannot leave them out, so each status has a path of its own here.
    Task.objects.bulk_create(
        [
            Task(task_path=f"app.tasks.{status.value.lower()}", status=status)
            for status in TaskStatus
        ]
        + _one_of_each_status("app.tasks.every")
        + [Task(task_path="app.tasks.limited", status=TaskStatus.READY, limit_key="k")]
    )
    expected = sorted(
        {f"app.tasks.{status.value.lower()}" for status in TaskStatus}
        | {"app.tasks.every", "app.tasks.limited"}
    )
    assert Task.objects.task_paths() == expected
    for status in TaskStatus:
        path = f"app.tasks.{status.value.lower()}"
        assert list(Task.objects.filter(task_path_in([path])).values_list("status", flat=True)) == [
            status
        ]
    every = Task.objects.filter(task_path_in(["app.tasks.every", "app.tasks.limited"]))
    assert sorted(every.values_list("status", flat=True)) == sorted([*TaskStatus, TaskStatus.READY])
    assert not Task.objects.filter(task_path_in(["app.tasks.none"])).exists()


def test_task_path_in_reads_indexes_not_the_table():
    # Mostly finished rows and a backlog, as a busy table holds.
    for n in range(7):
        insert_rows(3_000, TaskStatus.SUCCESSFUL, task_path=f"app.tasks.t{n}")
        insert_rows(70, TaskStatus.READY, task_path=f"app.tasks.t{n}")
    Task.objects.bulk_create(_one_of_each_status("app.tasks.rare"))
    analyze()
    rare = Task.objects.filter(task_path_in(["app.tasks.rare"]))
    assert rare.count() == len(TaskStatus)
    plan = rare.explain()
    if connection.vendor == "postgresql":
        assert "Seq Scan" not in plan, plan
        assert "rdbtasks_task_finished_path" in plan, plan
    elif connection.vendor == "mysql":
        assert "rdbtasks_task_finished_path" in plan, plan
    # SQLite (for development) may scan: its OR needs a key in every arm.
