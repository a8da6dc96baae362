"""The worker loop in real processes: signals at random moments, a frozen holder,
reclaim behind a backlog, and tasks handed back from behind a long one."""

import logging
import os
import random
import signal
import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.db.models import F

from django_rdbtasks.backend import bulk_enqueue
from django_rdbtasks.db import dialect_for
from django_rdbtasks.db.functions import DbNow
from django_rdbtasks.db.rows import ClaimRequest, Outcome
from django_rdbtasks.models import Task
from django_rdbtasks.states import ClaimMode, OutcomeKind
from django_rdbtasks.worker import Worker
from tests.conftest import wait_until
from tests.testapp import tasks
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db(transaction=True)


def public(raw_id):
    return str(dialect_for(connection).decode_id(raw_id))


def claim_as(worker_id, lease, mode=ClaimMode.OPTIMISTIC, want=1):
    with transaction.atomic(), connection.cursor() as cursor:
        rows, _ = dialect_for(connection).claim(
            cursor, ClaimRequest(["default"], want, worker_id, lease, mode)
        )
    return rows


@pytest.mark.slow
def test_sigterm_at_random_moments_every_worker_exits_within_its_grace(run_workers, vendor):
    count = 400 if vendor == "sqlite" else 1500
    bulk_enqueue(tasks.record_then_sleep, [((f"s{i}", 0.003), {}) for i in range(count)])
    grace = 5.0
    rng = random.Random(8)
    for round_ in range(10):
        threads = "1" if round_ % 2 == 0 else "4"
        workers = run_workers(
            "--threads",
            threads,
            "--grace",
            str(grace),
            "--poll-interval",
            "0.1",
            "--no-scheduler",
            new_session=True,
        )
        # Once its handlers are in place (before that a signal simply kills
        # it, as any program), anywhere: claims, runs, completions, idle polls.
        wait_until(lambda workers=workers: "started: queues" in workers.log(), timeout=60)
        time.sleep(rng.uniform(0.0, 1.0))
        started = time.monotonic()
        if round_ % 3 == 0:
            os.killpg(os.getpgid(workers.pid), signal.SIGTERM)  # the whole group at once
        else:
            workers.signal(signal.SIGTERM)  # the supervisor, which passes it on
        assert workers.wait(timeout=grace + 30) == 0, workers.log()
        assert time.monotonic() - started < grace + 3, workers.log()
    # Nothing was lost or run twice: a graceful stop finishes or releases every claim.
    assert not Task.objects.filter(status="RUNNING").exists()
    drain = run_workers("--burst", "--no-scheduler", "--log-level", "WARNING")
    assert drain.wait(timeout=300) == 0, drain.log()
    assert SideEffect.objects.count() == count
    assert SideEffect.objects.values("key").distinct().count() == count


@pytest.mark.slow
@pytest.mark.parametrize("mode", [ClaimMode.OPTIMISTIC, ClaimMode.SKIP_LOCKED])
def test_a_holder_frozen_before_its_commit_delays_only_its_own_task(run_workers, vendor, mode):
    if vendor == "sqlite":
        pytest.skip("SQLite has one writer: a frozen write transaction stops every writer")
    frozen = tasks.record.enqueue("frozen")
    [row] = claim_as("frozen-worker", lease=1.0)
    time.sleep(1.2)  # its lease has run out: the row is claimable again...
    holder = connections.create_connection("default")
    holder.set_autocommit(False)
    # ...but its holder is frozen between its fenced completion UPDATE and its
    # COMMIT, holding the row locked.
    with holder.cursor() as cursor:
        dialect_for(holder).finish(
            cursor,
            [Outcome(row.id, row.version, OutcomeKind.SUCCESS, entry={}, return_value=None)],
            "frozen-worker",
        )
    try:
        count = 2000
        bulk_enqueue(tasks.record, [((f"b{i}",), {}) for i in range(count)])
        workers = run_workers(
            "--processes",
            "2",
            "--mode",
            mode,
            "--poll-interval",
            "0.2",
            "--lease",
            "5",
            "--no-scheduler",
        )

        # The drain goes on at full speed around the locked row.
        def drained():
            return (
                not Task.objects.filter(status__in=["READY", "RUNNING"])
                .exclude(pk=frozen.id)
                .exists()
            )

        deadline = time.monotonic() + 180
        while not drained():
            if time.monotonic() > deadline:
                left = list(
                    Task.objects.exclude(status="SUCCESSFUL").values_list(
                        "status", "worker_id", "lease_expires_at"
                    )[:10]
                )
                pytest.fail(f"drain stalled; not done: {left}\n{workers.log()[-5000:]}")
            time.sleep(0.1)
        assert SideEffect.objects.filter(key__startswith="b").count() == count  # once each
        assert Task.objects.get(pk=frozen.id).status == "RUNNING"
        assert not SideEffect.objects.filter(key="frozen").exists()
    finally:
        holder.close()  # the session ends (as the server's idle timeout would end it)
    # Its task is then reclaimed like any whose holder died, and run once.
    wait_until(lambda: Task.objects.get(pk=frozen.id).status == "SUCCESSFUL", timeout=30)
    workers.stop()
    assert SideEffect.objects.filter(key="frozen").count() == 1
    assert Task.objects.get(pk=frozen.id).history[0]["outcome"] == "LOST"


