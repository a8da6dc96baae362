"""The task table's indexes rebuilt once a held-back cleanup grew them (PostgreSQL)."""

import time

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections

from django_rdbtasks import index_rebuild
from django_rdbtasks.backend import bulk_enqueue
from django_rdbtasks.models import Task
from tests.conftest import wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.usefixtures("transactional_db")
TABLE = Task._meta.db_table
#: A test table's clean indexes are a page or two each: beyond this, grown.
SLACK = 256 * 1024


@pytest.fixture(autouse=True)
def postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("REINDEX CONCURRENTLY is PostgreSQL's")


def raw_connection() -> psycopg.Connection:
    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True)


def index_bytes() -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_relation_size(c.oid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass",
            [TABLE],
        )
        return dict(cursor.fetchall())


def release(pin: psycopg.Connection) -> None:
    """End the pin, and wait until its server process is gone: until then the
    server still lists its transaction (a rebuild would see it held)."""
    pid = pin.info.backend_pid
    pin.close()

    def gone() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            return cursor.fetchone()[0] == 0

    wait_until(gone, timeout=30)


def churn_under_a_pin(rows: int) -> psycopg.Connection:
    """``rows`` tasks enqueued and deleted while another session holds a snapshot
    and an xid (what a long report or ``pg_dump`` does): the dead entries stay
    in the indexes. The pin is returned, still held."""
    pin = raw_connection()
    pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    pin.execute("SELECT txid_current()")
    pin.execute(f"SELECT count(*) FROM {TABLE}")
    for _ in range(rows // 5000):
        bulk_enqueue(tasks.noop, [((), {})] * 5000)
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM ONLY {TABLE}")
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM {TABLE}")
        cursor.execute(f"ANALYZE {TABLE}")
    return pin


def rebuilder() -> index_rebuild.IndexRebuilder:
    return index_rebuild.IndexRebuilder("default", slack=SLACK, quiet_for=1.0)


def test_indexes_a_pin_grew_are_rebuilt_once_it_ends_and_not_before():
    indexes = rebuilder()
    pin = churn_under_a_pin(40_000)
    try:
        grown = index_bytes()
        pkey = f"{TABLE}_pkey"
        assert grown[pkey] > 1_000_000, grown  # 40,000 dead entries the pin keeps
        assert [name for name, _ in index_rebuild.grown_indexes("default", slack=SLACK)]
        time.sleep(1.1)
        # Held: a rebuild would wait for the pin and keep its dead entries.
        assert indexes.step() == []
        assert indexes.pin_seen
    finally:
        release(pin)
    rebuilt = indexes.step()
    assert pkey in rebuilt, rebuilt
    after = index_bytes()
    assert after[pkey] < grown[pkey] / 20, (grown, after)
    # Every index still there, valid, and used: the table reads as before.
    assert set(after) == set(grown)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_index WHERE indrelid = %s::regclass AND NOT indisvalid",
            [TABLE],
        )
        assert cursor.fetchone()[0] == 0
    task = tasks.noop.enqueue()
    assert Task.objects.get(id=task.id).status == "READY"
    # Nothing grown now, no pin since: the next step rebuilds nothing.
    assert not indexes.pin_seen and indexes.step() == []


def test_indexes_grown_by_the_churn_between_vacuums_are_left_to_vacuum():
    """Without a pin, a busy queue's indexes hold the dead entries of the tasks
    since the last vacuum; their pages are reused, and a rebuild would only
    see them grow back (its lock cancelling an autovacuum meanwhile)."""
    indexes = rebuilder()
    release(churn_under_a_pin(20_000))  # held for no longer than the churn
    assert index_rebuild.grown_indexes("default", slack=SLACK)
    assert indexes.step() == [] and not indexes.pin_seen


def test_the_default_slack_spares_a_small_table():
    bulk_enqueue(tasks.noop, [((), {})] * 2000)
    assert index_rebuild.grown_indexes("default") == []


def test_an_invalid_index_a_failed_rebuild_left_is_dropped():
    """A ``REINDEX ... CONCURRENTLY`` that fails part way leaves its new index,
    invalid, which every write still maintains. Made here as a failed
    concurrent build under that name leaves one."""
    tasks.noop.enqueue()
    tasks.noop.enqueue()
    leftover = "rdbtasks_task_queue_ccnew"
    with connection.cursor() as cursor:
        with pytest.raises(Exception, match="could not create unique index"):
            cursor.execute(f"CREATE UNIQUE INDEX CONCURRENTLY {leftover} ON {TABLE} (queue_name)")
    assert leftover in index_bytes()
    assert index_rebuild.drop_leftovers("default") == [leftover]
    assert leftover not in index_bytes()


def test_the_command_lists_and_rebuilds_the_grown_indexes(capsys, monkeypatch):
    """``rdbtasks rebuild-indexes``: an operator's rebuild, whatever the scheduler saw;
    refused while a transaction holds back the cleanup."""
    pin = churn_under_a_pin(40_000)
    pkey = f"{TABLE}_pkey"
    try:
        call_command("rdbtasks", "rebuild-indexes", "--dry-run")
        assert pkey in capsys.readouterr().out
        time.sleep(1.1)
        monkeypatch.setattr(index_rebuild, "QUIET_FOR", 1.0)
        with pytest.raises(CommandError, match="holds back the cleanup"):
            call_command("rdbtasks", "rebuild-indexes")
    finally:
        release(pin)
    before = index_bytes()[pkey]
    call_command("rdbtasks", "rebuild-indexes")
    assert f"rebuilt {pkey}" in capsys.readouterr().out
    assert index_bytes()[pkey] < before / 20
    call_command("rdbtasks", "rebuild-indexes")
    assert "No index" in capsys.readouterr().out
