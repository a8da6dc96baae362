"""Migrations that do more than Django's own operations: 0006 and 0013, the task path's
index; 0007, the lease index per queue; 0011, the dedup key's; 0014, the READY rows
without a limit in two indexes; 0015, the table of finished rows; both ways."""

import datetime as dt

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from django_rdbtasks.db import ready_arms
from django_rdbtasks.models import Task

pytestmark = pytest.mark.django_db(transaction=True)

APP = "django_rdbtasks"
BEFORE = (APP, "0005_enqueue_function")
AFTER = (APP, "0006_task_path_btree")


def migrate(target: tuple[str, str] | None = None) -> None:
    """To ``target``; None: to the app's latest migration (what every other test expects,
    worker processes included: they wait while a migration is unapplied)."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    if target is None:
        [target] = executor.loader.graph.leaf_nodes(APP)
    executor.migrate([target])


def indexes() -> dict[str, str]:
    """The task table's indexes on task_path, by name: their definition (or columns)."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "django_rdbtasks_task")
    return {
        name: str(info.get("type") or "")
        for name, info in constraints.items()
        if info["index"] and info["columns"] == ["task_path"]
    }


@pytest.fixture
def at_0005():
    migrate(BEFORE)
    try:
        yield
    finally:
        migrate()


def lease_index_columns() -> list[str]:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "django_rdbtasks_task")
    return constraints["rdbtasks_task_lease"]["columns"]


def test_0007_puts_the_queue_first_in_the_lease_index_and_back(vendor):
    prefix = ["status"] if vendor == "mysql" else []
    try:
        assert lease_index_columns() == [*prefix, "queue_name", "lease_expires_at"]
        migrate(AFTER)
        assert lease_index_columns() == [*prefix, "lease_expires_at"]
    finally:
        migrate()
    assert lease_index_columns() == [*prefix, "queue_name", "lease_expires_at"]


def test_0006_replaces_the_trigram_index_by_a_btree_and_back(at_0005, vendor):
    before = indexes()
    assert set(before) == {"rdbtasks_task_path_search"}
    if vendor == "postgresql":
        assert before["rdbtasks_task_path_search"] == "gin"
    migrate(AFTER)
    after = indexes()
    assert set(after) == {"rdbtasks_task_path"}
    assert after["rdbtasks_task_path"] in {"btree", "idx", ""}, after
    migrate(BEFORE)
    assert indexes() == before


def test_0006_keeps_a_btree_built_beforehand_and_rebuilds_an_invalid_one(at_0005, vendor):
    if vendor != "postgresql":
        pytest.skip("CREATE INDEX CONCURRENTLY is PostgreSQL's")
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE INDEX CONCURRENTLY rdbtasks_task_path ON django_rdbtasks_task (task_path)"
        )
        cursor.execute("SELECT 'rdbtasks_task_path'::regclass::oid")
        index_oid = cursor.fetchone()[0]
    migrate(AFTER)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'rdbtasks_task_path'::regclass::oid")
        assert cursor.fetchone()[0] == index_oid  # the one built by hand, kept
    assert set(indexes()) == {"rdbtasks_task_path"}

    # A concurrent build that failed leaves an invalid index behind.
    migrate(BEFORE)
    with connection.cursor() as cursor:
        cursor.execute("CREATE INDEX rdbtasks_task_path ON django_rdbtasks_task (task_path)")
        cursor.execute(
            "UPDATE pg_index SET indisvalid = false "
            "WHERE indexrelid = 'rdbtasks_task_path'::regclass"
        )
    migrate(AFTER)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'rdbtasks_task_path'::regclass"
        )
        assert cursor.fetchone()[0] is True


PATH_0012 = (APP, "0012_finished_index_partial")
PATH_0013 = (APP, "0013_task_path_finished_only")
FINISHED_PATH = "rdbtasks_task_finished_path"


