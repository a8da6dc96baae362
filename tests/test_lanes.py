"""Lanes and claim-ahead: pure logic, no database."""

import datetime as dt
import threading
import time

from django_rdbtasks.db.rows import ClaimedRow, Outcome
from django_rdbtasks.states import OutcomeKind
from django_rdbtasks.worker.lanes import (
    FLUSH_AFTER,
    HAND_OVER_WITHIN,
    HANDBACK_AFTER,
    IN_ORDER_WITHIN,
    TAKEOVER_HANDBACK_AFTER,
    UNLIMITED_WAITING_FOR,
    ClaimAhead,
    Lane,
    UnlimitedWaiting,
    Wake,
)

NOW = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)


def row(n, priority=0, limit_key=None):
    return ClaimedRow(
        id=n,
        version=1,
        task_path="tests.testapp.tasks.noop",
        args=[],
        kwargs={},
        attempts=1,
        max_attempts=3,
        queue_name="default",
        backend_name="default",
        priority=priority,
        enqueued_at=NOW,
        started_at=NOW,
        claimed_at=NOW,
        run_after=NOW + dt.timedelta(seconds=n),
        history=[],
        limit_key=limit_key,
    )


def test_claim_ahead_grows_while_tasks_are_short_and_drops_at_once_for_a_long_one():
    ahead = ClaimAhead(budget=0.05, most=100)
    assert ahead.want() == 1  # nothing known yet: one at a time
    wants = []
    for _ in range(40):
        ahead.observe(0.0002)
        wants.append(ahead.want())
    assert wants == sorted(wants) and wants[-1] == 100
    ahead.observe(2.0)
    assert ahead.want() == 1


def test_claims_ahead_are_bounded_by_the_budget_not_only_by_most():
    """No-op tasks come in rounds of hundreds; a millisecond's tasks in fifty."""
    quick, slower = ClaimAhead(), ClaimAhead()
    for _ in range(100):
        quick.observe(0.00005)
        slower.observe(0.001)
    assert quick.want() == quick.most == 800
    assert 45 <= slower.want() <= 50  # 50 ms of work


def test_a_lane_tops_up_once_a_quarter_of_what_it_wants_has_run():
    """Early enough that a round ends before the runner runs dry (REFILL_AT)."""
    ahead = ClaimAhead(800)
    assert ahead.to_claim(0, 0.0) == 800
    assert ahead.to_claim(601, 0.001) == 0
    assert ahead.to_claim(600, 0.001) == 200  # at half left, the runner ran dry
    assert ahead.to_claim(400, 0.001) == 400


def test_nothing_is_claimed_behind_a_task_that_runs_long_or_one_at_a_time():
    ahead = ClaimAhead(8)
    assert ahead.to_claim(3, HANDBACK_AFTER) == 0  # the keeper hands these back
    assert ahead.to_claim(0, HANDBACK_AFTER) == 8  # nothing runs: claim
    one = ClaimAhead(1)
    assert one.to_claim(1, 0.0) == 0
    assert one.to_claim(0, 0.0) == 1


def test_claims_ahead_are_sized_by_the_pace_of_tasks_without_a_limit():
    """Issue 42's mix: 40 ms limited tasks and 5 ms ones without a limit. Claimed in
    order (nothing in flight), one at a time, as the slowest say; claimed ahead
    (rows without a limit only), as many as 50 ms of those."""
    ahead = ClaimAhead()
    for _ in range(3):
        ahead.observe(0.040, limited=True)
        ahead.observe(0.005)
    assert ahead.want() == 1 and ahead.to_claim(0, 0.0) == 1
    assert ahead.want_ahead() == 11  # the running one and ten behind it
    assert ahead.to_claim(1, 0.001) == 10
    assert ahead.to_claim(9, 0.001) == 0  # more than three quarters still to run


def test_one_task_waits_behind_a_running_one_while_both_fit_the_budget():
    """Tasks of 30 ms without a limit: one is claimed behind the running one, so the
    runner does not wait for a round after each; none behind tasks of the budget
    or longer, and none in order (nothing in flight) beyond the one."""
    ahead = ClaimAhead(budget=0.05)
    for _ in range(3):
        ahead.observe(0.030)
    assert ahead.want() == 1 and ahead.to_claim(0, 0.0) == 1
    assert ahead.want_ahead() == 2
    assert ahead.to_claim(1, 0.010) == 1
    assert ahead.to_claim(2, 0.010) == 0
    ahead.observe(0.050)  # as long as the budget: nothing waits behind it
    assert ahead.want_ahead() == 1 and ahead.to_claim(1, 0.010) == 0


