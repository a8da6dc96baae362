"""What a task leaves on its thread's connections is undone, on that thread's alone; a
connection that broke is opened again before the next task runs, not by the task."""

import threading
import time

import pytest
from django.db import DatabaseError, connections, transaction

from django_rdbtasks.db import dialect_for
from django_rdbtasks.worker.task_connections import (
    reconnect_task_connections,
    reset_task_connections,
)

pytestmark = pytest.mark.django_db(transaction=True)


def reopened(alias="default"):
    connection = connections[alias]
    connection.close()
    connection.ensure_connection()  # opened now: its thread knows of it
    return connection


def test_a_connection_left_without_autocommit_is_closed_and_a_clean_one_kept():
    connection = reopened()
    reset_task_connections()
    assert connection.connection is not None  # nothing to undo: kept open
    connection.set_autocommit(False)
    reset_task_connections()
    assert connection.connection is None
    connection.ensure_connection()
    assert connection.get_autocommit()


def test_an_atomic_block_left_open_is_abandoned_and_rolled_back():
    connection = reopened()
    transaction.atomic().__enter__()  # a task that returned inside its block
    assert connection.in_atomic_block
    reset_task_connections()
    assert not connection.in_atomic_block and connection.connection is None


def test_another_threads_connections_are_left_alone():
    opened = threading.Event()
    release = threading.Event()
    seen = {}

    def other_thread():
        connection = reopened()
        connection.set_autocommit(False)
        opened.set()
        release.wait(10)
        seen["still_open"] = connection.connection is not None
        connection.set_autocommit(True)
        connection.close()

    thread = threading.Thread(target=other_thread)
    thread.start()
    assert opened.wait(10)
    reset_task_connections()
    release.set()
    thread.join(10)
    assert seen == {"still_open": True}


def test_a_connection_the_task_made_itself_is_the_tasks_to_keep():
    own = connections.create_connection("default")
    try:
        own.set_autocommit(False)
        own.ensure_connection()
        reset_task_connections()
        assert own.connection is not None and not own.get_autocommit()
    finally:
        own.close()


# -- reconnecting before the next task ---------------------------------------------------------


def accepts_writes(cursor):
    return dialect_for(connections["default"]).accepts_writes(cursor)


def reconnect(lost, accepts=accepts_writes, give_up=lambda: True):
    return reconnect_task_connections(
        lost, "default", accepts, stop=threading.Event(), give_up=give_up
    )


def kill(connection):
    """End ``connection``'s session from another one, as a failover or an operator would."""
    killer = connections.create_connection("default")
    try:
        with killer.cursor() as cursor:
            if connection.vendor == "postgresql":
                pid = connection.connection.info.backend_pid
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            else:
                cursor.execute(f"KILL {connection.connection.thread_id()}")
    finally:
        killer.close()


def test_nothing_is_reopened_while_nothing_broke():
    connection = reopened()
    driver = connection.connection
    assert reconnect(False)
    assert connection.connection is driver


@pytest.mark.skipif(
    connections["default"].vendor == "sqlite", reason="a file has no session to end"
)
def test_a_connection_a_task_broke_is_opened_again_before_the_next_task():
    connection = reopened()
    kill(connection)
    with pytest.raises(DatabaseError), connection.cursor() as cursor:  # the task's query
        cursor.execute("SELECT 1")
    reset_task_connections()
    assert connection.connection is None
    # The next task finds it open, on a server that takes writes.
    assert reconnect(False)
    assert connection.connection is not None
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    # Once: the task after that runs on it as it is.
    driver = connection.connection
    assert reconnect(False) and connection.connection is driver


def test_when_the_round_lost_its_connection_every_one_of_the_thread_is_replaced():
    connection = reopened()
    driver = connection.connection
    assert reconnect(True)
    assert connection.connection is not None and connection.connection is not driver


def test_a_server_refusing_writes_is_retried_until_stopped_and_left_closed():
    connection = reopened()
    deadline = time.monotonic() + 1.0  # the second try comes within 0.15 s
    refused = []

    def read_only(cursor):
        refused.append(accepts_writes(cursor))  # the real answer, then refused
        return False

    assert not reconnect(True, read_only, give_up=lambda: time.monotonic() > deadline)
    assert len(refused) >= 2 and all(refused)  # retried, each time on a new connection
    assert connection.connection is None


def test_the_runners_own_connection_is_connected_again_after_a_lost_round():
    """Used before or not: a takeover's first write on it is the attempt it took over."""
    own = connections.create_connection("default")
    try:
        assert own.connection is None  # never used
        assert reconnect_task_connections(
            True, "default", accepts_writes, own=own, stop=threading.Event(), give_up=lambda: True
        )
        assert own.connection is not None
        driver = own.connection
        assert reconnect(False) and own.connection is driver  # only when the round lost it
    finally:
        own.close()
