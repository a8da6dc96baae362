"""explain(): each reason a task is not running, checked against the real claim (drain)."""

from __future__ import annotations

import datetime as dt

import pytest

from django_rdbtasks.dependencies import enqueue_after
from django_rdbtasks.explain import Hold, explain
from django_rdbtasks.models import LimitSlot, Task, Worker
from django_rdbtasks.queues import pause, resume
from django_rdbtasks.states import TaskStatus
from django_rdbtasks.testing import TaskClock, drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


@pytest.fixture
def clock():
    with TaskClock() as clock:
        yield clock


@pytest.fixture
def serving(clock):
    """A live worker serving every queue of the tests' backend."""
    return Worker.objects.create(
        name="host-a:100",
        host="host-a",
        pid=100,
        queues=["default", "emails", "other"],
        mode="optimistic",
        last_heartbeat_at=clock.now(),
        started_at=clock.now(),
    )


def beat(worker: Worker, clock: TaskClock) -> None:
    """The worker heartbeats, as a live one does every few seconds."""
    Worker.objects.filter(pk=worker.pk).update(last_heartbeat_at=clock.now())


def ran(report) -> list[str]:
    return [r.id for r in report]


def test_a_ready_task_nothing_holds_is_runnable(serving):
    first = tasks.record.enqueue("first")
    second = tasks.record.enqueue("second")
    why = explain(second.id)
    assert why.runnable
    assert why.findings[0].detail == {"ahead": 1}
    assert "at most 1 runnable task(s)" in str(why)
    assert set(ran(drain())) == {first.id, second.id}


def test_not_due_until_its_run_after(serving, clock):
    result = tasks.record.using(run_after=clock.now() + dt.timedelta(minutes=5)).enqueue("later")
    why = explain(result.id)
    assert why.holds() == [Hold.NOT_DUE]
    assert why.findings[0].until == clock.now() + dt.timedelta(minutes=5)
    assert "in 5 min" in str(why) and "enqueued to run then" in str(why)
    assert len(drain()) == 0
    clock.advance(minutes=5)
    beat(serving, clock)
    assert explain(result.id).runnable
    assert ran(drain()) == [result.id]


def test_a_retry_waiting_out_its_backoff(serving, clock):
    result = tasks.fails_with_default_backoff.enqueue()
    drain()
    why = explain(result.id)
    assert why.holds() == [Hold.NOT_DUE]
    assert "retry after attempt 1 of 2" in str(why)
    assert len(drain()) == 0
    clock.advance(seconds=10)
    assert len(drain()) == 1


def test_paused_queue(serving):
    result = tasks.send_email.enqueue("a@example.com")
    assert pause("emails", by="ops", reason="SMTP down")
    assert not pause("emails")  # paused already: the first pause stands
    why = explain(result.id)
    assert why.holds() == [Hold.QUEUE_PAUSED]
    assert "paused, since" in str(why) and "by ops" in str(why)
    assert len(drain()) == 0
    assert resume("emails")
    assert explain(result.id).runnable
    assert ran(drain()) == [result.id]


def test_no_live_worker_serves_the_queue(clock):
    result = tasks.record.enqueue("nobody")
    why = explain(result.id)
    assert why.holds() == [Hold.NO_WORKER]
    assert "runworkers --queue default" in str(why)
    Worker.objects.create(
        name="host-b:1", host="host-b", pid=1, queues=["default"], mode="optimistic",
        last_heartbeat_at=clock.now(), started_at=clock.now(),
    )  # fmt: skip
    assert explain(result.id).runnable
    clock.advance(seconds=120)  # its heartbeat is now too old
    assert explain(result.id).holds() == [Hold.NO_WORKER]