def test_nothing_is_claimed_ahead_while_the_lane_holds_a_limited_task():
    """Its slot's next task is claimed by the round that ends it (the hand-over),
    which a claim ahead would leave to another lane."""
    ahead = ClaimAhead()
    for _ in range(3):
        ahead.observe(0.005)
    assert ahead.to_claim(1, 0.001, holds_limited=False) > 0
    assert ahead.to_claim(1, 0.001, holds_limited=True) == 0
    lane = Lane(0, "w")
    lane.add([row(1)])
    assert not lane.holds_limited()
    lane.add([row(2, limit_key="concurrency:tenant:a")])
    assert lane.holds_limited()  # queued, not yet running
    first = lane.take_next()
    lane.finish(Outcome(first.row.id, 1, OutcomeKind.SUCCESS), first)
    assert lane.take_next().row.limit_key is not None and lane.holds_limited()


def test_a_lane_that_passed_limited_rows_over_claims_in_order_again_soon():
    """A limited row with a free slot that claims ahead passed over waits at most
    about ``IN_ORDER_WITHIN`` for a busy lane to claim in order."""
    ahead = ClaimAhead()
    for _ in range(3):
        ahead.observe(0.005)
    ahead.claimed(ahead=False, passed_limited=False, now=100.0)
    ahead.claimed(ahead=True, passed_limited=True, now=100.05)
    assert ahead.to_claim(1, 0.001, now=100.1) > 0
    assert ahead.to_claim(1, 0.001, now=100.0 + IN_ORDER_WITHIN + 0.01) == 0
    assert ahead.to_claim(0, 0.0, now=100.3) == ahead.want()  # dry: in order
    ahead.claimed(ahead=False, passed_limited=False, now=100.3)
    assert ahead.to_claim(1, 0.001, now=100.35) > 0
    # Claims ahead that passed nothing over (no limited rows there) go on.
    ahead.claimed(ahead=True, passed_limited=False, now=105.0)
    assert ahead.to_claim(1, 0.001, now=105.0) > 0


def test_a_dry_lane_claims_ahead_while_the_keys_it_found_full_can_have_freed_nothing():
    """A claim in order that took rows without a limit only while full keys held
    limited rows back: the lane's next claims, though its runner is dry, take
    rows without a limit only (as many as fit), until a slot comes free (the
    process's count moves), the database's ``wait`` or ``IN_ORDER_WITHIN`` ends,
    or the lane claims in order again."""
    ahead = ClaimAhead()
    for _ in range(3):
        ahead.observe(0.040, limited=True)
        ahead.observe(0.005)
    assert not ahead.keys_full(100.0, freed=0)  # nothing found yet
    ahead.claimed(ahead=False, passed_limited=False, now=100.0)
    ahead.found_keys_full(100.0, wait=None, freed=3)
    assert ahead.keys_full(100.1, freed=3)
    assert ahead.to_claim(0, 0.0, now=100.1, ahead_only=True) == ahead.want_ahead() == 11
    assert ahead.to_claim(0, 0.0, now=100.1) == ahead.want() == 1
    assert not ahead.keys_full(100.1, freed=4)  # a slot came free: in order
    assert not ahead.keys_full(100.0 + IN_ORDER_WITHIN + 0.01, freed=3)
    # A slot that comes free by time (a rate window, a lease) ends it sooner.
    ahead.found_keys_full(200.0, wait=0.05, freed=3)
    assert ahead.keys_full(200.04, freed=3) and not ahead.keys_full(200.06, freed=3)
    # Claims ahead keep it; a claim in order ends it, until it finds them full again.
    ahead.found_keys_full(300.0, wait=None, freed=3)
    ahead.claimed(ahead=True, passed_limited=True, now=300.05)
    assert ahead.keys_full(300.1, freed=3)
    ahead.claimed(ahead=False, passed_limited=False, now=300.15)
    assert not ahead.keys_full(300.16, freed=3)


