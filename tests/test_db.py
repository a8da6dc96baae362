"""The claim protocol's statements on a real database: CAS, leases, fencing."""

import time

import pytest
from django.db import connection, transaction

from django_rdbtasks.db import dialect_for
from django_rdbtasks.db.base import Outcome
from django_rdbtasks.models import Task
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = ["default"]


def claim(worker_id, lease=30.0, limit=10):
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        found = dialect.candidates(cursor, QUEUES, limit)
        return dialect.claim(cursor, found, worker_id, lease)


def finish(worker_id, outcomes):
    dialect = dialect_for(connection)
    with transaction.atomic(), connection.cursor() as cursor:
        return set(dialect.finish(cursor, outcomes, worker_id))


def renew(worker_id, rows, lease=30.0):
    with connection.cursor() as cursor:
        held, _cancel = dialect_for(connection).renew(
            cursor, [(r.id, r.version) for r in rows], worker_id, lease
        )
        return held


def test_claim_sets_a_lease_from_the_database_clock():
    tasks.add.enqueue(1, 2)
    [row] = claim("w1", lease=30)
    task = Task.objects.get()
    assert (task.status, task.worker_id, task.attempts, task.version) == ("RUNNING", "w1", 1, 1)
    assert row.version == 1 and row.attempts == 1
    lease = (task.lease_expires_at - task.last_attempted_at).total_seconds()
    assert 29.9 < lease < 30.1
    assert claim("w2") == []  # a live lease is not claimable


def test_stale_version_claims_nothing():
    tasks.add.enqueue(1, 2)
    dialect = dialect_for(connection)
    with connection.cursor() as cursor:
        found = dialect.candidates(cursor, QUEUES, 10)
    Task.objects.update(priority=5, version=7)  # changed behind the reader's back
    with connection.cursor() as cursor:
        assert dialect.claim(cursor, found, "w1", 30) == []
    assert Task.objects.get().status == "READY"


def test_expired_lease_is_claimable_and_fences_the_old_holder():
    tasks.add.enqueue(1, 2)
    [old] = claim("old", lease=0.2)
    time.sleep(0.4)
    assert Task.objects.expired().count() == 1
    [new] = claim("new", lease=30)
    assert new.version == old.version + 1 and new.attempts == 2

    # Every write of the old holder now matches nothing.
    assert renew("old", [old]) == set()
    for kind in ("success", "failure", "retry", "release"):
        outcome = Outcome(old.id, old.version, kind, entry={"outcome": "stale"}, return_value=1)
        assert finish("old", [outcome]) == set()
    task = Task.objects.get()
    assert (task.status, task.worker_id, task.version, task.history) == (
        "RUNNING",
        "new",
        new.version,
        [],
    )
    # The new holder's writes land.
    assert renew("new", [new]) == {new.id}
    done = Outcome(
        new.id, new.version, "success", entry={"outcome": "SUCCESSFUL"}, return_value={"sum": 3}
    )
    assert finish("new", [done]) == {new.id}
    task.refresh_from_db()
    assert (task.status, task.return_value, task.history) == (
        "SUCCESSFUL",
        {"sum": 3},
        [{"outcome": "SUCCESSFUL"}],
    )


def test_same_worker_id_with_an_old_version_is_fenced_too():
    tasks.add.enqueue(1, 2)
    [first] = claim("w", lease=0.2)
    time.sleep(0.4)
    [_second] = claim("w", lease=30)
    stale = Outcome(first.id, first.version, "success", entry={}, return_value=0)
    assert finish("w", [stale]) == set()
    assert Task.objects.get().status == "RUNNING"


def test_release_gives_the_attempt_back_and_retry_defers():
    tasks.add.enqueue(1, 2)
    tasks.add.enqueue(3, 4)
    rows = claim("w")
    assert len(rows) == 2
    written = finish(
        "w",
        [
            Outcome(rows[0].id, rows[0].version, "release"),
            Outcome(rows[1].id, rows[1].version, "retry", entry={"outcome": "RETRY"}, delay=60),
        ],
    )
    assert written == {rows[0].id, rows[1].id}
    assert set(Task.objects.values_list("status", flat=True)) == {"READY"}
    released, retried = (Task.objects.get(pk=dialect_for(connection).decode_id(r.id)) for r in rows)
    assert (released.attempts, released.worker_id, released.history) == (0, "", [])
    assert retried.attempts == 1 and retried.history == [{"outcome": "RETRY"}]
    assert Task.objects.runnable().count() == 1  # the retry waits a minute
    delay = (retried.run_after - retried.last_attempted_at).total_seconds()
    assert 59 < delay < 61


def test_candidates_follow_priority_then_age():
    low = tasks.add.using(priority=-5).enqueue(1, 1)
    high = tasks.add.using(priority=50).enqueue(1, 1)
    mid = tasks.add.enqueue(1, 1)
    with connection.cursor() as cursor:
        found = dialect_for(connection).candidates(cursor, QUEUES, 10)
    ids = [str(dialect_for(connection).decode_id(c.id)) for c in found]
    assert ids == [high.id, mid.id, low.id]


def test_candidates_only_of_the_given_queues():
    tasks.add.enqueue(1, 1)
    tasks.send_email.enqueue("a@example.com")
    with connection.cursor() as cursor:
        dialect = dialect_for(connection)
        assert len(dialect.candidates(cursor, ["emails"], 10)) == 1
        assert len(dialect.candidates(cursor, ["default", "emails"], 10)) == 2
        assert dialect.candidates(cursor, ["other"], 10) == []