def path_index_definition(name: str) -> str:
    """PostgreSQL and SQLite: the index's SQL; MySQL and MariaDB: its columns."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", [name])
        elif connection.vendor == "sqlite":
            cursor.execute("SELECT sql FROM sqlite_master WHERE name = %s", [name])
        else:
            cursor.execute(
                "SELECT GROUP_CONCAT(column_name) FROM information_schema.statistics "
                "WHERE table_schema = DATABASE() AND index_name = %s",
                [name],
            )
        row = cursor.fetchone()
    return str(row[0]) if row and row[0] is not None else ""


def test_0013_keeps_only_finished_rows_in_the_path_index_where_it_can_and_back(vendor):
    try:
        migrate(PATH_0012)
        assert set(indexes()) == {"rdbtasks_task_path"}
        migrate(PATH_0013)
        assert set(indexes()) == {FINISHED_PATH}
        definition = path_index_definition(FINISHED_PATH)
        if vendor == "mysql":
            # No partial indexes: the same index over every row, renamed.
            assert definition == "task_path", definition
        else:
            assert "WHERE" in definition, definition
            for status in ("'SUCCESSFUL'", "'FAILED'", "'CANCELLED'"):
                assert status in definition, definition
            for status in ("'READY'", "'RUNNING'", "'WAITING'"):
                assert status not in definition, definition
        migrate(PATH_0012)
        assert set(indexes()) == {"rdbtasks_task_path"}
        assert "WHERE" not in path_index_definition("rdbtasks_task_path")
    finally:
        migrate()


def test_0013_keeps_an_index_built_beforehand_and_rebuilds_an_invalid_one(vendor):
    if vendor != "postgresql":
        pytest.skip("CREATE INDEX CONCURRENTLY is PostgreSQL's")
    build = (
        f"CREATE INDEX CONCURRENTLY {FINISHED_PATH} ON django_rdbtasks_task (task_path) "
        "WHERE status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')"
    )
    try:
        migrate(PATH_0012)
        with connection.cursor() as cursor:
            cursor.execute(build)
            cursor.execute(f"SELECT '{FINISHED_PATH}'::regclass::oid")
            index_oid = cursor.fetchone()[0]
        migrate(PATH_0013)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT '{FINISHED_PATH}'::regclass::oid")
            assert cursor.fetchone()[0] == index_oid  # the one built by hand, kept
        assert set(indexes()) == {FINISHED_PATH}

        # One built by hand without the condition is built again, with it.
        migrate(PATH_0012)
        with connection.cursor() as cursor:
            cursor.execute(build.split(" WHERE")[0])
        migrate(PATH_0013)
        assert "WHERE" in path_index_definition(FINISHED_PATH)

        # A concurrent build that failed leaves an invalid index behind.
        migrate(PATH_0012)
        with connection.cursor() as cursor:
            cursor.execute(build.replace(" CONCURRENTLY", ""))
            cursor.execute(
                "UPDATE pg_index SET indisvalid = false "
                f"WHERE indexrelid = '{FINISHED_PATH}'::regclass"
            )
        migrate(PATH_0013)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT indisvalid FROM pg_index WHERE indexrelid = '{FINISHED_PATH}'::regclass"
            )
            assert cursor.fetchone()[0] is True
    finally:
        migrate()


def one_active_definition() -> str:
    """How the dedup key's unique index is defined: its SQL where the database says."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = %s", [ONE_ACTIVE])
        elif connection.vendor == "sqlite":
            # An index of its own, or a constraint in the table's definition.
            cursor.execute(
                "SELECT sql FROM sqlite_master WHERE name = %s UNION ALL SELECT "
                "substr(sql, instr(sql, %s)) FROM sqlite_master WHERE name = %s",
                [ONE_ACTIVE, f'CONSTRAINT "{ONE_ACTIVE}"', "django_rdbtasks_task"],
            )
        else:
            cursor.execute(
                "SELECT GROUP_CONCAT(column_name), MIN(non_unique) FROM information_schema"
                ".statistics WHERE table_schema = DATABASE() AND index_name = %s",
                [ONE_ACTIVE],
            )
        row = cursor.fetchone()
    return " ".join(str(value) for value in row)


ONE_ACTIVE = "rdbtasks_task_one_active"


def test_0011_leaves_rows_without_a_dedup_key_out_of_its_unique_index_and_back(vendor):
    """PostgreSQL and SQLite: partial (no entry for a task without a key); MySQL and
    MariaDB: the same plain unique index as before. Back to 0010: plain everywhere."""
    try:
        now = one_active_definition()
        if vendor == "mysql":
            assert now == "active_dedup_key 0"
        else:
            assert "UNIQUE" in now.upper() and "WHERE" in now.upper()
            assert "active_dedup_key IS NOT NULL" in now.replace('"', "")
        migrate((APP, "0010_limit_indexes"))
        before = one_active_definition()
        assert "WHERE" not in before.upper()
        if vendor == "mysql":
            assert before == now
    finally:
        migrate()
    assert one_active_definition() == now


READY_0013 = (APP, "0013_task_path_finished_only")
UNLIMITED, FRESH, DEFERRED = (
    "rdbtasks_task_ready_unlimited",
    "rdbtasks_task_ready_fresh",
    "rdbtasks_task_ready_deferred",
)