def test_rows_without_a_limit_wait_while_rounds_claim_all_they_want_of_them():
    """A round that claimed as many rows without a limit as it wanted says more may
    wait, for ``UNLIMITED_WAITING_FOR``; one that got fewer, or a limited row among
    them, says nothing; a claim ahead that got none says none wait."""
    waiting = UnlimitedWaiting()
    assert not waiting.waiting(100.0)
    waiting.saw([row(1), row(2)], 3, ahead=False, now=100.0)
    assert not waiting.waiting(100.0)  # fewer than wanted: perhaps the last
    waiting.saw([row(1), row(2, limit_key="concurrency:tenant:a")], 2, ahead=False, now=100.0)
    assert not waiting.waiting(100.0)
    waiting.saw([row(1), row(2)], 2, ahead=True, now=100.0)
    assert waiting.waiting(100.0 + UNLIMITED_WAITING_FOR / 2)
    assert not waiting.waiting(100.0 + UNLIMITED_WAITING_FOR + 0.001)
    waiting.saw([row(3)], 1, ahead=False, now=200.0)
    waiting.saw([row(4)], 4, ahead=True, now=200.01)  # some left: still waiting
    assert waiting.waiting(200.02)
    waiting.saw([], 4, ahead=True, now=200.02)  # none left
    assert not waiting.waiting(200.03)
    # Others won what it read: some may wait still.
    waiting.saw([row(5)], 4, ahead=True, now=300.0, contended=True)
    assert waiting.waiting(300.01)
    waiting.saw([], 4, ahead=True, now=300.02, contended=True)
    assert waiting.waiting(300.03)


def test_the_database_is_read_once_in_a_while_where_no_round_said_rows_wait():
    """A lane about to hand a slot over reads whether rows without a limit wait (its
    process's lanes may all be in keys' chains, so no round of it says), once per
    ``UNLIMITED_WAITING_FOR`` at most, and not while a round said so lately."""
    waiting = UnlimitedWaiting()
    assert waiting.probe_due(100.0)
    waiting.probed(False, 100.0)
    assert not waiting.waiting(100.0)
    assert not waiting.probe_due(100.0 + UNLIMITED_WAITING_FOR / 2)
    assert waiting.probe_due(100.0 + UNLIMITED_WAITING_FOR + 0.001)
    waiting.probed(True, 200.0)
    assert waiting.waiting(200.01) and not waiting.probe_due(200.01)
    waiting.saw([row(1)], 1, ahead=False, now=200.04)  # a round says so: no read due
    assert not waiting.probe_due(200.0 + UNLIMITED_WAITING_FOR + 0.01)
    assert waiting.probe_due(200.04 + UNLIMITED_WAITING_FOR + 0.001)


def test_a_dry_lane_leaves_a_limited_tasks_slot_to_rows_without_a_limit_that_wait():
    """Issue 42: while rows without a limit wait, a lane that ends a limited task
    claims ahead (its slot freed, not handed to its key's next task), as does any
    dry lane, until its claims ahead have passed limited rows over for
    ``IN_ORDER_WITHIN``: then in order, so that limited rows wait that long at most."""
    ahead = ClaimAhead()
    ahead.claimed(ahead=False, passed_limited=False, now=100.0)
    # Nothing waits: a round that ends a limited task is in order (the hand-over),
    # any other too unless the keys were found full.
    assert not ahead.ahead_when_dry(100.01, 0, ends_limited=True, unlimited_waiting=False)
    assert not ahead.ahead_when_dry(100.01, 0, ends_limited=False, unlimited_waiting=False)
    # Rows without a limit wait: they go first.
    assert ahead.ahead_when_dry(100.01, 0, ends_limited=True, unlimited_waiting=True)
    assert ahead.ahead_when_dry(100.01, 0, ends_limited=False, unlimited_waiting=True)
    ahead.claimed(ahead=True, passed_limited=True, now=100.02)
    assert ahead.ahead_when_dry(100.1, 0, ends_limited=True, unlimited_waiting=True)
    # ...until the lane owes a claim in order; that claim starts the count again.
    later = 100.0 + IN_ORDER_WITHIN + 0.01
    assert not ahead.ahead_when_dry(later, 0, ends_limited=True, unlimited_waiting=True)
    assert not ahead.ahead_when_dry(later, 0, ends_limited=False, unlimited_waiting=True)
    ahead.claimed(ahead=False, passed_limited=False, now=later)
    assert ahead.ahead_when_dry(later + 0.01, 0, ends_limited=True, unlimited_waiting=True)
    # Keys found full keep a dry lane ahead, but not one whose round ends a limited task.
    ahead.found_keys_full(later + 0.02, wait=None, freed=5)
    assert ahead.ahead_when_dry(later + 0.03, 5, ends_limited=False, unlimited_waiting=False)
    assert not ahead.ahead_when_dry(later + 0.03, 5, ends_limited=True, unlimited_waiting=False)


