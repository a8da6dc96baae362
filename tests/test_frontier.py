"""A lane's read frontier (db/frontier.py): its rules alone, then on PostgreSQL under
a pinned snapshot, late commits, held rows and new priorities (issue 43)."""

from __future__ import annotations

import datetime as dt
import threading
import time

import psycopg
import pytest
from django.db import connection, connections

from django_rdbtasks.backend import bulk_enqueue
from django_rdbtasks.db.frontier import FULL_READ_SECONDS, ReadFrontier
from django_rdbtasks.db.rows import ClaimRequest, Outcome
from django_rdbtasks.models import Task
from django_rdbtasks.states import ClaimMode, OutcomeKind
from tests.testapp import tasks

T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def listening(clock: Clock | None = None) -> ReadFrontier:
    frontier = ReadFrontier(clock=clock or Clock())
    frontier.listening(True)
    return frontier


# -- the rules, without a database ------------------------------------------------------


def pairs(read) -> dict[tuple[str, int], dt.datetime]:
    return {
        (queue, priority): start
        for queue, priority, start in zip(
            read.fresh_queues, read.fresh_priorities, read.fresh_from, strict=True
        )
    }


def test_a_lane_reads_from_the_head_until_it_listens_and_at_its_first_round():
    frontier = ReadFrontier(clock=Clock())
    assert frontier.take(["q"]).discover  # not listening: every round from the head
    frontier.advance(frontier.take(["q"]), [("q", 0, at(1))], [("q", at(1))])
    assert frontier.take(["q"]).discover
    frontier.listening(True)
    assert frontier.take(["q"]).discover  # what was sent before it listened is lost
    read = frontier.take(["q"])
    assert not read.discover
    assert (read.fresh_queues, read.fresh_priorities, read.fresh_from) == (["q"], [0], [at(1)])
    assert (read.lease_queues, read.lease_from) == (["q"], [at(1)])


def test_a_round_reads_from_where_the_last_stopped_and_only_its_queues():
    frontier = listening()
    full = frontier.take(["a", "b"])
    assert full.discover
    frontier.advance(full, [("a", 5, at(2)), ("a", 0, at(3)), ("b", 0, at(4))], [("a", at(1))])
    read = frontier.take(["a"])
    assert sorted(zip(read.fresh_queues, read.fresh_priorities, read.fresh_from, strict=True)) == [
        ("a", 0, at(3)),
        ("a", 5, at(2)),
    ]
    assert (read.lease_queues, read.lease_from) == (["a"], [at(1)])
    frontier.advance(read, [("a", 5, at(6)), ("a", 0, at(7))], [("a", at(8))])
    assert frontier.fresh == {("a", 5): at(6), ("a", 0): at(7), ("b", 0): at(4)}


def test_a_notified_start_lowers_the_next_read_and_a_round_never_raises_it_back():
    frontier = listening()
    frontier.advance(frontier.take(["q"]), [("q", 0, at(10))], [])
    frontier.lower("q", 0, at(4))
    frontier.lower("q", 0, at(6))  # a later start of the same pair: the lowest holds
    frontier.lower("q", 3, at(5))  # a priority the lane did not know
    read = frontier.take(["q"])
    assert pairs(read) == {
        ("q", 0): at(4),
        ("q", 3): at(5),
    }
    # Notified while that round is at the database: kept for the next.
    frontier.lower("q", 0, at(2))
    frontier.advance(read, [("q", 0, at(12)), ("q", 3, at(12))], [])
    read = frontier.take(["q"])
    assert pairs(read) == {
        ("q", 0): at(2),
        ("q", 3): at(12),
    }


def test_a_round_that_fails_leaves_the_notified_starts_in_force():
    frontier = listening()
    frontier.advance(frontier.take(["q"]), [("q", 0, at(10))], [])
    frontier.lower("q", 0, at(3))
    frontier.take(["q"])  # and no advance: the round failed
    assert frontier.take(["q"]).fresh_from == [at(3)]


def test_a_full_read_forgets_the_pairs_it_found_empty():
    frontier = listening()
    frontier.advance(frontier.take(["q"]), [("q", 0, at(1)), ("q", 7, at(1))], [])
    frontier.reread()  # a notification of the old form, or a dependant released
    full = frontier.take(["q"])
    assert full.discover and full.fresh_queues == []
    frontier.advance(full, [("q", 0, at(5))], [("q", at(5))])
    assert frontier.fresh == {("q", 0): at(5)}


def test_the_head_is_read_again_once_every_full_read_seconds_and_after_any_doubt():
    clock = Clock()
    frontier = listening(clock)
    frontier.advance(frontier.take(["q"]), [("q", 0, at(1))], [])
    assert not frontier.take(["q"]).discover
    clock.now += FULL_READ_SECONDS * 0.7  # staggered: due between 3/4 and all of it
    assert not frontier.take(["q"]).discover
    clock.now += FULL_READ_SECONDS * 0.31
    assert frontier.take(["q"]).discover
    assert not frontier.take(["q"]).discover
    frontier.listening(False)  # notifications lost meanwhile: from the head, every round
    assert frontier.take(["q"]).discover and frontier.take(["q"]).discover
    frontier.listening(True)
    assert frontier.take(["q"]).discover
    assert not frontier.take(["q"]).discover
    frontier.forget()  # the lane's connection made again
    assert frontier.fresh == {} and frontier.take(["q"]).discover


