"""Each task a worker runs is one log record, the worker's, governed by ``--log-level``.

The framework's receivers of ``task_started``/``task_finished`` wrote two more
(``Task id=... state=RUNNING``/``SUCCESSFUL``) through Django's default
logging, whatever ``runworkers --log-level`` said (issue 39).
"""

from __future__ import annotations

import datetime as dt
import logging
import re

import pytest

from django_rdbtasks.backend import RDBTaskBackend
from django_rdbtasks.compat import HAS_DJANGO_TASKS, framework_signals
from django_rdbtasks.models import Task
from django_rdbtasks.worker import Worker, task_logging
from tests.browser.support import make_task, now
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

FRAMEWORK_LOGGER = "django.tasks" if HAS_DJANGO_TASKS else "django_tasks"


def drain() -> None:
    assert Worker(burst=True).run(install_signals=False) == 0


def log_everything(caplog: pytest.LogCaptureFixture) -> None:
    """Every record at DEBUG, the framework's and the worker's (the test settings raise them)."""
    for name in (None, FRAMEWORK_LOGGER, "django_rdbtasks"):
        caplog.set_level(logging.DEBUG, logger=name)


def records_about(caplog: pytest.LogCaptureFixture, task_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if task_id in r.getMessage() and r.levelno >= logging.INFO]


def test_one_record_per_task_the_workers_carrying_what_the_frameworks_said(caplog) -> None:
    log_everything(caplog)
    ok = tasks.add.enqueue(1, 2)
    bad = tasks.always_fails.enqueue("boom")  # max_attempts=2: a retry, then a failure
    drain()
    [done] = records_about(caplog, ok.id)
    assert (done.name, done.levelno) == ("django_rdbtasks.worker", logging.INFO)
    assert re.fullmatch(
        rf"task {ok.id} tests\.testapp\.tasks\.add succeeded "
        r"\(ran [\d.]+(µs|ms|s), attempt 1 of 3\)",
        done.getMessage(),
    )
    retry, failure = records_about(caplog, bad.id)
    assert retry.levelno == logging.INFO and "will retry at once" in retry.getMessage()
    assert retry.getMessage().endswith("attempt 1 of 2): builtins.ValueError: boom")
    # The failure: at ERROR, with the task's exception and its own stack, as the
    # framework's record of it had them (an error tracker gets this one event).
    assert (failure.name, failure.levelno) == ("django_rdbtasks.worker", logging.ERROR)
    assert failure.getMessage().startswith(
        f"task {bad.id} tests.testapp.tasks.always_fails failed (ran "
    )
    assert failure.getMessage().endswith(", attempt 2 of 2)")
    assert failure.exc_info is not None and str(failure.exc_info[1]) == "boom"
    # Nothing from the framework's receivers of the two signals, at any level (its
    # DEBUG record of each enqueue, written where the task was enqueued, stays).
    framework = [r.getMessage() for r in caplog.records if r.name == FRAMEWORK_LOGGER]
    assert [m for m in framework if "enqueued backend=" not in m] == [], framework
    assert len(framework) == 2
    # Its start is the worker's DEBUG line, where the framework's was INFO.
    started = [r for r in caplog.records if r.getMessage().startswith(f"task {ok.id}")]
    assert [r.levelno for r in started] == [logging.DEBUG, logging.INFO]
    assert started[0].getMessage().endswith("started (attempt 1 of 3)")


def test_the_signals_are_still_sent_and_other_senders_records_still_written(caplog) -> None:
    log_everything(caplog)
    seen: list[str] = []

    def receiver(sender, task_result, **kwargs) -> None:
        seen.append(str(task_result.status))

    framework_signals.task_started.connect(receiver, weak=False)
    framework_signals.task_finished.connect(receiver, weak=False)
    try:
        result = tasks.add.enqueue(1, 2)
        drain()
        assert seen == ["RUNNING", "SUCCESSFUL"]
        # A signal sent by anything else in the process (another backend, running
        # a task in a request) is logged by the framework as before: the worker
        # drops only the records of the signals it sends itself.
        framework_signals.task_started.send(sender=type(self_backend()), task_result=result)
    finally:
        framework_signals.task_started.disconnect(receiver)
        framework_signals.task_finished.disconnect(receiver)
    [record] = [
        r for r in caplog.records if r.name == FRAMEWORK_LOGGER and "state=" in r.getMessage()
    ]
    assert record.getMessage() == (f"Task id={result.id} path=tests.testapp.tasks.add state=READY")