def test_a_freed_slot_is_counted_for_the_lanes_that_found_keys_full():
    wake = Wake()
    before = wake.freed_count
    wake.slot_freed(2)
    assert wake.freed_count == before + 2


def test_a_lane_knows_when_its_next_round_ends_a_limited_task():
    """That round may hand the slot over (a claim in order), so it is no claim ahead
    unless rows without a limit wait (``ClaimAhead.ahead_when_dry``)."""
    lane = Lane(0, "w")
    lane.add([row(1), row(2, limit_key="concurrency:tenant:a")])
    first = lane.take_next()
    lane.finish(Outcome(first.row.id, 1, OutcomeKind.SUCCESS), first)
    assert not lane.ends_limited()
    second = lane.take_next()
    lane.finish(Outcome(second.row.id, 1, OutcomeKind.SUCCESS), second)
    assert lane.ends_limited()
    lane.take_finished()
    assert not lane.ends_limited()


def test_a_lane_hands_a_slot_over_alone_only_soon_after_a_claim_in_order():
    """The hand-over alone reads nothing but the key's next task, so a lane runs
    it for ``HAND_OVER_WITHIN`` after a claim in order at most; hand-overs do not
    count as claims in order."""
    ahead = ClaimAhead()
    assert not ahead.may_hand_over(100.0)  # never claimed in order yet
    ahead.claimed(ahead=False, passed_limited=False, now=100.0)
    assert ahead.may_hand_over(100.1)
    ahead.claimed(ahead=False, passed_limited=False, now=100.15, handed_over=True)
    assert not ahead.may_hand_over(100.0 + HAND_OVER_WITHIN + 0.01)
    ahead.claimed(ahead=False, passed_limited=False, now=100.0 + HAND_OVER_WITHIN + 0.02)
    assert ahead.may_hand_over(100.0 + 2 * HAND_OVER_WITHIN)


def test_a_fixed_batch_is_kept():
    ahead = ClaimAhead(7)
    ahead.observe(10.0)
    assert ahead.want() == 7


def test_claimed_rows_run_in_priority_order():
    lane = Lane(0, "w")
    lane.add([row(1, 0), row(2, 10), row(3, 5)])
    order = []
    while (running := lane.take_next()) is not None:
        order.append(running.row.id)
        lane.finish(Outcome(running.row.id, 1, OutcomeKind.SUCCESS), running)
    assert order == [2, 3, 1]
    assert [o.id for o, _ in lane.take_finished()] == [2, 3, 1]


def test_tasks_behind_a_long_one_are_handed_back_and_not_started():
    lane = Lane(0, "w")
    lane.add([row(1), row(2), row(3)])
    first = lane.take_next()
    lane.finish(Outcome(first.row.id, 1, OutcomeKind.SUCCESS), first)
    long = lane.take_next()
    assert long.row.id == 2
    # Not yet: the running task is young.
    assert lane.hand_back_if_stuck(now=0.0, after=3600) is None
    import time

    taken = lane.hand_back_if_stuck(now=time.monotonic() + 1, after=0.5)
    assert [r.row.id for r in taken.unstarted] == [3]
    assert [o.id for o, _ in taken.finished] == [1]  # written promptly, not after the long task
    assert lane.take_next() is None  # the lane will not start what it handed back
    assert [r.row.id for r in lane.held()] == [2]


