"""Task execution: a row in, an Outcome out. No database: the store is a fake, and
pytest-django refuses any query these tests would make."""

import datetime as dt
import threading
import uuid

import pytest
from django.db import DataError

from django_rdbtasks.compat import task_backends
from django_rdbtasks.context import UNSET, RDBTaskContext
from django_rdbtasks.db.rows import Candidate, ClaimedRow, Outcome
from django_rdbtasks.exceptions import HandOver, InvalidTaskPath, ValueNotStorable, WorkerLost
from django_rdbtasks.states import AttemptOutcome, OutcomeKind
from django_rdbtasks.storable import StorageLimits
from django_rdbtasks.worker.execution import Control, Executor, Running, history_entry

NOW = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)


class FakeStore:
    def __init__(self, held=True):
        self.progress = []
        self.notes = []
        self.held = held

    def public_id(self, raw_id):
        return str(raw_id)

    def save_progress(self, row, worker_id, **values):
        self.progress.append(values)
        return self.held

    def note_lost_attempt(self, row, worker_id, entry):
        self.notes.append(entry)
        return True


def claimed(path, *args, attempts=1, max_attempts=3, lost_from=None, **kwargs):
    return ClaimedRow(
        id=uuid.uuid4(),
        version=7,
        task_path=f"tests.testapp.tasks.{path}",
        args=list(args),
        kwargs=kwargs,
        attempts=attempts,
        max_attempts=max_attempts,
        queue_name="default",
        backend_name="default",
        priority=0,
        enqueued_at=NOW,
        started_at=NOW,
        claimed_at=NOW,
        run_after=NOW,
        history=[],
        lost_from=lost_from,
    )


def execute(row, store=None, **running):
    store = store or FakeStore()
    executor = Executor(
        task_backends["default"],
        store,
        lease=30,
        poll_interval=1,
        progress_interval=0,
        stopping=threading.Event(),
    )
    return executor.run(Running(row, "host:1:0:abc", **running)), store


def test_success_carries_its_value_and_one_history_entry():
    outcome, _ = execute(claimed("add", 2, 3))
    assert (outcome.kind, outcome.return_value, outcome.version) == (OutcomeKind.SUCCESS, 5, 7)
    assert outcome.entry["outcome"] == AttemptOutcome.SUCCESSFUL
    assert outcome.entry["worker_id"] == "host:1:0:abc" and outcome.entry["attempt"] == 1


@pytest.mark.parametrize(
    "claimed_at",
    [
        NOW,  # no microseconds: isoformat() leaves them out
        NOW.replace(microsecond=999_999),  # the end in the next second
        dt.datetime(2026, 12, 31, 23, 59, 59, 500_000, tzinfo=dt.UTC),  # and the next year
        NOW.astimezone(dt.timezone(dt.timedelta(hours=5, minutes=30))),  # not UTC
        NOW.replace(tzinfo=None),  # a project without USE_TZ: naive times
    ],
)
def test_the_entrys_times_are_the_claim_and_its_end_as_isoformat_gives_them(claimed_at):
    row = claimed("add", 1, 1)
    # Twice: the second time the claim's own text is the one kept (a round's
    # claims share their time), then another claim time.
    for moment, duration in ((claimed_at, 0.5), (claimed_at, 0.25), (NOW, 1e-6)):
        row.claimed_at = moment
        entry = history_entry(Running(row, "w"), duration, AttemptOutcome.SUCCESSFUL)
        assert entry["started_at"] == moment.isoformat()
        end = moment + dt.timedelta(seconds=duration)
        assert entry["finished_at"] == end.isoformat()


def test_an_exception_is_retried_while_attempts_remain_then_fails():
    retry, _ = execute(claimed("always_fails", "x", attempts=1, max_attempts=2))
    assert retry.kind == OutcomeKind.RETRY and retry.entry["outcome"] == AttemptOutcome.RETRY
    assert "ValueError" in retry.entry["exception_class_path"] or retry.error is not None
    assert "Traceback" in retry.entry["traceback"]
    failure, _ = execute(claimed("always_fails", "x", attempts=2, max_attempts=2))
    assert failure.kind == OutcomeKind.FAILURE and failure.kind.ends_task


def test_a_row_naming_no_task_fails_at_once():
    outcome, _ = execute(claimed("plain_function"))
    assert outcome.kind == OutcomeKind.FAILURE
    assert isinstance(outcome.error, InvalidTaskPath)


