"""What each limit key holds: slots in use, tasks waiting, busiest first."""

import pytest

from django_rdbtasks.limit_usage import key_usage
from django_rdbtasks.models import LimitSlot
from django_rdbtasks.states import LimitKind
from tests.test_limits import exchange
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def claim_all(worker_id="w1"):
    """A worker's round (its slots made first, as the worker makes them)."""
    return exchange(worker_id, 100)


def busy_keys():
    """Two customers' concurrency keys and the provider's rate key, some of each claimed.

    The rate key's window is an hour: with a one-second window a loaded
    machine saw the starts leave it before the page was read.
    """
    for _ in range(3):
        tasks.per_customer.enqueue("a")
    tasks.per_customer.enqueue("b")
    for i in range(25):
        tasks.metered.enqueue(i)
    claim_all()


def test_key_usage_counts_slots_in_use_and_tasks_waiting():
    busy_keys()
    tasks.per_customer.enqueue("idle")  # a key with one task waiting, nothing in use...
    usage = {u.key: u for u in key_usage("default")}
    rate = usage["rate:provider"]
    assert isinstance(rate.kind, LimitKind) and isinstance(
        usage["concurrency:customer:a"].kind, LimitKind
    )
    assert (rate.kind, rate.name, rate.slots, rate.period) == (
        LimitKind.RATE,
        "provider",
        20,
        3600.0,
    )
    assert (rate.in_use, rate.waiting, rate.full) == (20, 5, True)
    a = usage["concurrency:customer:a"]
    assert (a.kind, a.slots, a.in_use, a.waiting, a.full) == (LimitKind.CONCURRENCY, 2, 2, 1, True)
    b = usage["concurrency:customer:b"]
    assert (b.in_use, b.waiting, b.full) == (1, 0, False)
    idle = usage["concurrency:customer:idle"]
    assert (idle.in_use, idle.waiting) == (0, 1)
    assert key_usage("default")[0].key == "rate:provider"  # busiest first


def test_a_key_with_nothing_in_use_or_waiting_is_left_out():
    tasks.per_customer.enqueue("gone")
    from django_rdbtasks.models import Task

    Task.objects.update(status="SUCCESSFUL")
    assert key_usage("default") == []


def test_a_key_whose_tasks_wait_before_any_slot_exists_is_shown():
    # Enqueued, no worker has made the key's slots yet: the limit the tasks
    # carry, nothing in use, all waiting.
    tasks.per_customer.enqueue("new")
    tasks.per_customer.enqueue("new")
    assert not LimitSlot.objects.exists()
    [new] = key_usage("default")
    assert (new.key, new.slots, new.in_use, new.waiting, new.full) == (
        "concurrency:customer:new",
        2,
        0,
        2,
        False,
    )
