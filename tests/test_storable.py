"""What every database stores (storable.py): the rule, and what enqueue refuses by it."""

import json
import os
import signal
import threading
import time

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from django_rdbtasks.backend import bulk_enqueue
from django_rdbtasks.compat import task_backends
from django_rdbtasks.exceptions import ArgumentsNotJSON, ValueNotStorable
from django_rdbtasks.models import Task
from django_rdbtasks.storable import (
    DEFAULT_MAX_ARGUMENTS_BYTES,
    StorageLimits,
    character_problem,
    encode_storable,
    may_hold_unstorable,
    problem_in,
    readable_text,
)
from tests.conftest import wait_until
from tests.testapp import tasks
from tests.testapp.models import SideEffect

UNSTORABLE_TEXTS = ["a\x00b", "\x00", "a\ud800b", "\udfff", "x\udc00\ud83d"]
STORABLE_TEXTS = [
    "",
    "plain",
    "é 漢字",
    "🎉 \U0010ffff",
    "\\u0000 as text",
    "\x01\x7f\u2028",
    "\ud7ff",
]


@pytest.mark.parametrize("text", UNSTORABLE_TEXTS)
def test_a_nul_or_a_lone_surrogate_is_named_where_it_is(text):
    problem = character_problem(text)
    assert problem is not None
    first = min(i for i, c in enumerate(text) if c == "\x00" or 0xD800 <= ord(c) <= 0xDFFF)
    assert f"at index {first}" in problem
    # The JSON text the worker and enqueue check says to look closer.
    assert may_hold_unstorable(json.dumps(text))
    assert problem_in({"k": [1, text]}, "args[0]") == f"args[0]['k'][1] {problem}"


@pytest.mark.parametrize("text", STORABLE_TEXTS)
def test_other_text_is_stored_as_it_is(text):
    assert character_problem(text) is None
    assert problem_in([text, {text: text}], "x") is None
    assert readable_text(text, 1000) == text


def test_a_key_is_checked_as_a_value_is():
    assert "has a key 'a\\x00'" in problem_in({"a\x00": 1}, "kwargs['m']")


def test_readable_text_escapes_what_no_database_stores_and_cuts_with_a_note():
    assert readable_text("bad byte: \x00 and \ud800", 1000) == "bad byte: \\x00 and \\ud800"
    cut = readable_text("é" * 50_000, 2000, "traceback")
    assert cut.startswith("é" * 100)
    assert "[traceback cut: 300,000 bytes as stored, over the limit of 2,000]" in cut
    assert len(json.dumps(cut)) - 2 <= 2000


def test_encode_storable_refuses_with_where_and_why():
    with pytest.raises(ValueNotStorable, match=r"the checkpoint\['s'\] holds a NUL"):
        encode_storable({"s": "\x00"}, "the checkpoint", 1000, "checkpoint")
    with pytest.raises(ValueNotStorable, match=r"MAX_CHECKPOINT_BYTES"):
        encode_storable("y" * 2000, "the checkpoint", 1000, "checkpoint")
    with pytest.raises(ValueError):  # not JSON at all: json's own error
        encode_storable(float("nan"), "the checkpoint", 1000, "checkpoint")
    assert encode_storable({"ok": "🎉"}, "the checkpoint", 1000, "checkpoint") == json.dumps(
        {"ok": "🎉"}
    )


