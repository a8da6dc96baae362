"""The worker's own sessions are bounded; the connection a task uses is left alone."""

import threading
import time

import pytest
from django.conf import settings
from django.db import DatabaseError, connection

from django_rdbtasks.models import Task
from django_rdbtasks.worker.connection import (
    close_in_thread,
    open_in_thread,
    worker_alias,
    worker_transaction,
)
from tests.conftest import in_new_thread

pytestmark = pytest.mark.django_db(transaction=True)

#: The suite also runs through PgBouncer in transaction mode (tests/test_pgbouncer.py).
POOLED = bool(settings.TASKS["default"]["OPTIONS"].get("TRANSACTION_POOLING"))


def setting(wrapper, vendor, name):
    with wrapper.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(f"SHOW {name}")
        else:
            cursor.execute(f"SELECT @@SESSION.{name}")
        return cursor.fetchone()[0]


def test_a_frozen_worker_session_is_ended_by_the_server_within_half_its_lease(vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite has no server session to bound")
    alias = worker_alias("default", lease=2.0, pooled=POOLED)

    def frozen_in_a_transaction():
        wrapper = open_in_thread(alias)
        try:
            with worker_transaction(alias):
                with wrapper.cursor() as cursor:  # a transaction that has touched a table
                    cursor.execute(f"SELECT count(*) FROM {Task._meta.db_table}")
                time.sleep(2.5)  # frozen past half the lease, inside the transaction
                with wrapper.cursor() as cursor:
                    cursor.execute("SELECT 1")
            return "still open"
        except DatabaseError as exc:
            return f"ended: {exc}"
        finally:
            close_in_thread(alias)

    assert in_new_thread(frozen_in_a_transaction).startswith("ended")


def test_a_worker_statement_on_a_slow_server_ends_within_half_its_lease(vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite has no server session to bound")
    alias = worker_alias("default", lease=2.0, pooled=POOLED)

    def slow_statement():
        wrapper = open_in_thread(alias)
        if vendor == "mysql" and not wrapper.mysql_is_mariadb:
            pytest.skip("MySQL bounds only SELECTs; its client read timeout bounds the rest")
        sleep = "SELECT pg_sleep(3)" if vendor == "postgresql" else "SELECT SLEEP(3)"
        try:
            with worker_transaction(alias), wrapper.cursor() as cursor:
                cursor.execute(sleep)
                return f"returned {cursor.fetchone()}"
        except DatabaseError as exc:
            return f"ended: {exc}"
        finally:
            close_in_thread(alias)

    ended = in_new_thread(slow_statement)
    assert ended.strip() in {  # the server cut it short
        "ended: canceling statement due to statement timeout",
        "ended: (1969, 'Query execution was interrupted (max_statement_time exceeded)')",
    }, ended


def test_worker_sessions_never_wait_long_on_a_lock_and_task_sessions_are_untouched(vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite has no server session to bound")
    alias = worker_alias("default", lease=30.0, pooled=POOLED)

    def bounds():
        try:
            wrapper = open_in_thread(alias)
            # The worker's transactions; behind a pooler the bounds exist only in them.
            with worker_transaction(alias):
                if vendor == "postgresql":
                    return {
                        name: setting(wrapper, vendor, name)
                        for name in (
                            "idle_in_transaction_session_timeout",
                            "lock_timeout",
                            "statement_timeout",
                            "jit",
                        )
                    }
                names = ["innodb_lock_wait_timeout"]
                if wrapper.mysql_is_mariadb:
                    names += ["idle_transaction_timeout", "max_statement_time"]
                return {name: setting(wrapper, vendor, name) for name in names}
        finally:
            close_in_thread(alias)

    found = in_new_thread(bounds)
    if vendor == "postgresql":
        assert found == {
            "idle_in_transaction_session_timeout": "15s",
            "lock_timeout": "5s",
            "statement_timeout": "15s",
            # Never JIT-compiled: its rounds are short, their cost estimates need not be.
            "jit": "off",
        }
        assert setting(connection, vendor, "idle_in_transaction_session_timeout") == "0"
        assert setting(connection, vendor, "statement_timeout") == "0"
    else:
        assert int(found["innodb_lock_wait_timeout"]) == 7
        if "idle_transaction_timeout" in found:
            assert int(found["idle_transaction_timeout"]) == 15
            assert float(found["max_statement_time"]) == 15
            assert float(setting(connection, vendor, "max_statement_time")) == 0
        assert int(setting(connection, vendor, "innodb_lock_wait_timeout")) != 7


def test_task_connections_get_the_worker_bounds_except_those_the_settings_set(vendor):
    from django.db import connections

    from django_rdbtasks.db import dialect_for
    from django_rdbtasks.worker.connection import bound_user_connections

    options = connections["default"].settings_dict.setdefault("OPTIONS", {})
    saved = dict(options)
    own = {"postgresql": "keepalives_idle", "mysql": "connect_timeout"}.get(vendor)
    try:
        # As the settings say, without what an earlier worker in this process added.
        options.clear()
        added = set(dialect_for(connections["default"]).connection_options(6.0))
        options.update({k: v for k, v in saved.items() if k not in added})
        before = dict(options)
        if own is not None:
            options[own] = 77
        changed = bound_user_connections(6.0)
        if vendor == "sqlite":
            assert changed == [] and options == before
            return
        assert "default" in changed
        assert options[own] == 77  # the settings' own value is kept
        if vendor == "postgresql":
            assert options["tcp_user_timeout"] == 5000 and options["keepalives"] == 1
            assert options["connect_timeout"] == 2
        else:
            # A task's query may run long: no read timeout of the worker's.
            assert options["write_timeout"] == 2 and "read_timeout" not in options
    finally:
        options.clear()
        options.update(saved)


@pytest.mark.slow
def test_a_task_body_in_a_worker_process_gets_bounded_connections(vendor, run_workers):
    from tests.testapp import tasks

    result = tasks.connection_options.enqueue()
    workers = run_workers("--burst", "--lease", "6")
    assert workers.wait(timeout=60) == 0, workers.log()
    result.refresh()
    options = result.return_value
    if vendor == "postgresql":
        assert options["tcp_user_timeout"] == "5000" and options["keepalives"] == "1"
        assert options["connect_timeout"] == "2"
    elif vendor == "mysql":
        assert options["write_timeout"] == "2" and "read_timeout" not in options
    else:
        assert not {"connect_timeout", "tcp_user_timeout"} & set(options)


def test_a_worker_session_is_named_after_its_thread_and_process(vendor):
    """``pg_stat_activity`` tells an operator which worker process and which of its
    threads a session is; a name the settings give is kept in front."""
    import os

    from django.db import connections

    if vendor != "postgresql":
        pytest.skip("PostgreSQL shows sessions by application_name")
    alias = worker_alias("default", lease=30.0, pooled=POOLED)
    options = connections["default"].settings_dict.setdefault("OPTIONS", {})
    saved = dict(options)

    def named(thread_name):
        def shown():
            try:
                return setting(open_in_thread(alias), vendor, "application_name")
            finally:
                close_in_thread(alias)

        found = {}
        thread = threading.Thread(target=lambda: found.update(name=shown()), name=thread_name)
        thread.start()
        thread.join(60)
        return found["name"]

    pid = os.getpid()
    try:
        options.pop("application_name", None)
        assert named("rdbtasks-lane-3") == f"rdbtasks-lane-3 pid {pid}"
        assert named("helper") == f"rdbtasks helper pid {pid}"
        options["application_name"] = "shop"
        assert named("rdbtasks-keeper") == f"shop rdbtasks-keeper pid {pid}"
        # The server keeps 63 bytes of a name: the project's comes first, and the
        # role is cut rather than the connection refused.
        options["application_name"] = "a-long-project-name-" * 3
        assert named("rdbtasks-lane-3") == "a-long-project-name-" * 3 + " rd"
    finally:
        options.clear()
        options.update(saved)


@pytest.mark.slow
def test_a_running_worker_process_names_each_of_its_sessions(vendor, run_workers):
    """A worker process's lanes, lease keeper and listener, each by name and the
    process's pid, as an operator reads them in ``pg_stat_activity``."""
    if vendor != "postgresql":
        pytest.skip("PostgreSQL shows sessions by application_name")
    if POOLED:
        pytest.skip("behind a pooler a server session carries a client's name only while lent")
    from django_rdbtasks.models import Worker

    workers = run_workers("--processes", "1", "--threads", "2")
    deadline = time.monotonic() + 60
    names: set[str] = set()
    pids: set[int] = set()
    while time.monotonic() < deadline:
        pids = set(Worker.objects.filter(stopped_at__isnull=True).values_list("pid", flat=True))
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT application_name FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name LIKE 'rdbtasks%%'"
            )
            names = {row[0] for row in cursor.fetchall()}
        wanted = {
            f"rdbtasks-{role} pid {pid}"
            for pid in pids
            for role in ("lane-0", "lane-1", "keeper", "listener")
        }
        if pids and wanted <= names:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"sessions {sorted(names)} for worker pids {pids}: {workers.log()}")
    assert workers.process.poll() is None, workers.log()
