"""A worker's own MySQL session leaves autocommit off between its transactions
(worker/lazy_autocommit.py): two round trips fewer a round, and nothing it
writes outside a transaction is left uncommitted."""

import time

import pytest
from django.db import connection

from django_rdbtasks.worker.connection import (
    close_in_thread,
    open_in_thread,
    worker_alias,
    worker_transaction,
)
from django_rdbtasks.worker.lazy_autocommit import without_autocommit_toggles
from tests.conftest import in_new_thread

pytestmark = pytest.mark.django_db(transaction=True)

INSERT = (
    "INSERT INTO django_rdbtasks_pausedqueue (queue_name, paused_at, paused_by, reason) "
    "VALUES (%s, UTC_TIMESTAMP(6), '', '')"
)


@pytest.fixture
def mysql(vendor):
    if vendor != "mysql":
        pytest.skip("only MySQL's autocommit is a statement of its own")


def on_worker_session(lease, body):
    """``body(wrapper, alias)`` on a worker session of its own thread, closed after."""
    alias = worker_alias("default", lease=lease)

    def run():
        wrapper = open_in_thread(alias)
        try:
            return body(wrapper, alias)
        finally:
            close_in_thread(alias)

    return in_new_thread(run)


def paused_queue_names():
    """What the test's own session reads of the rows the worker session wrote."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT queue_name FROM django_rdbtasks_pausedqueue")
        return cursor.fetchall()


def statements_sent(wrapper):
    """The session's own count of the statements it received, this one included."""
    wrapper.ensure_connection()
    with wrapper.connection.cursor() as cursor:  # the driver's: no Django bookkeeping
        cursor.execute("SHOW SESSION STATUS LIKE 'Questions'")
        return int(cursor.fetchone()[1])


def rounds(wrapper, alias, n):
    """``n`` transactions of one statement each; the statements the server received."""
    before = statements_sent(wrapper)
    for _ in range(n):
        with worker_transaction(alias), wrapper.cursor() as cursor:
            cursor.execute("SELECT 1")
    return statements_sent(wrapper) - before - 1


def test_a_worker_transaction_costs_its_statements_and_the_commit(mysql):
    def measured(wrapper, alias):
        rounds(wrapper, alias, 1)  # the first turns autocommit off
        return rounds(wrapper, alias, 10)

    # SELECT 1 and COMMIT; Django's own wrapper sends SET autocommit twice more.
    assert on_worker_session(30.0, measured) == 20


def test_django_s_own_wrapper_toggles_autocommit_around_each_transaction(mysql):
    """What the lazy wrapper saves, measured on the test's own connection."""
    connection.ensure_connection()
    assert rounds(connection, "default", 10) == 40


def test_a_statement_outside_a_transaction_is_committed_as_it_runs(mysql):
    """After a transaction the driver's autocommit is off: a statement outside any
    transaction turns it on first, so what it writes is seen by another session
    at once and the session holds no transaction open."""

    def write_after_a_transaction(wrapper, alias):
        with worker_transaction(alias), wrapper.cursor() as cursor:
            cursor.execute("SELECT 1")
        assert not wrapper.connection.get_autocommit()  # left off
        with wrapper.cursor() as cursor:
            cursor.execute(INSERT, ["outside"])
            cursor.execute("SELECT @@in_transaction")
            return cursor.fetchone()[0]

    assert on_worker_session(30.0, write_after_a_transaction) == 0
    assert paused_queue_names() == (("outside",),)


def test_a_failed_transaction_is_rolled_back_and_the_next_one_commits(mysql):
    def failed_then_committed(wrapper, alias):
        with pytest.raises(ZeroDivisionError):
            with worker_transaction(alias), wrapper.cursor() as cursor:
                cursor.execute(INSERT, ["rolled back"])
                1 / 0  # noqa: B018
        with worker_transaction(alias), wrapper.cursor() as cursor:
            cursor.execute(INSERT, ["committed"])

    on_worker_session(30.0, failed_then_committed)
    assert paused_queue_names() == (("committed",),)


def test_a_session_idle_between_transactions_is_not_ended_as_idle_in_one(mysql):
    """MariaDB ends a session idle inside a transaction after half the lease
    (``idle_transaction_timeout``). With autocommit off between rounds no
    transaction is open until the next statement: an idle worker keeps its session."""

    def idle_past_the_bound(wrapper, alias):
        with worker_transaction(alias), wrapper.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM django_rdbtasks_task")
        thread_id = wrapper.connection.thread_id()
        time.sleep(2.5)  # idle_transaction_timeout is 1 s on MariaDB here
        with worker_transaction(alias), wrapper.cursor() as cursor:
            cursor.execute("SELECT CONNECTION_ID()")
            return thread_id, cursor.fetchone()[0]

    before, after = on_worker_session(2.0, idle_past_the_bound)
    assert before == after


def test_other_databases_keep_django_s_wrapper(vendor):
    made = on_worker_session(30.0, lambda wrapper, alias: type(wrapper))
    assert (made.__name__ == "LazyAutocommitWrapper") == (vendor == "mysql")
    assert without_autocommit_toggles(made.__mro__[1]) is made or vendor != "mysql"
