"""The claim protocol's statements on a real database: CAS, leases, fencing."""

import dataclasses
import datetime as dt
import importlib
import time

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_rdbtasks.compat import task_backends
from django_rdbtasks.db import dialect_for
from django_rdbtasks.db.base import candidate_count
from django_rdbtasks.db.functions import DbNow
from django_rdbtasks.db.rows import ClaimRequest, NewBatch, Outcome, new_ids
from django_rdbtasks.models import Task, uuid7
from django_rdbtasks.models.ready import READY_DEFERRED, READY_FRESH
from django_rdbtasks.states import ClaimMode, OutcomeKind
from django_rdbtasks.worker.listener import parse_ready
from tests.conftest import listen_connection
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = ["default"]


def claim(worker_id, lease=30.0, limit=10, mode=ClaimMode.OPTIMISTIC, using=connection):
    dialect = dialect_for(using)
    with transaction.atomic(using=using.alias), using.cursor() as cursor:
        rows, _ = dialect.claim(cursor, ClaimRequest(QUEUES, limit, worker_id, lease, mode))
        return rows


def finish(worker_id, outcomes):
    dialect = dialect_for(connection)
    with transaction.atomic(), connection.cursor() as cursor:
        return set(dialect.finish(cursor, outcomes, worker_id))


def outcome(row, kind, **values):
    return Outcome(row.id, row.version, OutcomeKind(kind), **values)


def modes(vendor):
    return [ClaimMode.OPTIMISTIC] + ([ClaimMode.SKIP_LOCKED] if vendor != "sqlite" else [])


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
    with transaction.atomic(), connection.cursor() as cursor:
        chosen = dialect.lock_unchanged(cursor, found, 10)
        assert (dialect.claim_chosen(cursor, chosen, "w1", 30) if chosen else []) == []
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
        stale = outcome(old, kind, entry={"outcome": "stale"}, return_value=1)
        assert finish("old", [stale]) == set()
    task = Task.objects.get()
    assert (task.status, task.worker_id, task.version, task.history) == (
        "RUNNING",
        "new",
        new.version,
        [],
    )
    # The new holder's writes land.
    # (Each statement's ids as the worker reads them: PostgreSQL's as text.)
    ids = dialect_for(connection).public_id
    assert set(map(ids, renew("new", [new]))) == {ids(new.id)}
    done = outcome(new, "success", entry={"outcome": "SUCCESSFUL"}, return_value={"sum": 3})
    assert set(map(ids, finish("new", [done]))) == {ids(new.id)}
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
    stale = outcome(first, "success", entry={}, return_value=0)
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
            outcome(rows[0], "release"),
            outcome(rows[1], "retry", entry={"outcome": "RETRY"}, delay=60),
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


def test_fresh_and_deferred_rows_are_claimed_in_one_order(vendor):
    """Rows enqueued to run at once and rows due at a later time are in indexes apart
    (db/ready_arms.py); the claim still takes them all by priority, then ``run_after``."""
    for mode in modes(vendor):
        Task.objects.all().delete()
        backing_off = tasks.add.using(priority=5).enqueue(0, 0)
        [row] = claim("w", limit=1, mode=mode)
        assert finish("w", [outcome(row, "retry", entry={"outcome": "RETRY"}, delay=0.2)])
        first = tasks.add.enqueue(1, 1)
        soon = timezone.now() + dt.timedelta(seconds=0.2)
        scheduled = tasks.add.using(run_after=soon).enqueue(2, 2)
        tasks.add.using(priority=10, run_after=soon + dt.timedelta(hours=1)).enqueue(3, 3)
        time.sleep(0.4)
        last = tasks.add.enqueue(4, 4)
        low = tasks.add.using(priority=-5).enqueue(5, 5)
        # Fresh rows are all due: the claim reads them without a walk past later ones.
        assert not Task.objects.filter(READY_FRESH, run_after__gt=DbNow()).exists()
        assert Task.objects.filter(READY_DEFERRED, run_after__gt=DbNow()).count() == 1
        taken = []
        while found := claim(f"taker-{mode}", limit=1, mode=mode):
            taken += [str(dialect_for(connection).decode_id(r.id)) for r in found]
        assert taken == [backing_off.id, first.id, scheduled.id, last.id, low.id], mode


def test_candidates_only_of_the_given_queues():
    tasks.add.enqueue(1, 1)
    tasks.send_email.enqueue("a@example.com")
    with connection.cursor() as cursor:
        dialect = dialect_for(connection)
        assert len(dialect.candidates(cursor, ["emails"], 10)) == 1
        assert len(dialect.candidates(cursor, ["default", "emails"], 10)) == 2
        assert dialect.candidates(cursor, ["other"], 10) == []


