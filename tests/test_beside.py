"""Which rounds write their outcomes beside the claim (worker/beside.py). The
writing itself, and its connection killed mid-drain, is in test_runworkers.py."""

import types
import uuid

from django_rdbtasks.db.rows import ClaimedRow, ClaimRequest, Outcome
from django_rdbtasks.states import OutcomeKind
from django_rdbtasks.worker.beside import WRITE_BESIDE_FROM, BesideWriter


def store(one_statement=True):
    return types.SimpleNamespace(
        dialect=types.SimpleNamespace(exchange_is_one_statement=one_statement)
    )


def outcomes(count, limit_key=None):
    rows = [
        ClaimedRow(
            uuid.uuid4(), 1, "t", [], {}, 1, 1, "default", "default", 0, None, None, None, None, []
        )
        for _ in range(count)
    ]
    for row in rows:
        row.limit_key = limit_key
    return [Outcome(row.id, 1, OutcomeKind.SUCCESS, row=row) for row in rows]


def test_a_claiming_round_of_many_unlimited_outcomes_writes_them_beside():
    writer = BesideWriter("alias", "default", "w", "beside")
    claim = ClaimRequest(["default"], 10, "w", 30.0)
    assert writer.takes(store(), outcomes(WRITE_BESIDE_FROM), claim)
    # Too few to be worth two statements; nothing claimed; one database round
    # of several statements (MySQL, SQLite).
    assert not writer.takes(store(), outcomes(WRITE_BESIDE_FROM - 1), claim)
    assert not writer.takes(store(), outcomes(WRITE_BESIDE_FROM), None)
    assert not writer.takes(
        store(), outcomes(WRITE_BESIDE_FROM), ClaimRequest(["default"], 0, "w", 30.0)
    )
    assert not writer.takes(store(one_statement=False), outcomes(WRITE_BESIDE_FROM), claim)


def test_a_limited_tasks_outcome_stays_with_the_claim_that_may_take_its_slot():
    writer = BesideWriter("alias", "default", "w", "beside")
    claim = ClaimRequest(["default"], 10, "w", 30.0)
    mixed = outcomes(WRITE_BESIDE_FROM) + outcomes(1, limit_key="k")
    assert not writer.takes(store(), mixed, claim)
    # Nothing was started: no thread, no connection.
    writer.close()
