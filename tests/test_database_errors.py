"""Which database errors refuse the data (the same write fails again) and which pass:
decided by class, SQLSTATE and error number, with the errors the databases really raise."""

import json

import pytest
from django.db import DatabaseError, OperationalError, connection, connections, transaction

from django_rdbtasks.database_errors import describe, is_lost_race, is_refusal
from django_rdbtasks.models import Task
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def raised(sql, params=()):
    """The error the test database raises for ``sql``."""
    with pytest.raises((DatabaseError, UnicodeError)) as error, transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql, list(params))
    return error.value


def refused_writes(vendor):
    """Writes of a task's data this database refuses, as the worker could make them."""
    table = Task._meta.db_table
    row = Task._meta.pk.get_db_prep_value(Task.objects.get().pk, connection)
    cast = "::jsonb" if vendor == "postgresql" else ""
    update = f"UPDATE {table} SET {{}} WHERE id = %s"
    result, message = (
        update.format(f"return_value = %s{cast}"),
        update.format("progress_message = %s"),
    )
    writes = {
        "invalid JSON": (result, ["{bad", row]),
        "a surrogate in a text parameter": (message, ["\ud800", row]),
    }
    if vendor != "sqlite":  # SQLite takes these
        writes["a lone surrogate in JSON"] = (result, [json.dumps("a\ud800"), row])
        writes["too long for its column"] = (message, ["x" * 201, row])
        writes["out of range"] = (update.format("attempts = %s"), [2**40, row])
    if vendor == "postgresql":
        writes["a NUL in JSON"] = (result, [json.dumps("\x00"), row])
        writes["a NUL in a text parameter"] = (message, ["\x00", row])
    if vendor == "mysql":
        writes["invalid JSON for a JSON function"] = (
            update.format("history = JSON_ARRAY_APPEND(history, '$', JSON_EXTRACT(%s, '$'))"),
            ["{bad", row],
        )
        writes["NaN, refused by the driver"] = (update.format("progress = %s"), [float("nan"), row])
    return writes


def test_every_refusal_of_the_data_is_one(vendor):
    tasks.noop.enqueue()
    for what, (sql, params) in refused_writes(vendor).items():
        error = raised(sql, params)
        assert is_refusal(error), (what, error)
        assert not is_lost_race(error), what
        assert describe(error).startswith(type(error).__name__), what


@pytest.mark.skipif("connection.vendor != 'mysql'", reason="max_allowed_packet is MySQL's")
def test_a_statement_over_max_allowed_packet_is_a_refusal():
    tasks.noop.enqueue()
    table = Task._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        packet = cursor.fetchone()[0]
    error = raised(f"UPDATE {table} SET return_value = %s", [json.dumps("y" * packet)])
    assert is_refusal(error)
    assert "(MySQL error 1153)" in describe(error)
    connection.close()


def test_an_outage_is_not_a_refusal(vendor):
    if vendor == "sqlite":
        error = raised("SELECT * FROM no_such_table")  # before migrate: retried, not refused
        assert not is_refusal(error)
        return
    # A connection killed under the session: what an outage looks like.
    victim = connections.create_connection("default")
    try:
        with victim.cursor() as cursor:
            pid_of = "pg_backend_pid()" if vendor == "postgresql" else "CONNECTION_ID()"
            cursor.execute(f"SELECT {pid_of}")
            pid = cursor.fetchone()[0]
        with connection.cursor() as cursor:
            if vendor == "postgresql":
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            else:
                cursor.execute(f"KILL CONNECTION {int(pid)}")
        with pytest.raises(OperationalError) as lost, victim.cursor() as cursor:
            cursor.execute("SELECT 1")
        assert not is_refusal(lost.value)
    finally:
        victim.close()
    assert not is_refusal(raised("SELECT * FROM no_such_table"))


def test_a_lost_race_is_not_a_refusal():
    class Deadlock(OperationalError):
        pass

    error = Deadlock(1213, "Deadlock found when trying to get lock")
    assert is_lost_race(error) and not is_refusal(error)