def test_a_return_value_that_is_not_json_is_a_type_error_naming_the_task():
    outcome, _ = execute(claimed("returns_object"))
    assert outcome.kind == OutcomeKind.FAILURE  # retrying cannot make it JSON
    assert type(outcome.error) is TypeError  # what the framework records, not a subclass
    assert "tests.testapp.tasks.returns_object" in str(outcome.error)
    assert "tasks.py" in str(outcome.error)
    assert outcome.error.__traceback__ is not None and outcome.error.__cause__ is not None


def test_a_takeover_records_the_lost_attempt_then_runs():
    lost = Candidate("x", 6, "RUNNING", "dead:1:0:zzz", NOW - dt.timedelta(minutes=1))
    outcome, store = execute(claimed("add", 1, 1, attempts=2, lost_from=lost))
    [note] = store.notes
    assert note["outcome"] == AttemptOutcome.LOST and note["worker_id"] == "dead:1:0:zzz"
    assert note["exception_class_path"] == f"{WorkerLost.__module__}.WorkerLost"
    assert outcome.kind == OutcomeKind.SUCCESS


def test_a_takeover_with_no_attempt_left_is_abandoned_unrun():
    lost = Candidate("x", 6, "RUNNING", "dead:1:0:zzz", NOW)
    outcome, store = execute(claimed("add", 1, 1, attempts=4, max_attempts=3, lost_from=lost))
    assert outcome.kind == OutcomeKind.ABANDON and not outcome.kind.spends_attempt
    assert store.notes == []


def test_progress_goes_to_the_store_fenced_and_a_refused_write_stops_the_task():
    outcome, store = execute(claimed("reports_progress", 3))
    assert outcome.return_value == "done"
    assert [p["progress"] for p in store.progress] == [1 / 3, 2 / 3, 1.0]
    assert store.progress[-1]["checkpoint"] == {"done": 3}
    # The claim is gone (the store's fenced write matched nothing): the task is
    # told to stop at its next look, and its result will be fenced off too.
    refused = FakeStore(held=False)
    running = Running(claimed("reports_progress", 3), "host:1:0:abc")
    executor = Executor(
        task_backends["default"],
        refused,
        lease=30,
        poll_interval=1,
        progress_interval=0,
        stopping=threading.Event(),
    )
    outcome = executor.run(running)
    assert running.lost and outcome.return_value == "stopped after 1"


def test_a_cancel_request_ends_the_task_cancelled():
    outcome, _ = execute(claimed("add", 1, 1), cancel=True)
    assert outcome.kind == OutcomeKind.CANCELLED and outcome.kind.ends_task


def test_outcome_kinds_say_what_they_do():
    assert not OutcomeKind.RELEASE.spends_attempt and OutcomeKind.RETRY.spends_attempt
    assert OutcomeKind.NOTE.status is None
    assert {k.status for k in OutcomeKind if k.ends_task} == {"SUCCESSFUL", "FAILED", "CANCELLED"}


def test_a_transaction_a_task_left_open_ends_with_the_task(transactional_db):
    """The task's connection is closed (its open transaction rolled back by the
    server), so the next task on the thread starts clean and nothing it left half
    done is committed by a later one."""
    from django.db import connection

    from tests.testapp.models import SideEffect

    outcome, _ = execute(claimed("leaves_transaction_open", "half"))
    assert outcome.kind == OutcomeKind.SUCCESS
    assert not connection.in_atomic_block
    execute(claimed("record", "next"))
    assert list(SideEffect.objects.values_list("key", flat=True)) == ["next"]


# -- what a database would refuse (issue 37) -------------------------------------------

NOT_STORABLE = "django_rdbtasks.exceptions.ValueNotStorable"


def test_a_result_no_database_stores_fails_the_task_unretried_naming_why():
    outcome, _ = execute(claimed("returns_built", "nul", attempts=1, max_attempts=3))
    assert outcome.kind == OutcomeKind.FAILURE and outcome.return_value is None
    assert isinstance(outcome.error, ValueNotStorable)
    assert "tests.testapp.tasks.returns_built" in str(outcome.error)
    assert "holds a NUL character (\\x00) at index 1" in str(outcome.error)
    assert outcome.entry["exception_class_path"] == NOT_STORABLE
    lone, _ = execute(claimed("returns_built", "surrogate", attempts=1, max_attempts=3))
    assert lone.kind == OutcomeKind.FAILURE and "lone UTF-16 surrogate" in str(lone.error)
    big, _ = execute(claimed("returns_built", "big", 1_999_998, attempts=1, max_attempts=3))
    assert big.kind == OutcomeKind.FAILURE
    assert "2,000,000 bytes as JSON, over the limit of 1,048,576" in str(big.error)