# -- enqueue: refused on every database alike -----------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "args, kwargs, named",
    [
        (("a\x00b",), {}, "args[0] holds a NUL character (\\x00) at index 1"),
        ((), {"text": ["ok", "a\ud800"]}, "kwargs['text'][1] holds a lone UTF-16 surrogate"),
        (({"\x00k": 1},), {}, "args[0] has a key '\\x00k' that holds a NUL"),
    ],
)
def test_enqueue_refuses_what_a_database_would_refuse_naming_the_argument(args, kwargs, named):
    """Issue 37: ``length.enqueue("a\\x00b")`` raised PostgreSQL's raw DataError."""
    with pytest.raises(ArgumentsNotJSON) as refused:
        tasks.length.enqueue(*args, **kwargs)
    assert named in str(refused.value)
    assert isinstance(refused.value, TypeError)  # ArgumentsNotJSON, as documented
    with pytest.raises(ArgumentsNotJSON) as in_bulk:
        bulk_enqueue(tasks.length, [(("fine",), {}), (args, kwargs)])
    assert str(in_bulk.value).startswith("calls[1]: ") and named in str(in_bulk.value)
    assert not Task.objects.exists()  # nothing written, the first call's neither


@pytest.mark.django_db(transaction=True)
def test_enqueue_refuses_arguments_over_the_limit_naming_the_largest():
    with pytest.raises(ArgumentsNotJSON) as refused:
        tasks.length.enqueue("y" * DEFAULT_MAX_ARGUMENTS_BYTES)
    message = str(refused.value)
    assert f"over the limit of {DEFAULT_MAX_ARGUMENTS_BYTES:,}" in message
    assert "OPTIONS['MAX_ARGUMENTS_BYTES']" in message and "the largest, args[0]" in message
    assert not Task.objects.exists()
    # Just under it goes in, and comes back whole.
    result = tasks.length.enqueue("y" * (DEFAULT_MAX_ARGUMENTS_BYTES - 10))
    assert len(Task.objects.get(pk=result.id).args[0]) == DEFAULT_MAX_ARGUMENTS_BYTES - 10


@pytest.mark.django_db(transaction=True)
def test_what_is_accepted_is_stored_and_read_back_equal_on_this_database():
    texts = [*STORABLE_TEXTS, "\\u0000", "\\\\ud800"]
    result = tasks.length.enqueue(texts, {"k": texts})
    row = Task.objects.get(pk=result.id)
    assert row.args == [texts, {"k": texts}]


def test_the_limits_are_options_checked_by_the_backend():
    from django_rdbtasks.backend import RDBTaskBackend

    assert task_backends["default"].storage_limits == StorageLimits()
    assert StorageLimits().result < 4 * 1024 * 1024  # under every server's packet, MySQL 5.7's too
    backend = RDBTaskBackend(
        "limits",
        {"QUEUES": ["default"], "OPTIONS": {"MAX_RESULT_BYTES": "2048", "MAX_ERROR_BYTES": 10}},
    )
    assert backend.storage_limits.result == 2048  # text, as from the environment
    assert backend.option_errors == [
        "OPTIONS['MAX_ERROR_BYTES'] must be a whole number of at least 1024, not 10."
    ]
    assert not any(m.id == "django_rdbtasks.W001" for m in backend.check())  # known options


