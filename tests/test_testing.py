"""django_rdbtasks.testing: the in-process drain, the clock, the assertions, the fixture."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection, transaction
from django.test import TestCase

from django_rdbtasks.models import Job, Task
from django_rdbtasks.states import OutcomeKind, TaskStatus
from django_rdbtasks.testing import (
    Harness,
    TaskClock,
    TaskLeftTransactionOpen,
    assert_enqueued,
    assert_not_enqueued,
    captured_tasks,
    drain,
    tick_jobs,
)
from tests.testapp import periodic_tasks, tasks
from tests.testapp.models import SideEffect


def status_of(result) -> str:
    return Task.objects.get(pk=result.id).status


class DrainInATestCase(TestCase):
    """Inside the test's transaction, on the test's own connection."""

    def test_runs_what_is_enqueued_and_records_the_outcome(self):
        result = tasks.record.enqueue("a")
        report = drain()
        assert [(r.task_path, r.outcome) for r in report] == [
            ("tests.testapp.tasks.record", OutcomeKind.SUCCESS)
        ]
        assert report.succeeded[0].return_value == "a"
        assert SideEffect.objects.filter(key="a").count() == 1
        assert status_of(result) == TaskStatus.SUCCESSFUL
        got = tasks.record.get_result(result.id)
        assert got.return_value == "a"
        assert got.attempts == 1

    def test_the_connection_stays_the_tests(self):
        tasks.record.enqueue("b")
        before = connection.connection
        drain()
        assert connection.connection is before
        assert connection.in_atomic_block  # the test's transaction is still open
        # and usable:
        assert SideEffect.objects.count() == 1

    def test_a_failure_is_recorded_not_raised_unless_asked(self):
        result = tasks.always_fails.enqueue("nope")  # two attempts, no backoff
        report = drain()
        assert [r.outcome for r in report] == [OutcomeKind.RETRY, OutcomeKind.FAILURE]
        assert isinstance(report.retried[0].error, ValueError)
        assert [r.attempt for r in report] == [1, 2]
        assert status_of(result) == TaskStatus.FAILED
        again = tasks.always_fails.enqueue("raised")
        with pytest.raises(ValueError, match="raised"):
            drain(raise_errors=True)
        # Its outcome was written before the error was raised.
        assert Task.objects.get(pk=again.id).attempts == 1

    def test_a_task_that_leaves_an_atomic_block_open_is_reported(self):
        tasks.leaves_transaction_open.enqueue("x")
        with pytest.raises(TaskLeftTransactionOpen):
            drain()

    def test_until_idle_false_runs_only_what_was_runnable(self):
        tasks.add.enqueue(1, 2)
        tasks.add.enqueue(3, 4)
        report = drain(until_idle=False)
        assert sorted(r.return_value for r in report) == [3, 7]

    def test_queue_selects(self):
        tasks.send_email.enqueue("x@example.com")
        tasks.add.enqueue(1, 1)
        report = drain(queue="emails")
        assert [r.task_path for r in report] == ["tests.testapp.tasks.send_email"]
        with pytest.raises(ValueError, match="not among"):
            drain(queue="emals")


class ClockInATestCase(TestCase):
    def test_backoff_comes_due_only_when_the_clock_moves(self):
        with TaskClock() as clock:
            result = tasks.fails_with_default_backoff.enqueue()
            first = drain()
            assert [r.outcome for r in first] == [OutcomeKind.RETRY]
            # Its backoff (at least half a second) has not passed on the pinned clock,
            # however long this test takes.
            assert len(drain()) == 0
            clock.advance(seconds=10)
            second = drain()
        assert [r.outcome for r in second] == [OutcomeKind.FAILURE]
        assert Task.objects.get(pk=result.id).attempts == 2

    def test_deferred_task_runs_once_its_time_comes(self):
        with TaskClock() as clock:
            start = clock.now()
            tasks.record.using(run_after=start + dt.timedelta(hours=1)).enqueue("later")
            assert len(drain()) == 0
            clock.advance(minutes=59)
            assert len(drain()) == 0
            clock.advance(minutes=1)
            assert [r.return_value for r in drain()] == ["later"]

    def test_a_lapsed_lease_is_taken_over_as_a_lost_attempt(self):
        with TaskClock() as clock:
            result = tasks.record.enqueue("held")
            # A worker claims it and then stops renewing (here: nobody runs it).
            Task.objects.filter(pk=result.id).update(
                status=TaskStatus.RUNNING,
                attempts=1,
                version=1,
                worker_id="gone:1",
                lease_expires_at=clock.now() + dt.timedelta(seconds=30),
                started_at=clock.now(),
                last_attempted_at=clock.now(),
            )
            assert len(drain()) == 0  # the lease still holds
            clock.advance(31)
            report = drain()
        assert [r.outcome for r in report] == [OutcomeKind.SUCCESS]
        got = tasks.record.get_result(result.id)
        assert got.attempts == 2
        assert "WorkerLost" in got.errors[0].exception_class_path

    def test_cron_job_ticks_once_per_tick(self):
        at = dt.datetime(2030, 1, 1, 0, 1, tzinfo=dt.UTC)
        with TaskClock(at=at) as clock:
            job = Job.objects.get(name=periodic_tasks.heartbeat.module_path)
            assert job.next_run_at == dt.datetime(2030, 1, 1, 0, 5, tzinfo=dt.UTC)
            assert len(drain(jobs=True)) == 0
            clock.advance(minutes=4)
            report = drain(jobs=True)
            assert [r.task_path for r in report] == [periodic_tasks.heartbeat.module_path]
            assert len(drain(jobs=True)) == 0  # the same tick never again
            clock.advance(minutes=3)
            assert len(drain(jobs=True)) == 0  # 00:08: no tick due
            clock.advance(minutes=2)
            assert tick_jobs() == 1  # 00:10
            assert tick_jobs() == 0
            assert len(drain()) == 1

    def test_freeze_needs_an_aware_datetime(self):
        with pytest.raises(ValueError, match="aware"):
            TaskClock().freeze(dt.datetime(2030, 1, 1))
        with TaskClock() as clock, pytest.raises(ValueError, match="forward"):
            clock.advance(-1)

    def test_released_clock_is_the_servers_again(self):
        clock = TaskClock()
        clock.freeze(dt.datetime(2040, 1, 1, tzinfo=dt.UTC))
        assert clock.now().year == 2040
        clock.release()
        assert clock.now().year < 2040


class AssertionsInATestCase(TestCase):
    def test_captured_tasks_in_a_block(self):
        with captured_tasks() as captured:
            tasks.add.enqueue(1, 2)
            tasks.add.enqueue(1, 2)
            tasks.send_email.enqueue(to="a@example.com")
        captured.assert_enqueued(tasks.add, args=(1, 2), count=2)
        captured.assert_enqueued(tasks.send_email, kwargs={"to": "a@example.com"}, queue="emails")
        captured.assert_not_enqueued(tasks.add, args=[2, 1])
        with pytest.raises(AssertionError) as failure:
            captured.assert_enqueued(tasks.add, args=[5, 5])
        message = str(failure.value)
        assert "found 0" in message
        assert "tests.testapp.tasks.add(1, 2)" in message
        assert "tests.testapp.tasks.send_email(to='a@example.com')" in message
        tasks.add.enqueue(9, 9)  # after the block: not captured
        assert len(captured) == 3

    def test_assert_enqueued_reads_what_waits_in_the_database(self):
        assert_not_enqueued(tasks.record)
        tasks.record.enqueue("one")
        assert_enqueued(tasks.record, args=["one"], count=1)
        with pytest.raises(AssertionError, match="record\\('one'\\)"):
            assert_enqueued(tasks.record, args=["two"])
        drain()
        assert_not_enqueued(tasks.record)  # it ran: no longer waiting


class HarnessInATestCase(TestCase):
    def setUp(self):
        self.rdbtasks = Harness()
        self.addCleanup(self.rdbtasks.close)

    def test_the_harness_does_it_all(self):
        self.rdbtasks.freeze()
        tasks.fails_with_default_backoff.enqueue()
        self.rdbtasks.assert_enqueued(tasks.fails_with_default_backoff)
        assert [r.outcome for r in self.rdbtasks.drain()] == [OutcomeKind.RETRY]
        self.rdbtasks.advance(seconds=5)
        assert [r.outcome for r in self.rdbtasks.run_tasks()] == [OutcomeKind.FAILURE]


def test_the_pytest_fixture(rdbtasks):
    with rdbtasks.captured_tasks() as captured:
        tasks.add.enqueue(2, 3)
    captured.assert_enqueued(tasks.add, args=[2, 3])
    assert [r.return_value for r in rdbtasks.drain()] == [5]


@pytest.mark.django_db(transaction=True)
def test_the_fixture_in_a_transactional_test(rdbtasks):
    assert not transaction.get_connection().in_atomic_block
    tasks.record.enqueue("committed")
    assert [r.return_value for r in rdbtasks.drain()] == ["committed"]
    assert SideEffect.objects.filter(key="committed").count() == 1


class FeaturesThroughDrain(TestCase):
    """What the worker does besides running a body, done by drain() too."""

    def test_a_saga_compensates_in_reverse_order(self):
        from django_rdbtasks.states import WorkflowState
        from tests.testapp import saga_tasks

        results = saga_tasks.enqueue_order(11)
        report = drain()
        keys = list(SideEffect.objects.order_by("id").values_list("key", flat=True))
        assert keys.index("refund:11") < keys.index("release:11")
        assert keys.count("refund:11") == keys.count("release:11") == 1
        from django_rdbtasks.models import WorkflowStep

        workflow = WorkflowStep.objects.get(task_id=results["ship"].id).workflow
        assert workflow.state == WorkflowState.COMPENSATED
        assert Task.objects.get(pk=results["notify"].id).status == TaskStatus.CANCELLED
        assert [r.outcome for r in report.of(saga_tasks.ship)] == [
            OutcomeKind.RETRY,
            OutcomeKind.FAILURE,
        ]

    def test_a_dependant_runs_after_its_parent(self):
        from django_rdbtasks.dependencies import enqueue_after

        parent = tasks.record.enqueue("parent")
        enqueue_after([parent], tasks.record, "child")
        report = drain()
        assert [r.return_value for r in report] == ["parent", "child"]
        parent2 = tasks.always_fails.enqueue("x")
        child2 = enqueue_after([parent2], tasks.record, "never")
        drain()
        assert Task.objects.get(pk=child2.id).status == TaskStatus.CANCELLED

    def test_once_runs_an_effect_once_per_key(self):
        tasks.charge_order.enqueue(order_id=5, amount=10)
        tasks.charge_order.enqueue(order_id=5, amount=10)
        report = drain()
        assert [r.outcome for r in report] == [OutcomeKind.SUCCESS] * 2
        assert SideEffect.objects.filter(key="charge:5").count() == 1

    def test_dedup_keeps_one_waiting(self):
        first = tasks.sync_account.enqueue("acme")
        second = tasks.sync_account.enqueue("acme")
        assert first.id == second.id
        assert len(drain()) == 1

    def test_a_concurrency_limit_is_taken_and_given_back(self):
        for _ in range(5):
            tasks.per_tenant.enqueue("t1", 0)
        report = drain()
        assert [r.return_value for r in report] == ["t1"] * 5
        from django_rdbtasks.models import LimitSlot

        assert not LimitSlot.objects.filter(key="tenant:t1").exclude(holder_id=None).exists()

    def test_a_rate_window_turns_when_the_clock_moves(self):
        with TaskClock() as clock:
            for n in range(25):
                tasks.metered.enqueue(n)  # 20 starts an hour
            assert len(drain()) == 20
            assert len(drain()) == 0
            clock.advance(minutes=59)
            assert len(drain()) == 0
            # A rate slot comes free a period and the claim's start allowance
            # (a tenth of a second at least) after its claim.
            clock.advance(minutes=1, seconds=1)
            assert len(drain()) == 5

    def test_checkpoints_and_progress_are_written(self):
        result = tasks.reports_progress.enqueue(3)
        drain()
        row = Task.objects.get(pk=result.id)
        assert row.status == TaskStatus.SUCCESSFUL
        assert row.checkpoint == {"done": 3}
        assert row.progress is not None

    def test_task_finished_is_sent_once_per_task(self):
        from django_rdbtasks.compat import framework_signals

        finished = []

        def receive(sender, task_result, **kwargs):
            finished.append((task_result.id, task_result.status))

        framework_signals.task_finished.connect(receive)
        self.addCleanup(framework_signals.task_finished.disconnect, receive)
        ok = tasks.add.enqueue(1, 1)
        bad = tasks.always_fails.enqueue("no")
        drain()
        assert sorted(finished) == sorted([(ok.id, "SUCCESSFUL"), (bad.id, "FAILED")])

    def test_a_cancelled_task_does_not_run(self):
        result = tasks.record.enqueue("cancelled")
        tasks.record.get_backend().cancel(result.id)
        assert len(drain()) == 0
        assert not SideEffect.objects.filter(key="cancelled").exists()


# -- the in-process drain and the real worker write the same rows ------------------------


def _scenario() -> None:
    """Retries, a saga that compensates, a dependency, once(), a limit, a failure."""
    from django_rdbtasks.dependencies import enqueue_after
    from tests.testapp import saga_tasks

    tasks.fails_until.enqueue("flaky", 2)
    saga_tasks.enqueue_order(21)
    parent = tasks.record.enqueue("parent")
    enqueue_after([parent], tasks.record, "child")
    tasks.charge_order.enqueue(order_id=9, amount=1)
    tasks.charge_order.enqueue(order_id=9, amount=1)
    for _ in range(4):
        tasks.per_tenant.enqueue("t9", 0)
    tasks.always_fails.enqueue("for good")


def _rows() -> list[tuple]:
    """Every task row and side effect, without what differs run to run (ids, times, pids)."""
    from django_rdbtasks.models import Workflow as WorkflowRow

    tasks_ = sorted(
        (
            row.task_path,
            repr(row.args),
            repr(sorted(row.kwargs.items())),
            row.status,
            row.attempts,
            tuple(entry["outcome"] for entry in row.history),
            tuple(entry.get("exception_class_path", "") for entry in row.history),
            repr(row.return_value),
        )
        for row in Task.objects.all()
    )
    effects = sorted(SideEffect.objects.values_list("key", flat=True))
    workflows = sorted(WorkflowRow.objects.values_list("name", "state"))
    return [*tasks_, ("effects", *effects), ("workflows", *workflows)]


@pytest.mark.django_db(transaction=True)
def test_drain_writes_what_the_real_worker_writes(run_workers):
    _scenario()
    worker = run_workers("--burst", "--no-scheduler", "--poll-interval", "0.05")
    assert worker.wait(120) == 0, worker.log()
    by_worker = _rows()
    for model in (Task, SideEffect):
        model.objects.all().delete()
    from django_rdbtasks.models import JobRecord, LimitSlot
    from django_rdbtasks.models import Workflow as WorkflowRow

    WorkflowRow.objects.all().delete()
    LimitSlot.objects.all().delete()
    JobRecord.objects.all().delete()
    _scenario()
    drain()
    by_drain = _rows()
    assert by_drain == by_worker
    assert len(by_worker) > 10


# -- runworkers in a test: refused where it would be wrong, a good citizen elsewhere -----


def test_runworkers_refuses_the_open_transaction_of_a_testcase(db):
    from django.core.management import CommandError, call_command

    tasks.record.enqueue("unseen")
    before = connection.connection
    with pytest.raises(CommandError, match="open transaction"):
        call_command("runworkers", "--burst", "--no-scheduler")
    # Nothing was started, and the test's connection is untouched and usable.
    assert connection.connection is before
    assert Task.objects.filter(status=TaskStatus.READY).count() == 1


def test_runworkers_refuses_an_in_memory_sqlite_database(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "django", "runworkers", "--burst", "--no-scheduler"],
        env={
            **__import__("os").environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings_memory",
            "PYTHONPATH": str(ROOT),
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "in-memory SQLite" in done.stderr
    assert "started" not in done.stderr  # refused before any process ran


@pytest.mark.django_db(transaction=True)
def test_runworkers_in_a_transactional_test_returns_and_keeps_the_tests_connection():
    from django.core.management import call_command

    tasks.record.enqueue("seen")
    connection.ensure_connection()
    before = connection.connection
    assert (
        call_command("runworkers", "--burst", "--no-scheduler", "--poll-interval", "0.05") is None
    )
    assert connection.connection is before  # not closed behind the test's back
    assert SideEffect.objects.filter(key="seen").count() == 1
    assert Task.objects.get().status == TaskStatus.SUCCESSFUL