def test_a_takeover_behind_a_long_task_is_handed_back_only_after_a_second():
    """Handed back, a dead holder's task would be an ordinary READY row, behind
    every task of a higher priority (test_loop's 20,000-task backlog, when a
    task ran 50 ms under load): it waits for the running task a while longer."""
    import time

    lane = Lane(0, "w")
    lane.add([row(1)])
    lane.take_next()  # runs long
    takeover, ordinary = row(2, priority=-50), row(3)
    takeover.lost_from = object()  # the dead holder's claim
    lane.add([takeover, ordinary])
    started = time.monotonic()
    taken = lane.hand_back_if_stuck(now=started + HANDBACK_AFTER + 0.01)
    assert [r.row.id for r in taken.unstarted] == [3]
    lane.hand_back_written()
    assert sorted(r.row.id for r in lane.held()) == [1, 2]  # the takeover runs next
    assert lane.hand_back_if_stuck(now=started + TAKEOVER_HANDBACK_AFTER / 2) is None
    taken = lane.hand_back_if_stuck(now=started + TAKEOVER_HANDBACK_AFTER + 0.01)
    assert [r.row.id for r in taken.unstarted] == [2]


def test_every_task_is_taken_by_exactly_one_side():
    """The lane's thread and the keeper race for the same queue: no task twice, none lost."""
    for _ in range(50):
        lane = Lane(0, "w")
        lane.add([row(n) for n in range(200)])
        started: list[int] = []
        handed: list[int] = []

        def run_lane(lane=lane, started=started):
            while (running := lane.take_next()) is not None:
                started.append(running.row.id)
                lane.finish(Outcome(running.row.id, 1, OutcomeKind.SUCCESS), running)

        thread = threading.Thread(target=run_lane)
        thread.start()
        while thread.is_alive():
            taken = lane.hand_back_if_stuck(now=float("inf"), after=0)
            if taken is not None:
                handed += [r.row.id for r in taken.unstarted]
        thread.join()
        assert sorted(started + handed) == list(range(200))


def test_a_lost_claim_waiting_in_the_queue_is_not_started():
    lane = Lane(0, "w")
    lane.add([row(1), row(2)])
    lane.held()[0].lost = True  # the keeper learnt it was reclaimed
    assert lane.take_next().row.id == 2


def test_outcomes_a_round_could_not_write_go_first_into_the_next():
    lane = Lane(0, "w")
    lane.add([row(1), row(2)])
    first = lane.take_next()
    lane.finish(Outcome(first.row.id, 1, OutcomeKind.SUCCESS), first)
    unwritten = lane.take_finished()
    second = lane.take_next()
    lane.finish(Outcome(second.row.id, 1, OutcomeKind.SUCCESS), second)
    lane.put_back_finished(unwritten)
    assert [o.id for o, _ in lane.take_finished()] == [1, 2]
    assert lane.held() == []


def test_a_hand_back_counts_until_the_keeper_has_written_it():
    lane = Lane(0, "w")
    lane.add([row(1), row(2)])
    lane.take_next()
    assert not lane.handing_back()
    taken = lane.hand_back_if_stuck(now=float("inf"), after=0)
    assert [r.row.id for r in taken.unstarted] == [2]
    # Row 2 is still RUNNING under this lane's claim: the lane must not read
    # an empty claim as an empty queue yet.
    assert lane.handing_back()
    lane.hand_back_written()
    assert not lane.handing_back()


def round_thread_waiting(lane):
    """A thread waiting on ``lane`` as a round thread does (``wait_changed`` from the
    count read now), returned once it waits, with the event it sets when woken."""
    generation = lane.generation
    woke = threading.Event()

    def round_thread():
        lane.wait_changed(generation, 60.0)
        woke.set()

    waiter = threading.Thread(target=round_thread)
    waiter.start()
    deadline = time.monotonic() + 30
    while lane._waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert lane._waiting == 1
    return waiter, woke


def test_a_wake_up_reaches_a_round_thread_waiting_on_its_busy_lane():
    """An enqueue notified while the runner is busy is claimed at once, not at the next poll."""
    lane = Lane(0, "w")
    wake = Wake()
    wake.watch([lane])
    lane.add([row(1)])
    lane.take_next()  # the runner is busy: the round thread waits on the lane
    waiter, woke = round_thread_waiting(lane)
    try:
        wake.set()
        # Without the poke it would sleep its whole minute.
        assert woke.wait(30)
        assert wake.is_set()
    finally:
        lane.close()
        waiter.join(60)