def test_the_frameworks_records_are_not_even_made_while_the_worker_sends(caplog) -> None:
    """Making a record (its caller's lookup, its clock) cost more than dropping it:
    the worker's sends make none of the framework's receivers' records."""
    log_everything(caplog)
    made: list[str] = []
    factory = logging.getLogRecordFactory()

    def counting(*args, **kwargs) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        if record.name == FRAMEWORK_LOGGER:
            made.append(record.getMessage())
        return record

    logging.setLogRecordFactory(counting)
    try:
        result = tasks.add.enqueue(1, 2)
        drain()
        assert [m for m in made if "state=" in m] == []
        framework_signals.task_started.send(sender=type(self_backend()), task_result=result)
    finally:
        logging.setLogRecordFactory(factory)
    assert [m for m in made if "state=" in m] == [
        f"Task id={result.id} path=tests.testapp.tasks.add state=READY"
    ]


def self_backend():
    return tasks.add.get_backend()


def test_an_abandoned_task_is_logged_with_the_attempt_it_lost(caplog) -> None:
    """Issue 39: a task taken over from a lost worker with no attempt left was logged
    ``(attempt 4/3)``: the claim's count, which the outcome gives back."""
    caplog.set_level(logging.INFO)
    moment = now() - dt.timedelta(minutes=5)
    row = make_task(
        "RUNNING",
        at=moment,
        task_path="tests.testapp.tasks.noop",
        args=[],
        attempts=3,
        max_attempts=3,
        lease_expires_at=moment + dt.timedelta(seconds=30),  # long lapsed
    )
    drain()
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("FAILED", 3)
    [record] = records_about(caplog, str(row.pk))[-1:]
    assert record.levelno == logging.ERROR
    message = record.getMessage()
    assert "failed (worker lost, no attempts left) (ran" in message
    assert "attempt 3 of 3)" in message and "attempt 4" not in message
    assert "WorkerLost: worker host-a:101:0:abcd stopped renewing its lease" in message


# -- runworkers in a project configured as startproject makes it, with a root handler ------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("root_level", "log_level", "lines_per_task"),
    [("INFO", "INFO", 1), ("INFO", "WARNING", 0), ("WARNING", "WARNING", 0)],
)
def test_runworkers_log_level_governs_every_per_task_record(
    run_workers, root_level, log_level, lines_per_task
) -> None:
    """A new project's settings (DEBUG on, Django's default logging, which sends the
    framework's logger to the console) and a root handler, as projects add one."""
    results = tasks.add.get_backend().bulk_enqueue(tasks.add, [((i, i), {}) for i in range(50)])
    ids = {result.id for result in results}
    failing = tasks.always_fails.enqueue("boom")
    workers = run_workers(
        "--burst",
        "--log-level",
        log_level,
        "--no-scheduler",
        env={
            "DJANGO_SETTINGS_MODULE": "tests.settings_startproject",
            "RDBTASKS_TEST_ROOT_LOG_LEVEL": root_level,
        },
    )
    assert workers.wait(timeout=120) == 0, workers.log()
    log = workers.log()
    lines = log.splitlines()
    assert Task.objects.filter(pk__in=ids, status="SUCCESSFUL").count() == 50
    assert not [line for line in lines if "state=" in line], log  # the framework's: none
    for task_id in ids:
        assert sum(task_id in line for line in lines) == lines_per_task, log
    # A failure is one ERROR record (its traceback below it) at every level.
    failed = [line for line in lines if failing.id in line]
    assert len(failed) == (2 if log_level == "INFO" else 1), log  # the retry's INFO line
    assert " failed (ran " in failed[-1] and failed[-1].endswith(", attempt 2 of 2)"), log
    after = log.split(failed[-1])[1]
    assert after.startswith("\nTraceback (most recent call last):"), log


def test_a_signal_whose_receivers_are_only_the_guards_is_not_sent(monkeypatch) -> None:
    """Sending it would call nothing: the worker skips Django's look-up of its receivers.
    A receiver connected, strongly or weakly, makes it sent again, from the next send."""
    task_logging.install()
    signal = framework_signals.task_started
    assert task_logging.only_guarded(signal)
    sent: list[object] = []
    monkeypatch.setattr(signal, "send", lambda sender, **named: sent.append(named))
    task_logging.send_signal(self_backend(), "task_started", "result")
    assert sent == []

    def receiver(sender, **kwargs) -> None:  # connected weakly: a weak reference in the list
        pass

    signal.connect(receiver)
    try:
        assert not task_logging.only_guarded(signal)
        task_logging.send_signal(self_backend(), "task_started", "result")
        assert sent == [{"task_result": "result"}]
    finally:
        signal.disconnect(receiver)
    assert task_logging.only_guarded(signal)


def test_a_backend_that_overrides_send_signal_is_called_for_every_task() -> None:
    """Only the framework's own sending is skipped where nobody listens: a subclass's
    ``send_signal`` (instrumentation of its own) is still called."""
    calls: list[str] = []

    class Instrumented(RDBTaskBackend):
        def send_signal(self, name, result) -> None:
            calls.append(name)

    task_logging.install()
    assert task_logging.only_guarded(framework_signals.task_finished)
    task_logging.send_signal(object.__new__(Instrumented), "task_finished", "result")
    assert calls == ["task_finished"]