def exchange(worker_id, outcomes, want, mode=ClaimMode.OPTIMISTIC):
    dialect = dialect_for(connection)
    request = ClaimRequest(QUEUES, want, worker_id, 30.0, mode) if want else None
    with transaction.atomic(), connection.cursor() as cursor:
        return dialect.exchange(cursor, outcomes, worker_id, request)


def test_exchange_writes_outcomes_and_claims_the_next_in_one_round(vendor):
    for mode in modes(vendor):
        Task.objects.all().delete()
        for i in range(4):
            tasks.add.enqueue(i, i)
        first = claim("w", limit=2, mode=mode)
        done = [
            outcome(r, "success", entry={"outcome": "SUCCESSFUL"}, return_value=1) for r in first
        ]
        result = exchange("w", done, want=2, mode=mode)
        # The round's ids as the worker reads them (PostgreSQL: text), the
        # claim's as this test's cursor does.
        ids = dialect_for(connection).public_id
        assert set(map(ids, result.written)) == {ids(r.id) for r in first}
        claimed = {ids(r.id) for r in result.claimed}
        assert len(claimed) == 2 and not claimed & set(map(ids, result.written))
        rest = [outcome(r, "success", entry={}, return_value=2) for r in result.claimed]
        assert set(map(ids, exchange("w", rest, want=0).written)) == claimed
        assert Task.objects.filter(status="SUCCESSFUL").count() == 4


def test_exchange_is_fenced_a_stale_completion_matches_nothing_and_the_claim_still_works(vendor):
    tasks.add.enqueue(1, 2)
    for mode in modes(vendor):
        [old] = claim("w", lease=0.2, mode=mode)
        time.sleep(0.4)
        [taken] = claim("other", mode=mode)  # reclaimed: "w" is now stale
        fresh = tasks.add.enqueue(3, 4)
        stale = outcome(old, "success", entry={"outcome": "stale"}, return_value=0)
        result = exchange("w", [stale], want=5, mode=mode)
        assert result.written == {}
        assert [str(dialect_for(connection).decode_id(r.id)) for r in result.claimed] == [fresh.id]
        row = Task.objects.get(pk=dialect_for(connection).decode_id(taken.id))
        assert (row.status, row.worker_id, row.version, row.history) == (
            "RUNNING",
            "other",
            taken.version,
            [],
        )
        Task.objects.all().delete()
        tasks.add.enqueue(1, 2)


def test_expired_leases_are_claimed_before_any_backlog(vendor):
    lost = tasks.add.using(priority=-100).enqueue(0, 0)
    claim("dead", lease=0.2)
    for i in range(30):
        tasks.add.using(priority=100).enqueue(i, i)
    time.sleep(0.4)
    holder = "dead"
    for mode in modes(vendor):
        [first] = claim(f"alive-{mode}", limit=1, mode=mode)
        assert str(dialect_for(connection).decode_id(first.id)) == lost.id
        assert first.lost_from is not None and first.lost_from.worker_id == holder
        holder = f"alive-{mode}"
        Task.objects.filter(pk=lost.id).update(lease_expires_at=DbNow())
        time.sleep(0.01)


def test_a_claim_skips_a_row_another_session_holds_locked_and_never_waits(vendor):
    """A frozen holder between its UPDATE and its COMMIT must delay only its own task."""
    if vendor == "sqlite":
        pytest.skip("SQLite has no row locks: one writer holds the whole database")
    frozen = tasks.add.enqueue(1, 1)
    other = tasks.add.using(priority=-1).enqueue(2, 2)
    holder = connections.create_connection("default")
    bounded = connections.create_connection("default")
    try:
        with bounded.cursor() as cursor:  # if the claim waited, fail in 5 s, not hang
            if vendor == "postgresql":
                cursor.execute("SET lock_timeout = '5s'")
            else:
                cursor.execute("SET SESSION innodb_lock_wait_timeout = 5")
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute(
                f"UPDATE {Task._meta.db_table} SET progress = 0.5 WHERE id = %s",
                [dialect_for(holder).encode_id(frozen.id) if vendor != "postgresql" else frozen.id],
            )
        for mode in modes(vendor):
            rows = claim("w", mode=mode, using=bounded)
            assert [str(dialect_for(bounded).decode_id(r.id)) for r in rows] == [other.id]
            Task.objects.filter(pk=other.id).update(status="READY", version=F("version") + 1)
        holder.rollback()  # the holder's session ends: its row is free again
        rows = claim("w", using=bounded)
        assert {str(dialect_for(bounded).decode_id(r.id)) for r in rows} == {frozen.id, other.id}
    finally:
        holder.close()
        bounded.close()


