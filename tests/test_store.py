"""The claim store meeting a write the database refuses (issue 37): the batch is split
until the refused outcome is alone, that task fails with the refusal, the others and
the round's claim go through once."""

import json
import uuid

import pytest
from django.db import DataError, OperationalError, connection

from django_rdbtasks.db.rows import ClaimRequest, Outcome
from django_rdbtasks.exceptions import ValueNotStorable
from django_rdbtasks.models import Task
from django_rdbtasks.states import AttemptOutcome, OutcomeKind
from django_rdbtasks.storable import StorageLimits
from django_rdbtasks.worker.connection import close_in_thread, open_in_thread, worker_alias
from django_rdbtasks.worker.store import ClaimStore
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

NOT_STORABLE = f"{ValueNotStorable.__module__}.{ValueNotStorable.__qualname__}"


@pytest.fixture
def store():
    alias = worker_alias("default", lease=30.0)
    open_in_thread(alias)
    try:
        yield ClaimStore(alias, "default")
    finally:
        close_in_thread(alias)


def success(row, value, store):
    outcome = Outcome(
        row.id,
        row.version,
        OutcomeKind.SUCCESS,
        entry={"attempt": row.attempts, "worker_id": "w1", "outcome": AttemptOutcome.SUCCESSFUL},
        return_value=value,
        row=row,
    )
    store.dialect.encode_outcome(outcome, StorageLimits())
    return outcome


def poisoned(outcome, vendor):
    """The outcome as the round sends it, with a result this database refuses: what
    the checks in Python would stop, sent anyway (a check missing, a schema changed)."""
    if vendor == "postgresql":
        outcome.wire = outcome.wire.replace('"rv":', '"rv":"a\\u0000b","was":')
    elif vendor == "mysql":
        outcome.texts = (outcome.texts[0], json.dumps("a\ud800b"))
    else:  # SQLite takes NULs and surrogates in JSON, not JSON that is not JSON
        outcome.texts = (outcome.texts[0], "{not json")
    return outcome


def claim(store, count):
    ids = {tasks.add.enqueue(n, 1).id for n in range(count)}
    rows = store.exchange([], "w1", ClaimRequest(["default"], count, "w1", 30.0)).claimed
    assert {store.public_id(row.id) for row in rows} == ids
    return rows


def test_a_refused_outcome_fails_its_task_alone_and_the_round_still_claims_once(store, vendor):
    rows = claim(store, 6)
    outcomes = [success(row, i, store) for i, row in enumerate(rows)]
    bad = poisoned(outcomes[3], vendor)
    waiting = {tasks.add.enqueue(n, 2).id for n in range(3)}
    result = store.exchange(outcomes, "w1", ClaimRequest(["default"], 3, "w1", 30.0))
    # Every outcome written, the refused one as its task's failure.
    assert set(result.written) == {o.id for o in outcomes} and not result.busy
    # The claim made once, after them: the three waiting tasks, each once.
    claimed = [store.public_id(row.id) for row in result.claimed]
    assert sorted(claimed) == sorted(waiting)
    assert Task.objects.filter(pk__in=waiting, status="RUNNING", attempts=1).count() == 3
    for outcome in outcomes:
        row = Task.objects.get(pk=store.public_id(outcome.id))
        if outcome is bad:
            assert (row.status, row.attempts, row.return_value) == ("FAILED", 1, None)
            [entry] = row.history
            assert entry["exception_class_path"] == NOT_STORABLE
            assert "the database refused to store this task's result" in entry["traceback"]
            assert "will be refused again" not in entry["traceback"]  # the log's, not the task's
            assert outcome.kind == OutcomeKind.FAILURE  # reported as written
        else:
            assert (row.status, row.return_value) == ("SUCCESSFUL", outcomes.index(outcome))
    assert store._parts_written == {}


def test_finish_fails_each_refused_outcome_and_writes_the_others(store, vendor):
    rows = claim(store, 5)
    outcomes = [success(row, i, store) for i, row in enumerate(rows)]
    bad = {poisoned(outcomes[0], vendor).id, poisoned(outcomes[4], vendor).id}
    result = store.finish(outcomes, "w1")
    assert set(result.written) == {o.id for o in outcomes}
    statuses = dict(Task.objects.values_list("pk", "status"))
    for outcome in outcomes:
        expected = "FAILED" if outcome.id in bad else "SUCCESSFUL"
        assert statuses[uuid.UUID(store.public_id(outcome.id))] == expected