@pytest.mark.slow
def test_a_dead_holders_task_runs_again_promptly_behind_a_20000_task_backlog(run_workers):
    backlog = 20_000
    bulk_enqueue(tasks.record, [((f"q{i}",), {}) for i in range(backlog)])
    # Enqueued last and with the lowest priority: every READY row sorts before it.
    lost = tasks.record.using(priority=-50).enqueue("lost")
    lease, poll = 2.0, 0.5
    Task.objects.filter(pk=lost.id).update(
        status="RUNNING",
        worker_id="dead:1:0:gone",
        version=F("version") + 1,
        attempts=1,
        last_attempted_at=DbNow(),
        started_at=DbNow(),
        lease_expires_at=DbNow() + __import__("datetime").timedelta(seconds=lease),
    )
    expires = Task.objects.get(pk=lost.id).lease_expires_at
    workers = run_workers(
        "--processes",
        "2",
        "--lease",
        str(lease),
        "--poll-interval",
        str(poll),
        "--no-scheduler",
        "--log-level",
        "WARNING",
    )
    wait_until(lambda: SideEffect.objects.filter(key="lost").exists(), timeout=120)
    workers.stop()
    row = Task.objects.get(pk=lost.id)
    # Every claim made once its lease had run out took it first: the only
    # backlog tasks claimed between the lease's end and its reclaim are those
    # of rounds already under way (two processes, one lane each, at most 200
    # claimed ahead per lane). Counted rather than timed: on a loaded machine
    # a worker whose queue is full makes its next claim only once half of it
    # has run, which took 19 s under CI's load.
    passed_over = (
        Task.objects.exclude(pk=lost.id)
        .filter(last_attempted_at__gt=expires, last_attempted_at__lt=row.last_attempted_at)
        .count()
    )
    assert row.last_attempted_at > expires
    # Each claim and each write after it adds one to the version: 4 is the lost
    # claim's reclaim and its success, anything more a hand-back between them.
    assert passed_over <= 2 * 200, (passed_over, row.version, row.history)
    # And it did not wait for the backlog: most of it was still to run.
    ran_before = SideEffect.objects.filter(
        id__lt=SideEffect.objects.get(key="lost").id, key__startswith="q"
    ).count()
    assert ran_before < backlog / 2


def test_tasks_claimed_behind_a_long_one_are_handed_back_unspent(caplog):
    # The long task only ends once both short ones have run: if they waited
    # behind it in its batch, it would time out and fail.
    long = tasks.waits_for.enqueue(["step:one", "step:two"], 20)
    shorts = [tasks.step.enqueue("one"), tasks.step.enqueue("two")]
    first = Worker(batch=3, burst=True, poll_interval=0.05, listen=False)
    caplog.set_level(logging.DEBUG, logger="django_rdbtasks.worker")
    thread = threading.Thread(target=first.run, kwargs={"install_signals": False})
    thread.start()
    try:
        # The first worker claimed all three at once and runs the long one first.
        wait_until(lambda: SideEffect.objects.filter(key="waiting").exists(), timeout=30)
        # While it runs, the two claimed behind it go back to READY, attempts unspent.
        wait_until(
            lambda: (
                Task.objects.filter(
                    pk__in=[s.id for s in shorts], status="READY", attempts=0
                ).count()
                == 2
            ),
            timeout=10,
        )
        assert Task.objects.get(pk=long.id).status == "RUNNING"
        second = Worker(batch=3, burst=True, poll_interval=0.05, listen=False)
        assert second.run(install_signals=False) == 0
    finally:
        thread.join(60)
    assert not thread.is_alive()
    long_row = Task.objects.get(pk=long.id)
    assert (long_row.status, long_row.attempts) == ("SUCCESSFUL", 1)
    assert "handing back 2" in caplog.text
    for short in shorts:
        row = Task.objects.get(pk=short.id)
        # Released unstarted: the attempt was given back, then run once elsewhere.
        assert (row.status, row.attempts, len(row.history)) == ("SUCCESSFUL", 1, 1)
        assert row.history[0]["worker_id"] != long_row.history[0]["worker_id"]
    assert SideEffect.objects.filter(key__startswith="step:").count() == 2