def test_a_task_taken_does_not_wake_the_round_thread_and_its_end_does():
    """The runner taking its next task changes nothing the round thread waits for
    (what is in flight, whether the lane is idle, when outcomes flush): it is
    counted, for a waiter that read the count before, and wakes nobody. Its end
    (an outcome to write) does."""
    lane = Lane(0, "w")
    lane.add([row(1), row(2)])
    running = lane.take_next()
    waiter, woke = round_thread_waiting(lane)
    try:
        lane.finish(Outcome(running.row.id, 1, OutcomeKind.SUCCESS), running)
        assert woke.wait(30)
        waiter.join(30)
        # Now the round thread waits again, and the runner takes the next task.
        generation = lane.generation
        waiter, woke = round_thread_waiting(lane)
        taken = lane.take_next()
        assert taken is not None and lane.generation == generation + 1
        assert not woke.wait(0.3)  # still waiting: nobody was woken
        lane.wait_changed(generation, 60.0)  # read before the take: returns at once
    finally:
        lane.close()
        waiter.join(60)
    assert woke.is_set()  # the close woke it


def waiters_on_a_freed_slot(wake, count):
    """``count`` round threads waiting for a limit's slot; each sets its event once woken."""
    woken = [threading.Event() for _ in range(count)]
    waiting = threading.Barrier(count + 1)

    def wait(done):
        waiting.wait()
        wake.wait_for_slot(60.0)
        done.set()

    threads = [threading.Thread(target=wait, args=(done,)) for done in woken]
    for thread in threads:
        thread.start()
    waiting.wait()
    return woken, threads


def test_a_freed_slot_wakes_one_waiting_round_thread_not_all():
    wake = Wake()
    wake.watch([Lane(i, "w") for i in range(3)])
    woken, threads = waiters_on_a_freed_slot(wake, 3)
    try:
        time.sleep(0.1)  # all three are waiting
        wake.slot_freed()
        deadline = time.monotonic() + 30
        while not any(e.is_set() for e in woken) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert sum(e.is_set() for e in woken) == 1
        wake.slot_freed(2)
        assert all(e.wait(30) for e in woken)
    finally:
        wake.set()
        for thread in threads:
            thread.join(60)


def test_an_enqueue_wakes_every_thread_waiting_for_a_slot():
    wake = Wake()
    wake.watch([Lane(i, "w") for i in range(2)])
    woken, threads = waiters_on_a_freed_slot(wake, 2)
    try:
        time.sleep(0.1)
        wake.set()
        assert all(e.wait(30) for e in woken)
    finally:
        for thread in threads:
            thread.join(60)


def test_a_slot_freed_before_anyone_waits_is_kept_for_the_next_to_wait():
    """A round thread that saw the keys full just before a slot came free does not
    sleep through it; a few are kept, at most one per round thread."""
    wake = Wake()
    wake.watch([Lane(i, "w") for i in range(2)])
    wake.slot_freed(5)
    started = time.monotonic()
    wake.wait_for_slot(30.0)
    wake.wait_for_slot(30.0)
    assert time.monotonic() - started < 5
    wake.wait_for_slot(0.2)  # the other three were not kept: this one times out
    assert time.monotonic() - started >= 0.2


def test_rate_limited_claims_run_first_in_a_lane():
    """Their bodies must start within their allowance (``ClaimedRow.start_by``)."""
    lane = Lane(0, "w")
    rated = row(3, 0)
    rated.start_by = 123.0
    lane.add([row(1, 5), row(2, 0), rated])
    assert [lane.take_next().row.id for _ in range(3)] == [3, 1, 2]


def test_outcomes_wait_for_their_batch_only_while_the_runner_has_more():
    lane = Lane(0, "w")
    lane.add([row(1), row(2)])
    first = lane.take_next()
    lane.finish(Outcome(first.row.id, 1, OutcomeKind.SUCCESS), first)
    # Task 2 is still to run: outcome 1 waits for it, up to FLUSH_AFTER.
    assert 0 < lane.flush_in() <= FLUSH_AFTER
    assert not lane.should_flush()
    second = lane.take_next()
    assert not lane.should_flush()
    lane.finish(Outcome(second.row.id, 1, OutcomeKind.SUCCESS), second)
    # Nothing left to run: no later outcome would join them, write them now
    # (the next enqueue's round is then a claim alone).
    assert lane.should_flush()