def test_it_says_whether_its_last_read_was_from_the_head():
    """Burst mode ends only on a claim that read from the head (worker/loop.py)."""
    frontier = listening()
    frontier.take(["q"])
    assert frontier.last_read_full
    frontier.advance(frontier.take(["q"]), [("q", 0, at(1))], [])
    assert not frontier.last_read_full
    frontier.reread()
    assert frontier.take(["q"]).discover and frontier.last_read_full


def test_the_listener_reads_a_ready_payload_and_drops_what_is_not_one():
    from django_rdbtasks.worker.listener import parse_ready

    micros = (T0 - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    assert parse_ready(f"-5|{micros}|emails|eu") == ("emails|eu", -5, T0)
    assert parse_ready("emails") is None
    assert parse_ready("x|1|q") is None


# -- on PostgreSQL -------------------------------------------------------------------------

postgresql = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the read frontier is PostgreSQL's"
    ),
]


def raw_connection() -> psycopg.Connection:
    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=True)


def on_a_lane(test):
    """``test(store)`` on a worker connection of its own (a lane's), closed after."""
    from django_rdbtasks.worker.connection import close_in_thread, open_in_thread, worker_alias
    from django_rdbtasks.worker.store import ClaimStore

    alias = worker_alias("default", lease=30.0)
    try:
        open_in_thread(alias)
        return test(ClaimStore(alias, "default"))
    finally:
        close_in_thread(alias)


def succeeded(rows) -> list[Outcome]:
    return [
        Outcome(row.id, row.version, OutcomeKind.SUCCESS, entry={"attempt": 1}, row=row)
        for row in rows
    ]


def task_table_buffers(cursor) -> int:
    """Buffers of the task table and its indexes read so far (hits and reads), as the
    server's statistics have them once this session's are flushed."""
    cursor.execute("SELECT pg_stat_force_next_flush()")
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    cursor.execute(
        "SELECT heap_blks_hit + heap_blks_read + idx_blks_hit + idx_blks_read "
        "FROM pg_statio_user_tables WHERE relname = %s",
        [Task._meta.db_table],
    )
    return int(cursor.fetchone()[0])


@pytest.mark.slow
@pytest.mark.parametrize("mode", [ClaimMode.OPTIMISTIC, ClaimMode.SKIP_LOCKED])
@pytest.mark.usefixtures("transactional_db")
def test_under_a_pinned_snapshot_a_claim_from_the_frontier_reads_what_is_new_not_the_pins_dead(
    mode,
):
    """Issue 43: with a REPEATABLE READ snapshot held open (and an xid), every task
    claimed and finished leaves a dead entry at the head of ``ready_fresh`` and,
    once its lease is past, of ``rdbtasks_task_lease``, which no scan may skip. A
    claim from the head visits them all; a claim from the frontier does not. Its
    buffers are counted by the server, on the real round, after 8,000 tasks."""
    if connection.vendor != "postgresql":
        pytest.skip("the read frontier is PostgreSQL's")
    lease, batch, steps = 1.0, 100, 80
    pin = raw_connection()
    pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    pin.execute("SELECT txid_current()")
    pin.execute(f"SELECT count(*) FROM {Task._meta.db_table}")
    frontier = listening(None)
    bounded = ClaimRequest(["default"], batch, "w", lease, mode, frontier=frontier)
    from_the_head = ClaimRequest(["default"], batch, "w", lease, mode)

    def rounds(store):
        held: list[Outcome] = []
        for _ in range(steps):
            bulk_enqueue(tasks.noop, [((), {})] * batch)
            result = store.exchange(held, "w", bounded)
            assert len(result.claimed) == batch
            held = succeeded(result.claimed)
        store.exchange(held, "w", None)
        time.sleep(lease + 0.2)  # every RUNNING version's lease past: all dead entries

        def measured(request: ClaimRequest) -> int:
            """The buffers of a claim that finds nothing: its reads alone."""
            with store.cursor() as cursor:
                before = task_table_buffers(cursor)
                assert store.exchange([], "w", request).claimed == []
                return task_table_buffers(cursor) - before

        # The frontier's first read after the sleep visits the leases that ran
        # out since its last (each dead entry once a lane, as its lease passes).
        return [measured(r) for r in (bounded, bounded, from_the_head, bounded)]

    try:
        passing, bounded_reads, head, again = on_a_lane(rounds)
    finally:
        pin.close()
    # 8,000 dead entries in each of two indexes: 560 buffers from the head here
    # (docs/design/vacuum-independent-claims.md, section 1.3, measured the same
    # slope); from the frontier, a dozen, however many tasks the pin has seen.
    assert head > 300, (passing, bounded_reads, head, again)
    assert bounded_reads < 40 and again < 40, (passing, bounded_reads, head, again)


