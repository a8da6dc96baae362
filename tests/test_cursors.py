"""The enqueue's kept cursor: one driver cursor per connection, wrapped as Django wraps any."""

import threading

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from django_rdbtasks.backend import bulk_enqueue
from django_rdbtasks.compat import task_backends
from django_rdbtasks.db import dialect_for
from django_rdbtasks.db.cursors import kept_cursor
from django_rdbtasks.db.rows import new_ids
from django_rdbtasks.models import Task
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def is_enqueue(sql: str) -> bool:
    return "rdbtasks_enqueue_v2(" in sql or "INSERT INTO" in sql


def enqueue_cursors(count: int) -> list:
    """The driver cursors that ``count`` enqueues ran their statement on."""
    seen = []

    def wrapper(execute, sql, params, many, context):
        if is_enqueue(sql):
            seen.append(context["cursor"].cursor)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        for number in range(count):
            tasks.add.enqueue(number, 1)
    assert len(seen) == count
    return seen


def test_consecutive_enqueues_share_one_driver_cursor_until_django_reconnects():
    first, second = enqueue_cursors(2)
    assert first is second
    connection.close()
    (after_reconnect,) = enqueue_cursors(1)
    assert after_reconnect is not first
    assert Task.objects.count() == 3


def test_each_thread_enqueues_through_a_cursor_of_its_own_connection():
    (mine,) = enqueue_cursors(1)
    theirs = []

    def other_thread():
        try:
            theirs.extend(enqueue_cursors(1))
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert len(theirs) == 1 and theirs[0] is not mine
    assert Task.objects.count() == 2


def test_the_enqueue_is_logged_like_any_query_and_is_one_statement_on_postgresql(vendor):
    with CaptureQueriesContext(connection):
        # Where the statement cannot be prepared, the enqueue function is
        # looked up once per process.
        tasks.add.enqueue(0, 0)
    with CaptureQueriesContext(connection) as queries:
        tasks.add.enqueue(1, 1)
    statements = [query["sql"] for query in queries.captured_queries]
    assert any(is_enqueue(sql) for sql in statements), statements
    if vendor == "postgresql":
        # One round trip outside a transaction: the row and its NOTIFY, by
        # the function (PL/pgSQL's plan) since a logged query is never prepared.
        assert len(statements) == 1 and "rdbtasks_enqueue_v2(" in statements[0], statements


def test_errors_on_the_kept_cursor_are_djangos_and_the_connection_stays_usable():
    backend = task_backends["default"]
    new = backend.enqueuer.new_task(tasks.add, [1], {})
    backend.enqueuer.insert([new])
    with pytest.raises(IntegrityError), transaction.atomic():
        backend.enqueuer.insert([new])  # the same id again
    tasks.add.enqueue(2, 2)
    assert Task.objects.count() == 2


def test_a_connection_whose_cursor_is_wrapped_enqueues_through_the_wrapper():
    # django-debug-toolbar's SQL panel and SimpleTestCase's refusal of queries
    # both replace cursor() on the connection object.
    calls = []
    original = connection.cursor

    def cursor():
        calls.append("cursor")
        return original()

    connection.cursor = cursor
    try:
        tasks.add.enqueue(1, 1)
    finally:
        del connection.cursor
    assert calls
    assert Task.objects.count() == 1
    # Unwrapped again: the kept cursor, no call of cursor().
    calls.clear()
    tasks.add.enqueue(2, 2)
    assert calls == [] and Task.objects.count() == 2


def test_the_kept_cursor_is_the_dialects_own_kind(vendor):
    wrapper = connections["default"]
    cursor = kept_cursor(wrapper, dialect_for(wrapper))
    if vendor == "postgresql":
        import psycopg

        # Parameters bound by the server, not quoted into the statement.
        assert isinstance(cursor.cursor, psycopg.Cursor)
        assert not isinstance(cursor.cursor, psycopg.ClientCursor)


def test_a_bulk_enqueue_goes_through_the_execute_wrappers_and_is_logged(vendor):
    seen = []

    def wrapper(execute, sql, params, many, context):
        seen.append((sql.split()[0], context["connection"] is connections["default"]))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        bulk_enqueue(tasks.add, [((i, i), {}) for i in range(3)])
    with CaptureQueriesContext(connection) as queries:
        bulk_enqueue(tasks.add, [((i, i), {}) for i in range(3)])
    logged = [query["sql"] for query in queries.captured_queries]
    assert Task.objects.count() == 6
    if vendor == "postgresql":
        # The rows by COPY, which Django's execute() cannot run: the wrappers
        # see it all the same, and so does the query log.
        assert ("COPY", True) in seen, seen
        assert any(sql.startswith("COPY") for sql in logged), logged
    else:
        assert ("INSERT", True) in seen, seen
        assert any("INSERT INTO" in sql for sql in logged), logged


def test_a_bulk_enqueue_that_fails_raises_djangos_error_and_writes_nothing(monkeypatch):
    (twice,) = new_ids(1)
    monkeypatch.setattr("django_rdbtasks.enqueueing.new_ids", lambda count: [twice] * count)
    with pytest.raises(IntegrityError):
        bulk_enqueue(tasks.add, [((i, i), {}) for i in range(3)])
    assert Task.objects.count() == 0
    monkeypatch.undo()
    bulk_enqueue(tasks.add, [((i, i), {}) for i in range(3)])  # the connection is usable
    assert Task.objects.count() == 3
