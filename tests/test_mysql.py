"""The MySQL/MariaDB dialect on an ordinary server (not Galera): skip-locked is allowed.

Its refusal on a Galera node is tested against a real cluster in
tests/test_galera.py.
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_rdbtasks.backend import bulk_enqueue
from django_rdbtasks.db import dialect_for
from django_rdbtasks.db.mysql import MySQLDialect
from django_rdbtasks.states import ClaimMode
from django_rdbtasks.worker import Worker
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def mysql_only(vendor):
    if vendor != "mysql":
        pytest.skip("the MySQL/MariaDB dialect")


def test_an_ordinary_server_is_not_galera_and_allows_every_mode():
    dialect = dialect_for(connection)
    assert isinstance(dialect, MySQLDialect)
    with connection.cursor() as cursor:
        cursor.execute("SHOW GLOBAL VARIABLES LIKE 'wsrep_on'")
        row = cursor.fetchone()
    # MariaDB has the variable (OFF without a cluster); MySQL has none.
    assert row is None or row[1] == "OFF"
    assert not dialect.is_galera()
    for mode in ClaimMode:
        assert dialect.refuses_claim_mode(mode) is None


@pytest.mark.slow
def test_a_skip_locked_worker_runs_on_an_ordinary_server(run_workers):
    bulk_enqueue(tasks.record, [((f"k{i}",), {}) for i in range(20)])
    worker = run_workers(
        "--mode", "skip-locked", "--burst", "--no-scheduler", "--poll-interval", "0.1"
    )
    assert worker.wait(timeout=60) == 0, worker.log()
    assert "refused" not in worker.log()
    assert SideEffect.objects.filter(key__startswith="k").count() == 20
    assert SideEffect.objects.values("key").distinct().count() == 20


def test_the_worker_accepts_skip_locked_in_process():
    assert Worker(mode="skip-locked", burst=True).mode == ClaimMode.SKIP_LOCKED
