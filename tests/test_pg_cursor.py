"""The worker's PostgreSQL cursor: binary results, ids as text, kept for the session."""

import datetime as dt
import uuid

import pytest
from django.db import DatabaseError, connections
from django.test.utils import CaptureQueriesContext

from django_rdbtasks.db import dialect_for
from django_rdbtasks.db.pg_cursor import worker_cursor
from django_rdbtasks.db.rows import ClaimRequest, Outcome
from django_rdbtasks.models import Task
from django_rdbtasks.states import OutcomeKind
from tests.testapp import tasks

connection = connections["default"]

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the PostgreSQL dialect's own cursor"
    ),
]


def test_rows_read_as_the_django_cursor_reads_them_but_ids_as_text():
    result = tasks.add.using(run_after=dt.datetime(2030, 1, 2, 3, 4, 5, 6, dt.UTC)).enqueue(2, 3)
    sql = (
        "SELECT id, args, kwargs, run_after, history, checkpoint, version "
        "FROM django_rdbtasks_task WHERE id = %s"
    )
    with connection.cursor() as plain:
        plain.execute(sql, [result.id])
        expected = plain.fetchone()
    with worker_cursor(connection) as cursor:
        cursor.execute(sql, [result.id])
        got = cursor.fetchone()
    assert got[0] == result.id and isinstance(got[0], str)
    assert uuid.UUID(got[0]) == expected[0]
    # JSON as text, as Django's cursors give it: the rows decode the same.
    assert got[1:3] == expected[1:3] == ("[2, 3]", "{}")
    assert got[3] == expected[3] == dt.datetime(2030, 1, 2, 3, 4, 5, 6, dt.UTC)
    assert got[3].utcoffset() == dt.timedelta(0)
    assert got[4:] == expected[4:]


def test_a_json_string_is_text_to_decode_not_a_decoded_value():
    result = tasks.add.enqueue(1, 1)
    Task.objects.filter(pk=result.id).update(checkpoint="just text")
    with worker_cursor(connection) as cursor:
        cursor.execute("SELECT checkpoint FROM django_rdbtasks_task WHERE id = %s", [result.id])
        (value,) = cursor.fetchone()
    assert value == '"just text"'
    assert dialect_for(connection).decode_json(value) == "just text"


def test_the_cursor_is_kept_across_uses_and_replaced_when_django_reconnects():
    with worker_cursor(connection) as first:
        first.execute("SELECT 1")
    with worker_cursor(connection) as second:
        second.execute("SELECT 2")
        assert second.fetchone() == (2,)
    assert first.cursor is second.cursor  # Django's wrapper closed it; it stays open
    connection.close()
    with worker_cursor(connection) as third:
        third.execute("SELECT 3")
        assert third.fetchone() == (3,)
    assert third.cursor is not first.cursor


def test_errors_are_djangos_and_statements_are_logged_under_debug():
    with pytest.raises(DatabaseError), worker_cursor(connection) as cursor:
        cursor.execute("SELECT * FROM no_such_table")
    with CaptureQueriesContext(connection) as queries, worker_cursor(connection) as cursor:
        cursor.execute("SELECT %s::int + 1", [41])
        assert cursor.fetchone() == (42,)
    (query,) = queries.captured_queries
    assert query["sql"].startswith("SELECT")


def test_a_round_on_it_claims_and_writes_with_text_ids():
    ids = {tasks.add.enqueue(n, n).id for n in range(5)}
    dialect = dialect_for(connection)
    with worker_cursor(connection) as cursor:
        round_one = dialect.exchange(cursor, [], "w1", ClaimRequest(["default"], 5, "w1", 30.0))
    claimed = round_one.claimed
    assert {row.id for row in claimed} == ids
    assert all(isinstance(row.id, str) and row.args == [row.args[0]] * 2 for row in claimed)
    assert all(row.claimed_at.tzinfo is not None for row in claimed)
    outcomes = [
        Outcome(row.id, row.version, OutcomeKind.SUCCESS, entry={"attempt": 1}, row=row)
        for row in claimed
    ]
    with worker_cursor(connection) as cursor:
        round_two = dialect.exchange(cursor, outcomes, "w1", None)
    assert set(round_two.written) == ids
    assert set(Task.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"SUCCESSFUL"}
    assert Task.objects.get(pk=next(iter(ids))).history == [{"attempt": 1}]
