"""What each limit key holds: slots in use, tasks waiting, busiest first."""

import pytest
from django.db import connection, transaction

from django_rdbtasks.db import dialect_for
from django_rdbtasks.db.rows import ClaimRequest
from django_rdbtasks.limit_usage import key_usage
from django_rdbtasks.states import LimitKind
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def claim_all(worker_id="w1"):
    dialect = dialect_for(connection)
    with transaction.atomic(), connection.cursor() as cursor:
        return dialect.exchange(
            cursor, [], worker_id, ClaimRequest(["default"], 100, worker_id, 30)
        )


def busy_keys():
    """Two customers' concurrency keys and the provider's rate key, some of each claimed."""
    for _ in range(3):
        tasks.per_customer.enqueue("a")
    tasks.per_customer.enqueue("b")
    for i in range(25):
        tasks.rated.enqueue(i)
    claim_all()


def test_key_usage_counts_slots_in_use_and_tasks_waiting():
    busy_keys()
    tasks.per_customer.enqueue("idle")  # a key with one task waiting, nothing in use...
    usage = {u.key: u for u in key_usage("default")}
    rate = usage["rate:provider"]
    assert isinstance(rate.kind, LimitKind) and isinstance(
        usage["concurrency:customer:a"].kind, LimitKind
    )
    assert (rate.kind, rate.name, rate.slots, rate.period) == (LimitKind.RATE, "provider", 20, 1.0)
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