def test_0014_splits_the_ready_rows_without_a_limit_in_two_indexes_and_back(vendor):
    """PostgreSQL and SQLite: the READY rows without a limit, one index, become two
    (fresh, deferred), built over the rows already there; back to 0013: one again.
    MySQL and MariaDB: no partial indexes, nothing changes."""
    from django.utils import timezone

    from tests.testapp import tasks

    try:
        migrate(READY_0013)
        fresh = tasks.add.enqueue(1, 1)
        later = tasks.add.using(run_after=timezone.now() + dt.timedelta(hours=1)).enqueue(2, 2)
        assert path_index_definition(FRESH) == path_index_definition(DEFERRED) == ""
        if vendor != "mysql":
            assert "limit_key IS NULL" in path_index_definition(UNLIMITED).replace('"', "")
        migrate((APP, "0014_ready_fresh_and_deferred"))
        assert path_index_definition(UNLIMITED) == ""
        if vendor == "mysql":
            assert path_index_definition(FRESH) == path_index_definition(DEFERRED) == ""
        else:
            for name in (FRESH, DEFERRED):
                definition = path_index_definition(name).replace('"', "")
                assert "WHERE" in definition and "requested_run_after" in definition, definition
            if vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT bool_and(indisvalid) FROM pg_index WHERE indexrelid "
                        "IN (%s::regclass, %s::regclass)",
                        [FRESH, DEFERRED],
                    )
                    assert cursor.fetchone()[0] is True
        # The rows enqueued before are read off the new indexes.
        with connection.cursor() as cursor:
            for arm, expected in ((ready_arms.FRESH, fresh.id), (ready_arms.DEFERRED, later.id)):
                cursor.execute(
                    f"SELECT id FROM django_rdbtasks_task WHERE status = 'READY' AND {arm}"
                )
                assert [str(Task._meta.pk.to_python(row[0])) for row in cursor.fetchall()] == [
                    expected
                ]
        migrate(READY_0013)
        assert path_index_definition(FRESH) == path_index_definition(DEFERRED) == ""
        if vendor != "mysql":
            assert "limit_key IS NULL" in path_index_definition(UNLIMITED).replace('"', "")
    finally:
        migrate()


def foreign_keys_to_tasks() -> set[tuple[str, str]]:
    """(table, column) of every database constraint that refers to the task table."""
    found = set()
    with connection.cursor() as cursor:
        for table in (
            "django_rdbtasks_taskdependency",
            "django_rdbtasks_jobrecord",
            "django_rdbtasks_workflowstep",
        ):
            for info in connection.introspection.get_constraints(cursor, table).values():
                if info["foreign_key"] and info["foreign_key"][0] == "django_rdbtasks_task":
                    found.update((table, column) for column in info["columns"])
    return found


def test_0015_makes_the_finished_rows_table_and_drops_the_constraints_and_back(vendor):
    """Forward over rows finished before: they stay where they are, and read as before.
    Back to 0014: the moved rows return to the task table and the constraints come back."""
    from django.utils import timezone

    from django_rdbtasks.compat import task_backends
    from django_rdbtasks.db import dialect_for, forget_what_claims_learnt
    from django_rdbtasks.db.postgresql.finished import FINISHED_TABLE
    from django_rdbtasks.dependencies import enqueue_after
    from django_rdbtasks.worker import Worker
    from django_rdbtasks.worker.connection import open_in_thread, worker_alias
    from tests.testapp import tasks

    def finished_table_rows() -> int | None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [FINISHED_TABLE])
            if not cursor.fetchone()[0]:
                return None
            cursor.execute(f"SELECT count(*) FROM ONLY {FINISHED_TABLE}")
            return cursor.fetchone()[0]

    pg = vendor == "postgresql"
    try:
        migrate((APP, "0014_ready_fresh_and_deferred"))
        assert len(foreign_keys_to_tasks()) == 5
        if pg:
            assert finished_table_rows() is None
        # Finished as a worker of that release left it: today's worker reads the
        # paused queues of 0016, a table 0014 does not have (runworkers waits for
        # every migration; the supervisor's _wait_for_tables).
        old = tasks.add.enqueue(1, 1)
        Task.objects.filter(pk=old.id).update(
            status="SUCCESSFUL", attempts=1, return_value=2, finished_at=timezone.now()
        )
        if pg:  # a worker started now asks once whether finished rows move: not yet
            worker_connection = open_in_thread(worker_alias("default", 30.0))
            with worker_connection.cursor() as cursor:
                assert dialect_for(worker_connection).finished.moves(cursor) is False
        migrate()
        assert foreign_keys_to_tasks() == set()
        assert Task.objects.get(pk=old.id).status == "SUCCESSFUL"
        # A worker that began before the migration (it asked once, and the table
        # was not there) finishes in place; its rows read as any other.
        in_place = tasks.add.enqueue(2, 2)
        Worker(burst=True).run(install_signals=False)
        assert task_backends["default"].get_result(in_place.id).return_value == 4
        if pg:
            assert finished_table_rows() == 0
        forget_what_claims_learnt()  # as a worker started now
        parent = tasks.step.enqueue("a")
        enqueue_after([parent], tasks.step, "b")
        Worker(burst=True).run(install_signals=False)
        assert Task.objects.filter(status="SUCCESSFUL").count() == 4
        if pg:
            assert finished_table_rows() == 2  # the rows finished before stayed
        migrate((APP, "0014_ready_fresh_and_deferred"))
        if pg:
            assert finished_table_rows() is None
        assert Task.objects.filter(status="SUCCESSFUL").count() == 4
        assert len(foreign_keys_to_tasks()) == 5
    finally:
        migrate()
    assert foreign_keys_to_tasks() == set()