@pytest.mark.skipif(
    "connection.vendor == 'sqlite'", reason="SQLite has no row locks: a writer holds everything"
)
def test_a_burst_does_not_end_while_a_hand_back_is_still_being_written(caplog):
    # Claimed together, run in priority order: the first locks the last one's
    # row, the second runs long, so the keeper takes the last from behind it
    # and cannot write it back as READY while the row is locked. Until it can,
    # the row is RUNNING under the worker's own claim and no claim sees it: a
    # burst worker that took that for "drained" would leave it behind.
    short = tasks.step.using(priority=0).enqueue("behind")
    long = tasks.waits_for.using(priority=1).enqueue(["gate"], 20)
    tasks.locks_row.using(priority=2).enqueue(short.id)
    caplog.set_level(logging.DEBUG, logger="django_rdbtasks.worker")
    worker = Worker(batch=3, burst=True, poll_interval=0.05, listen=False)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        wait_until(lambda: "handing back 1" in caplog.text, timeout=30)
        assert len(tasks.held_row_locks) == 1
        SideEffect.objects.create(key="gate", pid=os.getpid())
        wait_until(lambda: Task.objects.get(pk=long.id).status == "SUCCESSFUL", timeout=30)
        assert Task.objects.get(pk=short.id).status == "RUNNING"  # not yet written back
        # Time for a lane that took the empty claim for "drained" to end
        # before the row can go back to READY.
        thread.join(1.0)
    finally:
        while tasks.held_row_locks:
            holder = tasks.held_row_locks.pop()
            holder.rollback()
            holder.close()
    thread.join(60)
    assert not thread.is_alive()
    row = Task.objects.get(pk=short.id)
    assert (row.status, row.attempts) == ("SUCCESSFUL", 1)
    assert SideEffect.objects.filter(key="step:behind").count() == 1


@pytest.mark.skipif(
    "connection.vendor == 'sqlite'", reason="SQLite has no row locks: a writer holds everything"
)
@pytest.mark.parametrize("mode", [ClaimMode.OPTIMISTIC, ClaimMode.SKIP_LOCKED])
def test_a_row_held_locked_holds_back_no_other_outcome_and_no_claim(mode, caplog):
    """Issue 19: one locked row used to make every outcome of its round, and the claim, wait."""
    caplog.set_level(logging.DEBUG, logger="django_rdbtasks.worker")
    held = tasks.waits_for.enqueue(["gate"], 30)
    # A lease of 4 s: renewals every 1.3 s, several while the row is held.
    worker = Worker(mode=mode, batch=4, lease=4.0, poll_interval=0.05, listen=False)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    holder = connections.create_connection("default")
    try:
        wait_until(lambda: SideEffect.objects.filter(key="waiting").exists(), timeout=30)
        # Another session (an operator's open transaction, say) locks the
        # row while the task runs, and keeps it locked as the task finishes.
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute(
                f"SELECT id FROM {Task._meta.db_table} WHERE id = %s FOR UPDATE",
                [Task._meta.pk.get_db_prep_value(Task.objects.get(pk=held.id).pk, holder)],
            )
        SideEffect.objects.create(key="gate", pid=os.getpid())
        others = [tasks.step.enqueue(f"other-{i}") for i in range(40)]
        # Every other task runs and is written, round after round, while the
        # row stays locked: nothing waits for it.
        wait_until(
            lambda: (
                Task.objects.filter(pk__in=[o.id for o in others], status="SUCCESSFUL").count()
                == len(others)
            ),
            timeout=30,
        )
        time.sleep(3.0)  # more rounds and renewals with the row still locked
        row = Task.objects.get(pk=held.id)
        assert (row.status, row.worker_id != "") == ("RUNNING", True)
        holder.rollback()
        # Free again: its outcome goes through in a later round, once.
        wait_until(lambda: Task.objects.get(pk=held.id).status == "SUCCESSFUL", timeout=10)
    finally:
        holder.rollback()
        holder.close()
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    row = Task.objects.get(pk=held.id)
    assert (row.attempts, row.return_value) == (1, "seen")
    assert SideEffect.objects.filter(key="waiting").count() == 1
    assert SideEffect.objects.filter(key__startswith="step:other-").count() == len(others)
    for failure in ("Lock wait timeout", "lock timeout", "failed (", "lease lost"):
        assert failure not in caplog.text, caplog.text