# -- PostgreSQL's enqueue function (migration 0005) ---------------------------------------

ENQUEUE_MIGRATION = importlib.import_module("django_rdbtasks.migrations.0017_enqueue_function_v2")
#: Columns an enqueue decides; the rest are the clock's, the id, or left NULL.
ENQUEUED_COLUMNS = [
    field.attname
    for field in Task._meta.concrete_fields
    if field.attname not in {"id", "enqueued_at", "run_after", "dedup_key", "active_dedup_key"}
]


@pytest.fixture
def enqueue_function(vendor):
    """The PostgreSQL dialect's inserts, its function looked up afresh before and after."""
    if vendor != "postgresql":
        pytest.skip("the enqueue function is PostgreSQL's; elsewhere the row is inserted")
    dialect = dialect_for(connections["default"]).inserts
    dialect._has_enqueue_function.clear()
    yield dialect
    dialect._has_enqueue_function.clear()


def insert_one(dialect, new, *, by_function, notify=True):
    dialect._has_enqueue_function[next(iter(dialect._has_enqueue_function))] = by_function
    with connection.cursor() as cursor:
        return dialect.insert_tasks(cursor, [new], notify)


def test_the_enqueue_function_writes_the_row_a_plain_insert_writes(enqueue_function):
    dialect = enqueue_function
    with connection.cursor() as cursor:
        assert dialect.enqueue_function_exists(cursor)
    backend = task_backends["default"]
    later = timezone.now() + dt.timedelta(minutes=5)
    waiting = backend.enqueuer.new_task(tasks.add, [1], {"b": [2, {"c": None}]})
    waiting.status, waiting.waiting_on, waiting.on_parent_failure = "WAITING", 2, "FAILED"
    variants = [
        backend.enqueuer.new_task(tasks.add, [1, "é 🎉"], {}),
        backend.enqueuer.new_task(tasks.send_email.using(run_after=later), ["a@example.com"], {}),
        backend.enqueuer.new_task(tasks.add, [], {"a": 1}, job_name="nightly"),
        dataclasses.replace(backend.enqueuer.new_task(tasks.add, [3], {}), dedup_key="invoice:3"),
        dataclasses.replace(
            backend.enqueuer.new_task(tasks.add, [4], {}),
            trace_context='{"traceparent": "00-ab-cd-01"}',
        ),
        waiting,
    ]
    for new in variants:
        twin = dataclasses.replace(new, id=uuid7(), dedup_key=new.dedup_key and "twin")
        by_function = insert_one(dialect, new, by_function=True)
        by_insert = insert_one(dialect, twin, by_function=False)
        rows = {row.id: row for row in Task.objects.filter(pk__in=[new.id, twin.id])}
        first, second = rows[new.id], rows[twin.id]
        assert [getattr(first, c) for c in ENQUEUED_COLUMNS] == [
            getattr(second, c) for c in ENQUEUED_COLUMNS
        ], new
        # The function's clock comes back exactly, as microseconds since the epoch.
        assert (first.enqueued_at, second.enqueued_at) == (by_function, by_insert)
        for row, sent in ((first, new), (second, twin)):
            assert row.run_after == (sent.run_after or row.enqueued_at)
            assert row.dedup_key == sent.dedup_key
            assert row.active_dedup_key == (sent.dedup_key if row.status != "WAITING" else None)


