"""The enqueue's statement, prepared in the session on PostgreSQL: only it, only where safe.

Behind a real pooler: tests/test_pgbouncer.py.
"""

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

from django_rdbtasks.backend import bulk_enqueue
from django_rdbtasks.compat import task_backends
from django_rdbtasks.models import Task
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

#: The single enqueue's statement, as the server holds it once prepared.
ENQUEUE_STATEMENT = 'INSERT INTO "django_rdbtasks_task"'


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


def test_from_the_second_enqueue_the_insert_is_prepared_and_nothing_else():
    for number in range(5):
        tasks.add.enqueue(number, 1)
    (statement,) = prepared()
    assert ENQUEUE_STATEMENT in statement
    # The project's own queries are neither counted nor prepared.
    assert connection.connection.prepare_threshold is None
    for _ in range(10):
        assert Task.objects.filter(args=[1, 1]).count() == 1
    assert prepared() == [statement]
    assert Task.objects.count() == 5


def test_a_rollback_drops_the_prepared_insert_and_its_second_run_after_prepares_it_again():
    tasks.add.enqueue(1, 1)
    tasks.add.enqueue(2, 1)
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        tasks.add.enqueue(3, 1)
        raise ZeroDivisionError
    assert prepared() == []
    tasks.add.enqueue(4, 1)
    tasks.add.enqueue(5, 1)
    assert [ENQUEUE_STATEMENT in statement for statement in prepared()] == [True]
    assert sorted(Task.objects.values_list("args", flat=True)) == [[1, 1], [2, 1], [4, 1], [5, 1]]


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


def test_inside_a_transaction_the_insert_is_prepared_from_its_second_run():
    # A project that enqueues only inside transactions (ATOMIC_REQUESTS, a
    # task that enqueues) gets the prepared INSERT too.
    with transaction.atomic():
        tasks.add.enqueue(1, 1)
        assert prepared() == []
        tasks.add.enqueue(2, 1)
        (statement,) = prepared()
        tasks.add.enqueue(3, 1)
    assert ENQUEUE_STATEMENT in statement
    assert prepared() == [statement]
    assert Task.objects.count() == 3


def enqueue_inserts() -> list[str]:
    return [statement for statement in prepared() if ENQUEUE_STATEMENT in statement]


def test_a_preparing_run_that_fails_leaves_no_statement_psycopg_does_not_know():
    # A deduplicated enqueue expects its key to fail: a run that prepared the
    # call and then failed must leave psycopg knowing the statement the server
    # holds, not prepare another at every failure (psycopg prepares only a
    # statement it has counted a good run of). Inside a transaction, each
    # failure rolls back to a savepoint, which keeps prepared statements.
    with transaction.atomic():
        for _ in range(5):
            tasks.sync_account.enqueue("acme")
        assert len(enqueue_inserts()) == 1, prepared()
    # Each in a transaction of its own: a failure rolls it back, and psycopg
    # deallocates all it prepared.
    for _ in range(5):
        tasks.sync_account.enqueue("acme")
    assert len(enqueue_inserts()) <= 1, prepared()
    for number in range(3):  # in and out of transactions, one statement
        tasks.add.enqueue(number, 1)
        with transaction.atomic():
            tasks.add.enqueue(number, 2)
    assert len(enqueue_inserts()) == 1, prepared()
    assert Task.objects.count() == 7


def test_of_the_statements_the_enqueues_cursor_runs_only_the_single_enqueues_is_prepared():
    # A bulk enqueue's (COPY, and the read of its clock) and a limit's run
    # on the same cursor, always inside a transaction: never prepared.
    for _ in range(3):
        bulk_enqueue(tasks.add, [((1, 1), {})] * 3)
        bulk_enqueue(tasks.rated, [((1,), {})] * 2)
    tasks.add.enqueue(1, 1)
    tasks.add.enqueue(2, 1)
    assert len(prepared()) == 1 and enqueue_inserts() == prepared(), prepared()
    assert Task.objects.count() == 17


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
    assert any(ENQUEUE_STATEMENT in statement for statement in prepared())