def test_an_error_keeps_its_class_and_a_readable_cut_message_and_is_retried_as_any():
    nul, _ = execute(claimed("raises_built", "nul", max_attempts=1))
    assert nul.kind == OutcomeKind.FAILURE
    assert nul.entry["exception_class_path"] == "builtins.ValueError"
    assert nul.entry["traceback"].endswith("ValueError: a\\x00b\n")
    huge, _ = execute(claimed("raises_built", "big", 5_000_000, attempts=1, max_attempts=2))
    assert huge.kind == OutcomeKind.RETRY  # its own error: retried as it would be
    traceback = huge.entry["traceback"]
    assert traceback.startswith("Traceback") and len(traceback) <= 64 * 1024
    assert traceback.endswith("over the limit of 65,536]")


def test_a_checkpoint_no_database_stores_fails_the_task_in_the_task():
    outcome, store = execute(claimed("checkpoints", "nul", attempts=1, max_attempts=3))
    assert outcome.kind == OutcomeKind.FAILURE  # not retried: retryable = False
    assert "the checkpoint holds a NUL character" in str(outcome.error)
    assert store.progress == []  # nothing sent to the database
    saved, store = execute(claimed("checkpoints", {"k": [1, "é"]}))
    assert saved.return_value == "saved" and store.progress[-1]["checkpoint"] == {"k": [1, "é"]}


def test_progress_the_database_refuses_fails_the_task_unretried():
    class RefusingStore(FakeStore):
        def save_progress(self, row, worker_id, **values):
            raise DataError("value too long for type character varying(200)")

    running = Running(claimed("reports_progress", 3, attempts=1, max_attempts=3), "host:1:0:abc")
    executor = Executor(
        task_backends["default"],
        RefusingStore(),
        lease=30,
        poll_interval=1,
        progress_interval=0,
        stopping=threading.Event(),
    )
    outcome = executor.run(running)
    assert outcome.kind == OutcomeKind.FAILURE  # whatever it returned; not retried
    assert "the database refused to store this task's progress" in str(outcome.error)
    assert "DataError" in str(outcome.error)


def test_a_progress_message_is_kept_readable_and_to_its_column():
    control = Control(FakeStore(), Running(claimed("add", 1, 1), "w"), interval=0)
    control.update(0.5, "a\x00b" + "c" * 300, UNSET, True)
    assert control.message == "a\\x00b" + "c" * 194 and len(control.message) == 200


def test_encoding_an_outcome_makes_whatever_slipped_through_storable(vendor_dialects):
    for dialect in vendor_dialects:
        outcome = Outcome(
            uuid.uuid4(),
            1,
            OutcomeKind.SUCCESS,
            entry={"attempt": 1, "outcome": "SUCCESSFUL", "detail": "key \x00 \ud800"},
            return_value={"ok": ["a\x00b"]},
            row=claimed("add", 1, 1),
        )
        dialect.encode_outcome(outcome, StorageLimits())
        assert outcome.kind == OutcomeKind.FAILURE and outcome.return_value is None
        assert outcome.entry["exception_class_path"] == NOT_STORABLE
        assert "the result['ok'][0] holds a NUL" in outcome.entry["traceback"]
        sent = outcome.wire or "".join(t or "" for t in outcome.texts)
        assert "\\u0000" not in sent and "\\ud800" not in sent
        plain = Outcome(uuid.uuid4(), 1, OutcomeKind.SUCCESS, entry={"a": "é"}, return_value=1)
        dialect.encode_outcome(plain, StorageLimits())
        assert plain.kind == OutcomeKind.SUCCESS and plain.entry == {"a": "é"}


@pytest.fixture
def vendor_dialects():
    """Every dialect, made without a connection: encoding needs none."""
    from django_rdbtasks.db.mysql import MySQLDialect
    from django_rdbtasks.db.postgresql import PostgreSQLDialect
    from django_rdbtasks.db.sqlite import SQLiteDialect

    return [object.__new__(cls) for cls in (PostgreSQLDialect, MySQLDialect, SQLiteDialect)]


def test_a_hand_over_delay_is_one_every_database_can_add_to_its_clock():
    control = Control(FakeStore(), Running(claimed("add", 1, 1), "w"), interval=0)
    context = RDBTaskContext(task_result=None, control=control)
    for bad in (-1, float("nan"), float("inf"), 1e12):
        with pytest.raises(ValueError, match="hand_over"):
            context.hand_over(delay=bad)
    with pytest.raises(HandOver):
        context.hand_over(delay=3600)
