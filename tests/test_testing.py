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
            assert len(drain(jobs=False)) == 0
            clock.advance(minutes=59)
            assert len(drain(jobs=False)) == 0
            clock.advance(minutes=1)
            assert [r.return_value for r in drain(jobs=False)] == ["later"]

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
            assert len(drain()) == 0
            clock.advance(minutes=4)
            assert [r.task_path for r in drain()] == [periodic_tasks.heartbeat.module_path]
            assert len(drain()) == 0  # the same tick never again
            clock.advance(minutes=5)
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