def test_without_the_enqueue_function_an_enqueue_inserts_the_row_and_still_notifies(
    enqueue_function,
):
    """A test database made without migrations has no function: the plain INSERT serves."""
    dialect = enqueue_function
    params = listen_connection().get_connection_params()
    with connection.cursor() as cursor:
        cursor.execute(f"DROP FUNCTION {ENQUEUE_MIGRATION.SIGNATURE}")
    try:
        with psycopg.connect(
            **{k: v for k, v in params.items() if k != "cursor_factory"}, autocommit=True
        ) as listener:
            listener.execute("LISTEN rdbtasks_ready")
            with CaptureQueriesContext(connection) as queries:
                result = tasks.send_email.enqueue("x@example.com")
                tasks.send_email.enqueue("y@example.com")
            payloads = [n.payload for n in listener.notifies(timeout=2, stop_after=2)]
        assert [parse_ready(p)[:2] for p in payloads] == [("emails", 10), ("emails", 10)]
        statements = [q["sql"] for q in queries.captured_queries]
        # Looked up once, then plain INSERTs.
        assert sum("to_regprocedure" in sql for sql in statements) == 1, statements
        assert sum(sql.startswith("INSERT INTO") for sql in statements) == 2, statements
        row = Task.objects.get(pk=result.id)
        assert (row.args, row.status, row.enqueued_at) == (
            ["x@example.com"],
            "READY",
            result.enqueued_at,
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute(ENQUEUE_MIGRATION.CREATE)
    dialect._has_enqueue_function.clear()
    with connection.cursor() as cursor:
        assert dialect.enqueue_function_exists(cursor)


def test_a_row_another_session_holds_locked_is_kept_not_waited_for(vendor):
    """A key-share lock (a foreign key's check, as once() holds in its transaction)
    never stops a renewal on PostgreSQL; a row held for update is kept (busy),
    and nothing waits for it."""
    if vendor == "sqlite":
        pytest.skip("SQLite has no row locks: one writer holds the whole database")
    tasks.add.enqueue(1, 1)
    tasks.add.enqueue(2, 2)
    rows = claim("w", lease=30)
    held, other = rows
    holder = connections.create_connection("default")
    try:
        holder.set_autocommit(False)
        key_share = "FOR KEY SHARE" if vendor == "postgresql" else "LOCK IN SHARE MODE"
        for lock, renewed in ((key_share, vendor == "postgresql"), ("FOR UPDATE", False)):
            with holder.cursor() as cursor:
                cursor.execute(
                    f"SELECT id FROM {Task._meta.db_table} WHERE id = %s {lock}",
                    [dialect_for(holder).encode_id(dialect_for(holder).decode_id(held.id))],
                )
            before = Task.objects.get(pk=dialect_for(connection).decode_id(held.id))
            # Had the renewal waited for the lock, it would fail, not hang.
            with connection.cursor() as cursor:
                if vendor == "postgresql":
                    cursor.execute("SET lock_timeout = '5s'")
                else:
                    cursor.execute("SET SESSION innodb_lock_wait_timeout = 5")
            ids = dialect_for(connection).public_id
            still = set(map(ids, renew("w", rows, lease=60)))
            assert still == {ids(held.id), ids(other.id)}  # both still ours
            after = Task.objects.get(pk=before.pk)
            assert (after.lease_expires_at > before.lease_expires_at) == renewed, lock
            holder.rollback()
    finally:
        holder.rollback()
        holder.close()


def test_a_batch_by_copy_and_by_psycopg2s_json_insert_writes_the_same_rows(vendor):
    if vendor != "postgresql":
        pytest.skip("COPY is PostgreSQL's; elsewhere a batch is multi-row INSERTs")

    class WithoutCopy:
        """A cursor as psycopg 2's: execute and fetch, no ``copy()``."""

        def __init__(self, cursor):
            self.inner = cursor

        def execute(self, sql, params=None):
            return self.inner.execute(sql, params)

        def fetchone(self):
            return self.inner.fetchone()

    dialect = dialect_for(connections["default"])
    later = timezone.now() + dt.timedelta(minutes=5)
    for run_after, trace in ((None, None), (later, '{"traceparent": "00-ab-cd-01"}')):
        batches = [
            NewBatch(
                task_path="tests.testapp.tasks.add",
                queue_name="emails",
                backend_name="default",
                priority=-7,
                max_attempts=4,
                run_after=run_after,
                ids=new_ids(2),
                args_json=[r'[1, "a\\b"]', "[]"],
                kwargs_json=[r'{"k": "\t"}', "{}"],
                trace_context=trace,
            )
            for _ in range(2)
        ]
        with transaction.atomic(), connection.cursor() as cursor:
            by_copy = dialect.inserts.insert_batch(cursor, batches[0], notify=True)
            by_insert = dialect.inserts.insert_batch(WithoutCopy(cursor), batches[1], notify=True)
        for batch, enqueued_at in ((batches[0], by_copy), (batches[1], by_insert)):
            rows = list(Task.objects.filter(pk__in=batch.ids).order_by("kwargs"))
            assert [row.args for row in rows] == [[], [1, "a\\b"]]
            assert [row.kwargs for row in rows] == [{}, {"k": "\t"}]
            for row in rows:
                assert row.enqueued_at == enqueued_at
                assert row.run_after == (run_after or enqueued_at)
                assert row.requested_run_after == run_after
        copied, inserted = (
            [
                [getattr(row, c) for c in ENQUEUED_COLUMNS if c not in {"args", "kwargs"}]
                for row in Task.objects.filter(pk__in=batch.ids)
            ]
            for batch in batches
        )
        assert copied == inserted


def test_an_optimistic_claim_reads_half_again_its_batch_and_at_least_three_more():
    # A batch of one keeps the reserve it had at four times the batch.
    assert [candidate_count(want) for want in (1, 6, 10, 400)] == [4, 9, 15, 600]