class LateProducer(threading.Thread):
    """Enqueues ``tasks.noop`` in a transaction it keeps open until told to commit."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.enqueued = threading.Event()
        self.commit = threading.Event()
        self.task_id = ""
        self.run_after: dt.datetime | None = None

    def run(self) -> None:
        from django.db import transaction

        try:
            with transaction.atomic():
                self.task_id = tasks.noop.enqueue().id
                self.run_after = Task.objects.get(pk=self.task_id).run_after
                self.enqueued.set()
                self.commit.wait(30)
        finally:
            connections.close_all()


@pytest.mark.slow
@pytest.mark.parametrize("notified", [True, False], ids=["listened", "not-listened"])
@pytest.mark.usefixtures("transactional_db")
def test_a_task_committed_behind_the_frontier_is_claimed_once_its_notification_arrives(notified):
    """A producer's transaction enqueues and stays open while another's task is
    claimed: the lane's frontier passes the first's ``run_after``. Its commit's
    notification brings the frontier back at once; unheard, only the next full
    read finds the task (here one second; ``FULL_READ_SECONDS`` in a worker)."""
    if connection.vendor != "postgresql":
        pytest.skip("the read frontier is PostgreSQL's")
    from django_rdbtasks.worker.lanes import Lane, Wake
    from django_rdbtasks.worker.listener import Listener

    frontier = ReadFrontier(full_every=60.0 if notified else 1.0)
    wake, halt = Wake(), threading.Event()
    wake.watch([Lane(0, "w", frontier)])
    listener = Listener("default", ["default"], wake, halt)
    request = ClaimRequest(["default"], 10, "w", 30.0, frontier=frontier)

    def claimed(store) -> list[str]:
        return [row.id for row in store.exchange([], "w", request).claimed]

    def rounds(store):
        listener.start()
        assert listener.ready.wait(10)
        assert claimed(store) == []  # its first round after LISTEN: from the head
        late = LateProducer()
        late.start()
        assert late.enqueued.wait(10)
        wake.clear()
        early = tasks.noop.enqueue()
        # A pair the lane did not know (its full read found the queue empty):
        # read once its notification has told the frontier.
        assert wake.wait(10)
        assert claimed(store) == [early.id]
        assert late.run_after is not None and frontier.fresh[("default", 0)] > late.run_after
        if not notified:
            halt.set()  # the listener stops: the commit's notification is never heard
            listener.join(5)
            frontier.listening(True)  # as if it were still up: only the timer is left
            claimed(store)  # the full read that follows listening(True)
        wake.clear()
        late.commit.set()
        late.join(10)
        if notified:
            assert wake.wait(10)  # the listener lowered the frontier, then woke the lane
        assert claimed(store) == ([late.task_id] if notified else [])
        if not notified:
            time.sleep(1.0)  # FULL_READ_SECONDS, here
            assert claimed(store) == [late.task_id]

    try:
        on_a_lane(rounds)
    finally:
        halt.set()
        if listener.is_alive():
            listener.join(5)


@pytest.mark.slow
@pytest.mark.usefixtures("transactional_db")
def test_a_dependant_released_at_a_priority_the_lane_never_saw_is_claimed_from_the_frontier():
    """A parent's success releases its dependant, at a priority no read of the lane
    has found: the release announces (queue, priority, start) on ``rdbtasks_ready``,
    so the lane's next claim reads it from its frontier, not from the head."""
    if connection.vendor != "postgresql":
        pytest.skip("the read frontier is PostgreSQL's")
    from django_rdbtasks.dependencies import enqueue_after
    from django_rdbtasks.worker.lanes import Lane, Wake
    from django_rdbtasks.worker.listener import Listener

    frontier = ReadFrontier(full_every=60.0)
    wake, halt = Wake(), threading.Event()
    wake.watch([Lane(0, "w", frontier)])
    listener = Listener("default", ["default"], wake, halt)
    request = ClaimRequest(["default"], 10, "w", 30.0, frontier=frontier)
    parent = tasks.step.enqueue("a")
    child = enqueue_after([parent], tasks.step.using(priority=5), "b")

    def rounds(store):
        listener.start()
        assert listener.ready.wait(10)
        [row] = store.exchange([], "w", request).claimed  # from the head: the parent
        assert row.id == parent.id and frontier.last_read_full
        assert ("default", 5) not in frontier.fresh
        wake.clear()
        written = store.exchange(succeeded([row]), "w", None).written
        assert list(written) == [parent.id]
        assert wake.wait(10)  # the release's notification
        [released] = store.exchange([], "w", request).claimed
        assert released.id == child.id and not frontier.last_read_full

    try:
        on_a_lane(rounds)
    finally:
        halt.set()
        listener.join(5)