@pytest.mark.django_db(transaction=True)
def test_a_database_refusal_at_enqueue_is_not_reached(vendor):
    """The rule is the strictest database's: the value the others take is refused
    everywhere, before the statement, so SQLite in development agrees with production."""
    if vendor == "postgresql":
        # What PostgreSQL itself would say, for comparison.
        from django.db import DataError, transaction

        with pytest.raises(DataError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT %s::jsonb", [json.dumps("a\x00b")])
    with pytest.raises(ArgumentsNotJSON):
        tasks.length.enqueue("a\x00b")


# -- the cases of issue 37, in real worker processes -----------------------------------

ERROR_PATH = f"{ValueNotStorable.__module__}.{ValueNotStorable.__qualname__}"


def finished(*ids):
    rows = Task.objects.filter(pk__in=ids, status__in=["SUCCESSFUL", "FAILED"])
    return rows.count() == len(ids)


def stopped_promptly(worker, within=10.0):
    """SIGTERM: it exits well within its grace (30 s): nothing is left to write."""
    worker.signal(signal.SIGTERM)
    started = time.monotonic()
    assert worker.wait(60) == 0
    return time.monotonic() - started < within


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_nul_in_an_error_or_a_result_fails_its_task_and_the_round_goes_on(run_workers):
    """Issue 37: ``raise ValueError("bad byte: \\x00")`` (or ``return "a\\x00b"``) with
    three ordinary tasks, one thread: PostgreSQL refused the round, which was retried
    forever; the ordinary tasks stayed READY and SIGTERM waited out the grace."""
    bad_error = tasks.raises_nul.enqueue()
    bad_result = tasks.returns_nul.enqueue()
    ordinary = [tasks.record.enqueue(f"ordinary-{i}") for i in range(3)]
    ids = [bad_error.id, bad_result.id, *(o.id for o in ordinary)]
    # One round claims them all and writes their outcomes together.
    worker = run_workers(
        "--no-scheduler", "--threads", "1", "--batch", "5", "--poll-interval", "0.1"
    )
    wait_until(lambda: finished(*ids), timeout=30)
    later = tasks.record.enqueue("after")  # the lane still claims
    wait_until(lambda: finished(later.id), timeout=30)
    assert stopped_promptly(worker), worker.log()
    log = worker.log()
    assert "database error during" not in log, log
    row = Task.objects.get(pk=bad_error.id)
    assert (row.status, row.attempts) == ("FAILED", 1)
    [entry] = row.history
    # Its own class and its message, the NUL written so it can be stored and read.
    assert entry["exception_class_path"] == "builtins.ValueError"
    assert "ValueError: bad byte: \\x00" in entry["traceback"]
    row = Task.objects.get(pk=bad_result.id)
    assert (row.status, row.attempts, row.return_value) == ("FAILED", 1, None)
    assert row.history[-1]["exception_class_path"] == ERROR_PATH
    assert "holds a NUL character (\\x00) at index 1" in row.history[-1]["traceback"]
    assert tasks.returns_nul.get_result(bad_result.id).errors[0].exception_class is ValueNotStorable
    for result in [*ordinary, later]:
        assert Task.objects.get(pk=result.id).status == "SUCCESSFUL"
    # Nothing run twice for a data error.
    assert SideEffect.objects.filter(key="raises_nul").count() == 1
    assert SideEffect.objects.filter(key="returns_nul").count() == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("checked_in", ["python", "database"])
def test_a_result_bigger_than_the_server_takes_fails_its_task_once(run_workers, vendor, checked_in):
    """Issue 37, MariaDB: a task returning 17,000,000 bytes got "packet bigger than
    max_allowed_packet", retried until its lease lapsed, ran three times and ended
    WorkerLost, the cause never stored, a lane stuck. Now it fails once with the
    limit it hit: ``MAX_RESULT_BYTES`` (by default), or, with that set above the
    server's packet, the server's own refusal."""
    env = {}
    if checked_in == "database":
        if vendor != "mysql":
            pytest.skip("only MariaDB and MySQL refuse a statement for its size")
        env["RDBTASKS_TEST_MAX_RESULT_BYTES"] = str(40 * 1024 * 1024)
    big = tasks.returns_big.enqueue(17_000_000)
    ordinary = [tasks.record.enqueue(f"ordinary-{i}") for i in range(3)]
    ids = [big.id, *(o.id for o in ordinary)]
    worker = run_workers(
        "--no-scheduler", "--threads", "2", "--batch", "4", "--poll-interval", "0.1", env=env
    )
    wait_until(lambda: finished(*ids), timeout=60)
    later = tasks.record.enqueue("after")
    wait_until(lambda: finished(later.id), timeout=30)
    assert stopped_promptly(worker), worker.log()
    row = Task.objects.get(pk=big.id)
    assert (row.status, row.attempts, row.return_value) == ("FAILED", 1, None)
    assert SideEffect.objects.filter(key="returns_big").count() == 1
    [entry] = row.history
    assert entry["exception_class_path"] == ERROR_PATH
    if checked_in == "python":
        assert (
            "over the limit of 1,048,576 (the task backend's OPTIONS['MAX_RESULT_BYTES'])"
            in (entry["traceback"])
        )
    else:
        assert "the database refused to store this task's result" in entry["traceback"]
        assert "(MySQL error 1153)" in entry["traceback"]
        assert "max_allowed_packet is" in entry["traceback"]
    assert all(Task.objects.get(pk=o.id).status == "SUCCESSFUL" for o in [*ordinary, later])
    assert "WorkerLost" not in worker.log()


# -- a property across the databases ------------------------------------------------------

#: Small limits, so that generated payloads go over them too.
SMALL = StorageLimits(arguments=64 * 1024, result=3000, error=2000, checkpoint=3000)
ACTIONS = ["return", "raise", "progress", "checkpoint"]
#: The characters that matter, often; any other (surrogates included), now and then.
characters = st.one_of(
    st.sampled_from(["\x00", "\ud800", "\udfff", "\udc00", "🎉", "é", "\\", '"', "a"]),
    st.characters(exclude_categories=()),
)
texts = st.text(characters, max_size=12)
payloads = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
specs = st.lists(
    # A text alone, often: the message of an error is then the text itself.
    st.tuples(st.sampled_from(ACTIONS), texts | payloads, st.sampled_from([0, 0, 0, 2500])),
    min_size=1,
    max_size=5,
)


def unstorable(value):
    """The test's own reading of the rule: a NUL or a surrogate anywhere in a text."""
    if isinstance(value, str):
        return any(c == "\x00" or 0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, dict):
        return any(unstorable(k) or unstorable(v) for k, v in value.items())
    if isinstance(value, list):
        return any(unstorable(item) for item in value)
    return False


def escaped(text):
    return "".join(
        "\\x00" if c == "\x00" else f"\\u{ord(c):04x}" if 0xD800 <= ord(c) <= 0xDFFF else c
        for c in text
    )


def same_json(stored, value):
    """Equal as JSON, a number as its float: PostgreSQL's jsonb keeps a number as a
    decimal, so 7.549813657589843e+16 comes back as the int 75498136575898430."""
    if isinstance(value, float) or isinstance(stored, float):
        return isinstance(stored, int | float) and float(stored) == float(value)
    if isinstance(value, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(value)
            and all(same_json(a, b) for a, b in zip(stored, value, strict=True))
        )
    if isinstance(value, dict):
        return (
            isinstance(stored, dict)
            and stored.keys() == value.keys()
            and all(same_json(stored[k], value[k]) for k in value)
        )
    return stored == value and type(stored) is type(value)


def drain(batch):
    """A burst worker in this process, over everything enqueued: it must end."""
    from django_rdbtasks.worker import Worker

    worker = Worker(batch=batch, burst=True, poll_interval=0.05, listen=False)
    ended = []
    thread = threading.Thread(target=lambda: ended.append(worker.run(install_signals=False)))
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the worker stopped claiming (a lane stuck)"
    assert ended == [0]


def without_the_checks_in_python(monkeypatch):
    """What reaches the database unchecked: its own refusals are what the worker meets."""
    import django_rdbtasks.context
    import django_rdbtasks.db.base
    import django_rdbtasks.db.postgresql.dialect
    import django_rdbtasks.worker.execution

    monkeypatch.setattr(django_rdbtasks.worker.execution, "json_problem", lambda *a: None)
    monkeypatch.setattr(django_rdbtasks.worker.execution, "readable_text", lambda t, *a: t)
    monkeypatch.setattr(django_rdbtasks.worker.execution, "escape_unstorable", lambda t: t)
    monkeypatch.setattr(django_rdbtasks.db.base, "make_storable", lambda *a: None)
    monkeypatch.setattr(django_rdbtasks.db.postgresql.dialect, "make_storable", lambda *a: None)
    monkeypatch.setattr(
        django_rdbtasks.context, "encode_storable", lambda value, *a: json.dumps(value)
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("checks", ["in python", "by the database"])
@settings(
    max_examples=int(os.environ.get("RDBTASKS_TEST_EXAMPLES", 20)),
    deadline=None,
    database=None,
    # A failing example is printed as found: shrinking one (a worker run per
    # try) can take minutes, more than CI should spend on it.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(specs=specs)
def test_any_payload_ends_its_task_in_a_documented_state_and_stops_nothing_else(
    specs, checks, monkeypatch
):
    """Generated payloads through enqueue, a run, and a result, an error, progress or a
    checkpoint: every task ends SUCCESSFUL or FAILED, as the rule says; none is run
    again for a data error; the others of the same round finish; the worker drains."""
    Task.objects.all().delete()
    SideEffect.objects.all().delete()
    monkeypatch.setattr(task_backends["default"], "storage_limits", SMALL)
    if checks == "by the database":
        without_the_checks_in_python(monkeypatch)
    enqueued = []
    for n, (action, payload, pad) in enumerate(specs):
        # The payload as an argument: refused at enqueue exactly when the rule says.
        try:
            with transaction.atomic():
                tasks.length.enqueue(payload)
                transaction.set_rollback(True)
            refused = False
        except ArgumentsNotJSON:
            refused = True
        assert refused == unstorable(payload), payload
        # Carried as JSON text (storable whatever it holds), decoded by the task.
        result = tasks.handles_payload.enqueue(action, json.dumps(payload), pad, f"p{n}")
        value = [payload, "y" * pad] if pad else payload
        enqueued.append((result.id, action, value, f"p{n}"))
    ordinary = [tasks.record.enqueue(f"o{i}").id for i in range(2)]
    drain(batch=len(specs) + 2)  # one round claims them all and writes them together

    assert Task.objects.filter(pk__in=ordinary, status="SUCCESSFUL").count() == 2
    for task_id, action, value, key in enqueued:
        row = Task.objects.get(pk=task_id)
        runs = SideEffect.objects.filter(key=key).count()
        assert row.status in ("SUCCESSFUL", "FAILED"), (action, value, row.status)
        assert runs == row.attempts == len(row.history)
        errors = [e["exception_class_path"] for e in row.history if "exception_class_path" in e]
        if checks == "in python":  # else: stored as it is where the database takes it
            for entry in row.history:
                traceback = entry.get("traceback", "")
                assert not unstorable(traceback) and len(traceback) <= SMALL.error
        if action == "raise":  # the task's own error: retried as any, its class kept
            assert row.status == "FAILED" and runs <= 2
            assert set(errors) <= {"builtins.ValueError", ERROR_PATH}
            continue
        assert runs == 1, "run again for a data error"
        fits = len(json.dumps(value)) <= SMALL.result
        if row.status == "FAILED":
            assert errors == [ERROR_PATH]
            if checks == "in python" and action != "progress":
                assert unstorable(value) or not fits
            continue
        assert checks == "by the database" or action == "progress" or not unstorable(value)
        if action == "return":
            assert same_json(row.return_value, value)
        elif action == "checkpoint":
            assert same_json(row.checkpoint, value)
        else:
            message = escaped(str(value))[:200] if checks == "in python" else str(value)[:200]
            assert row.progress_message == message


@pytest.mark.django_db(transaction=True)
def test_a_key_computed_from_the_arguments_is_held_to_the_rule_and_its_column():
    from django_rdbtasks.compat import InvalidTask

    by_callable = tasks.sync_account.using()  # the same task, a key made by a callable
    object.__setattr__(by_callable, "dedup_key", lambda account: f"sync:{account}\x00")
    with pytest.raises(InvalidTask, match=r"Dedup key 'sync:a\\x00' holds a NUL"):
        by_callable.enqueue("a")
    with pytest.raises(InvalidTask, match="A dedup key is at most 255 characters"):
        tasks.sync_account.enqueue("y" * 300)
    assert not Task.objects.exists()
