"""The READY result enqueue returns, made without the dataclass's constructor."""

import dataclasses
import datetime as dt

from django_rdbtasks import results
from django_rdbtasks.compat import TaskResultStatus
from django_rdbtasks.results import READY_FIELDS, RDBTaskResult, ready_result
from tests.testapp import tasks


def by_constructor(task, result_id, enqueued_at, args, kwargs, backend):
    return RDBTaskResult(
        task=task,
        id=result_id,
        status=TaskResultStatus.READY,
        enqueued_at=enqueued_at,
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=[],
        worker_ids=[],
    )


def test_the_fast_way_serves_on_this_django():
    # Were the framework's TaskResult to change its fields, the constructor
    # would serve (correct, slower): this says which one runs.
    assert tuple(f.name for f in dataclasses.fields(RDBTaskResult)) == READY_FIELDS
    assert ready_result is not results.constructed_ready_result


def test_a_ready_result_equals_the_constructors_field_by_field():
    now = dt.datetime.now(dt.UTC)
    made = ready_result(tasks.add, "id-1", now, [1, {"a": [2]}], {"k": "v"}, "default")
    expected = by_constructor(tasks.add, "id-1", now, [1, {"a": [2]}], {"k": "v"}, "default")
    assert made == expected
    for field in dataclasses.fields(RDBTaskResult):
        assert getattr(made, field.name) == getattr(expected, field.name), field.name
    assert type(made) is RDBTaskResult
    assert made.status == TaskResultStatus.READY and not made.is_finished
    assert made.attempts == 0


def test_each_ready_result_has_lists_of_its_own_and_stays_frozen():
    now = dt.datetime.now(dt.UTC)
    first = ready_result(tasks.add, "a", now, [], {}, "default")
    second = ready_result(tasks.add, "b", now, [], {}, "default")
    assert first.errors is not second.errors and first.worker_ids is not second.worker_ids
    try:
        first.id = "changed"  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        pass
    else:
        raise AssertionError("a result is frozen")
    assert first.id == "a"


def test_a_running_result_equals_the_constructors_field_by_field():
    from django_rdbtasks.results import constructed_running_result, running_result

    now = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    later = now + dt.timedelta(seconds=5)
    arguments = (tasks.add, "id-2", now, later, later, [1, 2], {"k": "v"}, "default", ["w:1"])
    made, constructed = running_result(*arguments), constructed_running_result(*arguments)
    assert running_result is not constructed_running_result
    for field in dataclasses.fields(RDBTaskResult):
        assert getattr(made, field.name) == getattr(constructed, field.name), field.name
    assert made.status == "RUNNING" and made.errors == [] and made.errors is not constructed.errors
