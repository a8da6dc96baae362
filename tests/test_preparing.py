"""The enqueue's statement, prepared in the session on PostgreSQL: only it, only where safe.

Behind a real pooler: tests/test_pgbouncer.py.
"""

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

from django_rdbtasks.compat import task_backends
from django_rdbtasks.models import Task
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

ENQUEUE_CALL = "rdbtasks_enqueue_v1("


@pytest.fixture(autouse=True)
def postgresql_only(vendor):
    if vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's (psycopg 3)")
    # A new session for each test, and none left to the next: what it
    # prepared, and how, is its own.
    connection.close()
    yield
    connection.close()


def prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_a_connection_that_enqueues_once_prepares_nothing():
    tasks.add.enqueue(1, 1)
    assert prepared() == []


def test_from_the_second_enqueue_the_call_is_prepared_and_nothing_else():
    for number in range(5):
        tasks.add.enqueue(number, 1)
    (statement,) = prepared()
    assert ENQUEUE_CALL in statement
    # The project's own queries are neither counted nor prepared.
    assert connection.connection.prepare_threshold is None
    for _ in range(10):
        assert Task.objects.filter(args=[1, 1]).count() == 1
    assert prepared() == [statement]
    assert Task.objects.count() == 5


def test_a_rollback_drops_the_prepared_call_and_the_next_enqueue_prepares_it_again():
    tasks.add.enqueue(1, 1)
    tasks.add.enqueue(2, 1)
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        tasks.add.enqueue(3, 1)
        raise ZeroDivisionError
    tasks.add.enqueue(4, 1)
    assert [ENQUEUE_CALL in statement for statement in prepared()] == [True]
    assert sorted(Task.objects.values_list("args", flat=True)) == [[1, 1], [2, 1], [4, 1]]


def test_a_statement_deallocated_behind_psycopgs_back_is_run_again_unprepared():
    tasks.add.enqueue(1, 1)
    tasks.add.enqueue(2, 1)
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    tasks.add.enqueue(3, 1)  # autocommit: the failed run did nothing, run again
    tasks.add.enqueue(4, 1)
    assert prepared() == []  # and it stops preparing on this connection
    assert Task.objects.count() == 4


def test_inside_a_transaction_a_deallocated_statement_fails_the_transaction_and_loses_nothing():
    tasks.add.enqueue(1, 1)
    tasks.add.enqueue(2, 1)
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    with pytest.raises(Exception, match="does not exist"), transaction.atomic():
        tasks.add.enqueue(3, 1)
    tasks.add.enqueue(4, 1)
    assert sorted(Task.objects.values_list("args", flat=True)) == [[1, 1], [2, 1], [4, 1]]


def test_an_enqueue_inside_a_transaction_prepares_nothing_so_a_failed_one_leaves_nothing():
    # The deduplicated enqueue runs in a transaction of its own and expects a
    # unique key to fail: a run that prepared and then failed would leave the
    # statement on the server with psycopg unaware of it.
    for _ in range(5):
        tasks.sync_account.enqueue("acme")
    assert Task.objects.count() == 1
    with transaction.atomic():
        tasks.add.enqueue(1, 1)
        tasks.add.enqueue(2, 1)
    assert prepared() == []
    # Prepared outside a transaction, then used inside one.
    tasks.add.enqueue(3, 1)
    (statement,) = prepared()
    with transaction.atomic():
        tasks.add.enqueue(4, 1)
        tasks.add.enqueue(5, 1)
    assert prepared() == [statement]
    assert Task.objects.count() == 6


def test_transaction_pooling_prepares_nothing():
    default = settings.TASKS["default"]
    pooled = {**default, "OPTIONS": {**default["OPTIONS"], "TRANSACTION_POOLING": True}}
    with override_settings(TASKS={**settings.TASKS, "default": pooled}):
        assert task_backends["default"].prepare is False
        for number in range(5):
            tasks.add.enqueue(number, 1)
    assert prepared() == []
    assert Task.objects.count() == 5


def test_a_project_that_prepares_statements_itself_keeps_its_threshold():
    connection.ensure_connection()
    connection.connection.prepare_threshold = 2
    for number in range(5):
        tasks.add.enqueue(number, 1)
    assert connection.connection.prepare_threshold == 2
    assert any(ENQUEUE_CALL in statement for statement in prepared())
