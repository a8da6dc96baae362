"""What a task leaves on its thread's connections is undone, on that thread's alone."""

import threading

import pytest
from django.db import connections, transaction

from django_rdbtasks.worker.task_connections import reset_task_connections

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
