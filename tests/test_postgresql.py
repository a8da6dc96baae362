"""PostgreSQL's dialect: its statements' parameters, and how its claims read under contention."""

import json
import uuid

import pytest
from django.db import connection, connections, transaction

from django_rdbtasks.db import dialect_for
from django_rdbtasks.db.base import candidate_count
from django_rdbtasks.db.postgresql import PostgreSQLDialect
from django_rdbtasks.db.postgresql.parameters import outcome_json, outcomes_json, parameter
from django_rdbtasks.db.rows import ClaimRequest, Outcome
from django_rdbtasks.models import Task
from django_rdbtasks.states import ClaimMode, OutcomeKind
from django_rdbtasks.storable import StorageLimits
from tests.testapp import tasks


def test_ids_and_versions_go_as_one_parameter():
    ids = ["01a2184c-11bf-7001-846e-3f4057f98e62", "01a2184c-11bf-7037-8562-b0a359079e31"]
    assert parameter(ids) == "{" + ",".join(ids) + "}"
    assert parameter([uuid.UUID(ids[0])]) == "{" + ids[0] + "}"
    assert parameter([3, 12, 7]) == "{3,12,7}"
    assert parameter([]) == "{}"


def test_anything_that_would_need_quoting_is_left_to_the_driver():
    for values in (["concurrency:k1"], ["a b"], ['"'], ["x}"], [""], ["1", ""]):
        assert parameter(values) is values
    assert parameter("text") == "text" and parameter(7) == 7


def test_an_outcome_encoded_ahead_is_sent_as_the_round_would_encode_it():
    outcomes = [
        Outcome("01a2184c-11bf-7001-846e-3f4057f98e62", 3, OutcomeKind.SUCCESS, entry={"n": "é"}),
        Outcome(uuid.uuid4(), 1, OutcomeKind.RETRY, return_value=[1, {"a": None}], delay=2.5),
    ]
    by_the_round = outcomes_json(outcomes)
    dialect = object.__new__(PostgreSQLDialect)  # no connection: encoding needs none
    for outcome in outcomes:
        dialect.encode_outcome(outcome, StorageLimits())
        assert outcome.wire is not None
    assert outcomes_json(outcomes) == by_the_round
    assert json.loads(by_the_round)[1] == {
        "id": str(outcomes[1].id),
        "version": 1,
        "rv": [1, {"a": None}],
        "entry": None,
        "delay": 2.5,
    }


def test_an_outcome_is_the_json_the_standard_encoder_writes():
    class Odd:
        def __str__(self):
            return "odd \u2603"

    entries = (
        None,
        {"attempt": 2, "worker_id": 'h\u00f6st:1:0:x"y', "outcome": "SUCCESSFUL", "t": "\n\t"},
        {"nested": [[], {}, [1.5, -0.0, 10**30, True, False, None]], "odd": Odd()},
    )
    for entry in entries:
        for value in (None, "", 0, 2.5, float("inf"), {"k": ["\u00e9", "\ud83d\ude00"]}):
            outcome = Outcome(uuid.uuid4(), 7, OutcomeKind.SUCCESS, entry=entry, return_value=value)
            standard = json.dumps(
                {"id": str(outcome.id), "version": 7, "rv": value, "entry": entry, "delay": 0.0},
                default=str,
                separators=(",", ":"),
            )
            assert outcome_json(outcome) == standard


def claim_one(using):
    """One optimistic round of ``using`` claiming one task: its claims' ids, and the round."""
    request = ClaimRequest(["default"], 1, "w", 30.0, ClaimMode.OPTIMISTIC)
    with transaction.atomic(using=using.alias), using.cursor() as cursor:
        result = dialect_for(using).exchange(cursor, [], "w", request)
    return [str(row.id) for row in result.claimed], result


@pytest.mark.django_db(transaction=True)
def test_an_optimistic_claim_that_lost_races_reads_past_the_rows_others_hold():
    """Others holding the first rows of the queue (their claims not yet committed)
    leave an optimistic claim's candidates all taken: it claims nothing and says it
    lost races. The claims of that queue then read as the skip-locked mode does,
    past the held rows, and fill their batch from rows nobody holds."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's round")
    held = [tasks.add.enqueue(i, i) for i in range(candidate_count(1))]
    free = tasks.add.using(priority=-1).enqueue(9, 9)
    holder = connections.create_connection("default")
    claimer = connections.create_connection("default")
    try:
        with claimer.cursor() as cursor:  # a claim that waited would fail in 5 s, not hang
            cursor.execute("SET lock_timeout = '5s'")
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {Task._meta.db_table} WHERE id = ANY(%s::uuid[]) FOR UPDATE",
                [[t.id for t in held]],
            )
        claimed, lost = claim_one(claimer)
        assert claimed == [] and lost.contended
        claimed, _ = claim_one(claimer)
        assert claimed == [free.id]
        # Nothing else changed: the held rows are READY and untouched.
        assert set(Task.objects.filter(status="READY").values_list("version", "attempts")) == {
            (0, 0)
        }
        # Without what the lost race taught, the optimistic read is back to the
        # first rows, all held.
        Task.objects.filter(pk=free.id).update(status="READY", version=5, worker_id="")
        dialect_for(claimer).forget_learnt()
        assert claim_one(claimer)[0] == []
        holder.rollback()
        assert claim_one(claimer)[0] == [held[0].id]
    finally:
        holder.close()
        claimer.close()


def test_the_dialect_is_made_of_parts_it_holds():
    """Composition, not mixins: the dialect's classes are the portable dialect's
    alone, and the enqueue, the round, the sessions' bounds and the finished rows
    are objects it holds, each made with the dialect's spelling."""
    from django_rdbtasks.db.base import Dialect
    from django_rdbtasks.db.postgresql.finished import FinishedRows
    from django_rdbtasks.db.postgresql.inserts import PostgreSQLInserts
    from django_rdbtasks.db.postgresql.round import RoundSQL
    from django_rdbtasks.db.postgresql.sessions import PostgreSQLSessionBounds

    assert PostgreSQLDialect.__mro__[1:] == Dialect.__mro__
    dialect = PostgreSQLDialect(connection, dialect_for(connection).tables)
    assert isinstance(dialect.inserts, PostgreSQLInserts) and dialect.inserts.d is dialect
    assert isinstance(dialect.round, RoundSQL) and dialect.round.d is dialect
    assert isinstance(dialect.sessions, PostgreSQLSessionBounds)
    assert isinstance(dialect.finished, FinishedRows)
    assert dialect.session_sql(30.0) == dialect.sessions.session_sql(30.0)