def test_an_outage_in_the_middle_of_a_split_writes_nothing_twice(store, vendor, monkeypatch):
    rows = claim(store, 4)
    outcomes = [success(row, i, store) for i, row in enumerate(rows)]
    poisoned(outcomes[2], vendor)
    write = store._write
    calls = []

    def write_then_lose_the_connection(part, worker_id):
        calls.append(len(part))
        if len(calls) == 3:  # the split's second part: the first is committed
            raise OperationalError("server closed the connection unexpectedly")
        return write(part, worker_id)

    monkeypatch.setattr(store, "_write", write_then_lose_the_connection)
    with pytest.raises(OperationalError):
        store.finish(outcomes, "w1")
    monkeypatch.setattr(store, "_write", write)
    # Tried again (retry_database would): what the first part wrote is reported,
    # not written again (its claims are gone: it would be "discarded").
    result = store.finish(outcomes, "w1")
    assert set(result.written) == {o.id for o in outcomes}
    for row in Task.objects.all():
        assert len(row.history) == 1, row.history
    assert Task.objects.filter(status="FAILED").count() == 1
    assert store._parts_written == {}


def test_a_refusal_that_is_not_the_datas_leaves_the_outcome_as_it_was(store, monkeypatch):
    rows = claim(store, 2)
    outcomes = [success(row, i, store) for i, row in enumerate(rows)]

    def refuse(*args, **kwargs):
        raise DataError("value too long for type character varying(100)")

    # Everything refused, the failure too: a column shortened by hand, say.
    monkeypatch.setattr(store, "_write", refuse)
    monkeypatch.setattr(store, "_exchange", refuse)
    with pytest.raises(DataError):
        store.exchange(outcomes, "w1", None)
    assert [o.kind for o in outcomes] == [OutcomeKind.SUCCESS] * 2
    assert [o.return_value for o in outcomes] == [0, 1]
    assert Task.objects.filter(status="RUNNING").count() == 2


@pytest.mark.skipif("connection.vendor != 'mysql'", reason="max_allowed_packet is MySQL's")
def test_a_result_over_max_allowed_packet_fails_its_task_naming_the_limit(store):
    """Issue 37: a result bigger than the packet was retried, its lease lapsed, it ran
    three times and ended WorkerLost. With the checks in Python set above the server's
    packet (``MAX_RESULT_BYTES``), the refusal itself fails the task, once."""
    rows = claim(store, 3)
    outcomes = [success(row, i, store) for i, row in enumerate(rows)]
    huge = Outcome(rows[1].id, rows[1].version, OutcomeKind.SUCCESS, row=rows[1])
    huge.return_value = "y" * 17_000_000
    huge.entry = dict(outcomes[1].entry)
    store.dialect.encode_outcome(huge, StorageLimits(result=20_000_000))
    outcomes[1] = huge
    result = store.exchange(outcomes, "w1", None)
    assert set(result.written) == {o.id for o in outcomes}
    row = Task.objects.get(pk=store.public_id(huge.id))
    assert row.status == "FAILED"
    traceback = row.history[-1]["traceback"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        packet = cursor.fetchone()[0]
    assert "(MySQL error 1153)" in traceback
    assert f"the server's max_allowed_packet is {packet:,} bytes" in traceback
    assert Task.objects.filter(status="SUCCESSFUL").count() == 2


def test_an_outcome_settles_dependants_only_for_a_task_that_has_them(store, vendor):
    """The outcome's row lock reads whether the task has dependants (MySQL, MariaDB;
    PostgreSQL's statement returns it): a task without reads neither the dependencies
    nor the workflows; a parent's success releases its dependant in the same round."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from django_rdbtasks.dependencies import enqueue_after

    plain = claim(store, 1)
    with CaptureQueriesContext(connections[store.alias]) as captured:
        result = store.exchange([success(plain[0], 1, store)], "w1", None)
    assert set(result.written) == {plain[0].id}
    sqls = [q["sql"] or "" for q in captured]
    settling = [sql for sql in sqls if "dependency" in sql or "workflow" in sql]
    # (SQLite, without row locks, has nothing to read it with: it settles to find out.)
    assert vendor == "sqlite" or not settling, settling

    parent = tasks.add.enqueue(1, 1)
    child = enqueue_after([parent], tasks.add, 2, 2)
    rows = store.exchange([], "w1", ClaimRequest(["default"], 1, "w1", 30.0)).claimed
    assert [store.public_id(row.id) for row in rows] == [parent.id]
    store.exchange([success(rows[0], 2, store)], "w1", None)
    assert Task.objects.get(pk=child.id).status == "READY"
