"""The lease keeper's renewal, with a store that stands for the database (no database)."""

import datetime as dt
import logging

from django_rdbtasks.db.rows import ClaimedRow, Outcome
from django_rdbtasks.states import OutcomeKind
from django_rdbtasks.worker.keeper import IDLE_TICK, TICK, LeaseKeeper
from django_rdbtasks.worker.lanes import HANDBACK_AFTER, Lane
from django_rdbtasks.worker.reporting import Counters

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def row(task_id: str) -> ClaimedRow:
    return ClaimedRow(
        task_id, 1, "tests.testapp.tasks.add", [], {}, 1, 3, "default", "default", 0,
        NOW, NOW, NOW, NOW, [],
    )  # fmt: skip


class Registry:
    def alive(self, **kwargs):
        pass


def keeper_for(lane: Lane, store) -> LeaseKeeper:
    keeper = LeaseKeeper(
        lanes=[lane],
        alias="unused",
        database="default",
        executor=None,  # type: ignore[arg-type]
        reporter=None,  # type: ignore[arg-type]
        counters=Counters(),
        registry=Registry(),  # type: ignore[arg-type]
        lease=30.0,
        timeout_grace=5.0,
        stopping=lambda: False,
    )
    keeper.store = store
    return keeper


def test_an_outcome_written_while_the_renewal_ran_is_not_taken_for_a_lost_lease(caplog):
    """The lane wrote the outcome (the row left RUNNING) between the keeper's look at
    what it holds and the renewal's answer: the claim ended, it was not lost."""
    lane = Lane(0, "w:0")
    lane.add([row("done-meanwhile"), row("still-running")])
    finished = lane.take_next()
    lane.finish(Outcome(finished.row.id, 1, OutcomeKind.SUCCESS, row=finished.row), finished)
    running = lane.take_next()

    class Store:
        def renew(self, claims, worker_id, lease, limited):
            assert {task_id for task_id, _ in claims} == {"done-meanwhile", "still-running"}
            lane.take_finished()  # the lane's round writes it now
            return {"still-running"}, set()

    with caplog.at_level(logging.WARNING, logger="django_rdbtasks.worker"):
        keeper_for(lane, Store()).renew()
    assert not finished.lost and not running.lost
    assert "lease lost" not in caplog.text


def test_a_claim_still_held_that_the_renewal_did_not_find_is_lost(caplog):
    lane = Lane(0, "w:0")
    lane.add([row("taken-over"), row("kept")])
    first = lane.take_next()
    waiting = lane.held()

    class Store:
        def renew(self, claims, worker_id, lease, limited):
            return {"kept"}, set()

    with caplog.at_level(logging.WARNING, logger="django_rdbtasks.worker"):
        keeper_for(lane, Store()).renew()
    lost = {r.row.id for r in waiting if r.lost}
    assert lost == {"taken-over"} and first.lost and first.stop_requested
    assert "task taken-over: lease lost" in caplog.text


def test_the_keeper_ticks_often_only_while_a_lane_holds_a_task():
    """An idle worker's keeper looks at its lanes every ``IDLE_TICK``: a lane's first
    claim is seen that much later at most, before anything queued behind it can be
    due for a hand-back (``HANDBACK_AFTER``); from then on every ``TICK``."""
    assert TICK < IDLE_TICK <= HANDBACK_AFTER
    lane = Lane(0, "w:0")
    keeper = keeper_for(lane, store=None)
    assert not keeper.attending()
    lane.add([row("a"), row("b")])
    assert keeper.attending()
    running = lane.take_next()
    lane.finish(Outcome(running.row.id, 1, OutcomeKind.SUCCESS, row=running.row), running)
    assert keeper.attending()  # "b" waits, the outcome is not written yet
    last = lane.take_next()
    lane.finish(Outcome(last.row.id, 1, OutcomeKind.SUCCESS, row=last.row), last)
    lane.take_finished()
    assert not keeper.attending()
    stopping = keeper_for(lane, store=None)
    stopping.stopping = lambda: True
    assert stopping.attending()