def test_limit_key_full_names_the_holders(serving, clock):
    holder = tasks.per_tenant.enqueue("t1", 0)
    key = Task.objects.get(pk=holder.id).limit_key
    # Fill the key's 3 slots with claims of other tasks, as running workers would.
    holders = [tasks.per_tenant.enqueue("t1", 0) for _ in range(3)]
    for n, h in enumerate(holders):
        Task.objects.filter(pk=h.id).update(
            status=TaskStatus.RUNNING, version=1, attempts=1, worker_id=f"host-a:100:{n}:x",
            lease_expires_at=clock.now() + dt.timedelta(seconds=30), started_at=clock.now(),
        )  # fmt: skip
        LimitSlot.objects.update_or_create(
            key=key, slot_no=n,
            defaults={"free_at": clock.now() + dt.timedelta(seconds=30), "holder_id": h.id,
                      "holder_version": 1},
        )  # fmt: skip
    why = explain(holder.id)
    assert why.holds() == [Hold.LIMIT_FULL]
    assert all(h.id in str(why) for h in holders)
    assert "host-a:100:0:x" in str(why)
    assert len(drain()) == 0
    LimitSlot.objects.filter(slot_no=0).update(free_at=None, holder_id=None, holder_version=None)
    assert explain(holder.id).runnable
    assert ran(drain()) == [holder.id]


def test_rate_window_spent_until(serving, clock):
    results = [tasks.metered.enqueue(n) for n in range(21)]  # 20 starts an hour
    assert len(drain()) == 20
    left = next(r for r in results if Task.objects.get(pk=r.id).status == TaskStatus.READY)
    why = explain(left.id)
    assert why.holds() == [Hold.RATE_SPENT]
    assert why.findings[0].until is not None
    assert why.findings[0].until > clock.now()
    assert "20 starts per 3600s" in str(why)
    # A rate slot comes free a period and the claim's start allowance after the claim.
    clock.advance(hours=1, seconds=1)
    beat(serving, clock)
    assert explain(left.id).runnable
    assert ran(drain()) == [left.id]


def test_waiting_for_parents(serving):
    parent = tasks.record.using(run_after=dt.datetime(2100, 1, 1, tzinfo=dt.UTC)).enqueue("p")
    child = enqueue_after([parent], tasks.record, "c")
    why = explain(child.id)
    assert why.holds() == [Hold.WAITING_FOR_PARENTS]
    assert parent.id in str(why)
    assert len(drain()) == 0
    Task.objects.filter(pk=parent.id).update(run_after=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    assert ran(drain()) == [parent.id, child.id]


def test_held_by_a_worker_then_its_lease_lapses(serving, clock):
    result = tasks.record.enqueue("held")
    Task.objects.filter(pk=result.id).update(
        status=TaskStatus.RUNNING, version=1, attempts=1, worker_id="host-a:100:0:abc",
        lease_expires_at=clock.now() + dt.timedelta(seconds=30), started_at=clock.now(),
        last_attempted_at=clock.now(),
    )  # fmt: skip
    why = explain(result.id)
    assert why.holds() == [Hold.HELD]
    assert "host-a:100:0:abc" in str(why) and "last heartbeat" in str(why)
    assert len(drain()) == 0
    clock.advance(seconds=31)
    why = explain(result.id)
    assert why.holds() == [Hold.LEASE_LAPSED]
    assert "takes it over" in str(why)
    assert ran(drain()) == [result.id]


def test_finished(serving):
    result = tasks.always_fails.enqueue("x")
    drain()
    why = explain(result.id)
    assert why.holds() == [Hold.FINISHED]
    assert "FAILED" in str(why) and "builtins.ValueError" in str(why)
    ok = tasks.record.enqueue("ok")
    drain()
    assert "SUCCESSFUL" in str(explain(ok.id))


def test_an_unknown_id():
    with pytest.raises(Task.DoesNotExist):
        explain("01234567-89ab-7def-8123-456789abcdef")


def test_json_says_it_all(serving):
    result = tasks.record.enqueue("j")
    data = explain(result.id).as_json()
    assert data["runnable"] is True
    assert data["findings"][0]["hold"] == "runnable now"


def test_code_this_release_lacks_is_named_and_the_workers_hand_it_back(serving, clock):
    """A rolling deploy: a task of the next release, met by this release's claim."""
    result = tasks.record.enqueue("from the future")
    Task.objects.filter(pk=result.id).update(task_path="tests.testapp.tasks.next_release_task")
    why = explain(result.id)
    assert why.holds() == [Hold.CODE_MISSING]
    assert "has no 'next_release_task'" in str(why)
    report = drain()
    assert [r.outcome for r in report] == ["postpone"]  # handed back, attempt unspent
    why = explain(result.id)
    assert why.holds() == [Hold.NOT_DUE, Hold.CODE_MISSING]
    assert "handed back unstarted" in str(why)
    assert Task.objects.get(pk=result.id).attempts == 0
