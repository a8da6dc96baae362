"""What holds back the cleanup of the task tables, found on the real databases.

A second connection opens a transaction and takes a snapshot (as a console
left open, a report at REPEATABLE READ or ``pg_dump`` do); the report must name
it with its age, application and client, and on PostgreSQL a VACUUM run
meanwhile must leave the dead rows it holds, which the report shows too.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection

from django_rdbtasks import cleanup
from django_rdbtasks.cleanup import HolderKind, cleanup_report
from django_rdbtasks.models import Task
from tests.browser.support import make_task
from tests.conftest import held_snapshot, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def shown_sooner(monkeypatch) -> float:
    """Holders shown after a second, not five: the tests need not wait."""
    monkeypatch.setattr(cleanup, "SHOWN_AFTER", 1.0)
    return 1.0


def needs_a_server(vendor: str) -> None:
    if vendor == "sqlite":
        pytest.skip("SQLite keeps no old row versions for another connection to hold")


def flush_statistics() -> None:
    """PostgreSQL 15+ sends a session's table counts at most once a second: now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regproc('pg_stat_force_next_flush') IS NOT NULL")
        if cursor.fetchone()[0]:
            cursor.execute("SELECT pg_stat_force_next_flush()")
        else:
            time.sleep(1.5)


def test_an_open_transaction_is_reported_with_its_age_application_and_client(
    vendor, shown_sooner
) -> None:
    needs_a_server(vendor)
    with held_snapshot(application="rdbtasks-test-holder") as session:
        time.sleep(1.5)
        report = cleanup_report("default")
    [holder] = [h for h in report.holders if h.kind == HolderKind.SESSION and h.name == session]
    assert holder.state == "idle in transaction"
    assert 1.5 <= holder.age < 120
    assert report.oldest_age is not None and report.oldest_age >= holder.age
    assert holder.user == connection.settings_dict["USER"]
    if vendor == "postgresql":
        assert holder.query == "SELECT count(*) FROM django_rdbtasks_task"  # its last
        assert holder.application == "rdbtasks-test-holder"
        host, _, port = holder.client.rpartition(":")
        assert host in ("127.0.0.1", "::1") and port.isdigit()
        assert holder.xid_age is not None and holder.xid_age >= 0
    else:
        assert holder.query == ""  # idle: MySQL keeps no last statement to show
        assert holder.isolation == "REPEATABLE READ"
        assert holder.client.startswith(("localhost", "127.0.0.1"))
        assert report.history_length is not None and report.history_length >= 0

    # Once it ends, nothing holds the cleanup back. (InnoDB refreshes what
    # INNODB_TRX shows only when nobody read it for 0.1 s: polled faster, it
    # would show the ended transaction for ever.)
    def released() -> bool:
        return session not in [h.name for h in cleanup_report("default").holders]

    wait_until(released, timeout=10, interval=0.3)


def test_a_vacuum_leaves_the_dead_rows_an_open_snapshot_holds_and_says_so(vendor) -> None:
    if vendor != "postgresql":
        pytest.skip("dead rows and vacuum are PostgreSQL's (InnoDB purges its undo instead)")

    def task_table() -> cleanup.TableCleanup:
        flush_statistics()
        [found] = [t for t in cleanup_report("default").tables if t.table == Task._meta.db_table]
        return found

    with held_snapshot():
        for _ in range(20):
            make_task()
        Task.objects.all().delete()
        with connection.cursor() as cursor:
            cursor.execute("VACUUM django_rdbtasks_task")
        held = task_table()
        # Vacuumed, and the twenty dead rows are still there: the snapshot may see them.
        assert held.last_vacuum is not None and held.dead_rows >= 20, held
    with connection.cursor() as cursor:
        cursor.execute("VACUUM django_rdbtasks_task")
    freed = task_table()
    assert freed.dead_rows == 0, freed


def test_sqlite_has_nothing_to_report(vendor) -> None:
    if vendor != "sqlite":
        pytest.skip("SQLite's case")
    report = cleanup_report("default")
    assert not report.supported and report.holders == [] and report.oldest_age is None


def test_autovacuum_turned_off_is_said(vendor) -> None:
    if vendor != "postgresql":
        pytest.skip("autovacuum is PostgreSQL's")
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        server_on = cursor.fetchone()[0] == "on"
        cursor.execute("ALTER TABLE django_rdbtasks_worker SET (autovacuum_enabled = false)")
    try:
        notes = cleanup_report("default").notes
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE django_rdbtasks_worker RESET (autovacuum_enabled)")
    assert "autovacuum is off for django_rdbtasks_worker (autovacuum_enabled = false)." in notes
    assert any(note.startswith("autovacuum is off on this server") for note in notes) == (
        not server_on
    )
    assert cleanup_report("default").notes == ([] if server_on else notes[:1])
