"""OpenTelemetry spans (observability/tracing.py), with the real SDK and its
in-memory exporter: a traced enqueue stores its PRODUCER span's context in the
row, and the worker's CONSUMER span around the run is its child and links to
it; a failure marks the run span ERROR; nothing traced, nothing stored."""

import json
import os
import subprocess
import sys

import pytest
from django.db import transaction
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_rdbtasks.backend import bulk_enqueue
from django_rdbtasks.compat import framework_signals
from django_rdbtasks.models import Task
from django_rdbtasks.worker import Worker
from tests.conftest import ROOT
from tests.test_execution import execute
from tests.testapp import tasks

PATH = "tests.testapp.tasks"


@pytest.fixture(scope="module")
def provider():
    # The global provider can be set once per process: reuse one if set.
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        current = TracerProvider()
        trace.set_tracer_provider(current)
    return current


@pytest.fixture
def exporter(provider):
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # the processor stays; a shut exporter drops what it is given


@pytest.fixture
def tracer(provider):
    return provider.get_tracer("tests")


def burst():
    """Run what is runnable in this process, through the real worker loop."""
    worker = Worker(burst=True, listen=False, poll_interval=0.05)
    assert worker.run(install_signals=False) == 0
    return worker


def traceparent_ids(traceparent):
    """The trace and span ids of a W3C ``traceparent`` (version-trace-span-flags)."""
    version, trace_id, span_id, _flags = traceparent.split("-")
    assert version == "00"
    return int(trace_id, 16), int(span_id, 16)


def spans_named(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


@pytest.mark.django_db(transaction=True)
def test_the_run_span_is_the_child_of_the_enqueue_span_and_links_to_it(exporter, tracer):
    seen = []

    def started(sender, task_result, **kwargs):
        seen.append(trace.get_current_span().get_span_context())

    signal = framework_signals.task_started
    signal.connect(started)
    try:
        with tracer.start_as_current_span("request") as request:
            result = tasks.add.enqueue(2, 3)
        worker = burst()
    finally:
        signal.disconnect(started)

    (enqueue,) = spans_named(exporter, f"enqueue {PATH}.add")
    assert enqueue.kind == SpanKind.PRODUCER
    assert enqueue.parent.span_id == request.get_span_context().span_id
    assert enqueue.attributes["messaging.operation.type"] == "create"
    assert enqueue.attributes["messaging.message.id"] == result.id
    # The row carries the enqueue span's context, in W3C form.
    stored = Task.objects.get(pk=result.id).trace_context
    ctx = enqueue.context
    assert traceparent_ids(stored["traceparent"]) == (ctx.trace_id, ctx.span_id)

    (run,) = spans_named(exporter, f"run {PATH}.add")
    assert run.kind == SpanKind.CONSUMER
    assert run.context.trace_id == ctx.trace_id
    assert run.parent.span_id == ctx.span_id
    assert [link.context.span_id for link in run.links] == [ctx.span_id]
    assert run.status.status_code == StatusCode.UNSET
    attributes = dict(run.attributes)
    assert attributes["messaging.message.id"] == result.id
    assert attributes["messaging.destination.name"] == "default"
    assert attributes["messaging.system"] == "django_rdbtasks"
    assert attributes["rdbtasks.task.path"] == f"{PATH}.add"
    assert attributes["rdbtasks.task.attempt"] == 1
    assert attributes["rdbtasks.outcome"] == "success"
    assert attributes["messaging.client.id"].startswith(f"{worker.name}:")
    assert Task.objects.get(pk=result.id).worker_ids == [attributes["messaging.client.id"]]
    # The run span is current while the task runs: the task's own spans nest under it.
    assert [c.span_id for c in seen] == [run.context.span_id]


@pytest.mark.django_db(transaction=True)
def test_each_failed_attempt_is_an_error_span_linked_to_the_same_enqueue(exporter, tracer):
    with tracer.start_as_current_span("request"):
        result = tasks.always_fails.enqueue("boom")
    burst()
    (enqueue,) = spans_named(exporter, f"enqueue {PATH}.always_fails")
    runs = sorted(
        spans_named(exporter, f"run {PATH}.always_fails"),
        key=lambda s: s.attributes["rdbtasks.task.attempt"],
    )
    # max_attempts=2: a retry, then the failure.
    assert [s.attributes["rdbtasks.task.attempt"] for s in runs] == [1, 2]
    assert [s.attributes["rdbtasks.outcome"] for s in runs] == ["retry", "failure"]
    for run in runs:
        assert run.status.status_code == StatusCode.ERROR
        assert "boom" in run.status.description
        assert run.attributes["error.type"] == "builtins.ValueError"
        (event,) = [e for e in run.events if e.name == "exception"]
        assert event.attributes["exception.type"] == "ValueError"
        assert [link.context.span_id for link in run.links] == [enqueue.context.span_id]
        assert run.parent.span_id == enqueue.context.span_id
    assert Task.objects.get(pk=result.id).status == "FAILED"


@pytest.mark.django_db(transaction=True)
def test_a_bulk_enqueue_is_one_publish_span_whose_context_every_row_carries(exporter, tracer):
    with tracer.start_as_current_span("request"):
        results = bulk_enqueue(tasks.add, [((i, i), {}) for i in range(3)])
    (publish,) = spans_named(exporter, f"enqueue {PATH}.add")
    assert publish.attributes["messaging.operation.type"] == "publish"
    assert publish.attributes["messaging.batch.message_count"] == 3
    stored = {
        traceparent_ids(row.trace_context["traceparent"])
        for row in Task.objects.filter(pk__in=[r.id for r in results])
    }
    assert stored == {(publish.context.trace_id, publish.context.span_id)}
    burst()
    runs = spans_named(exporter, f"run {PATH}.add")
    assert len(runs) == 3
    assert {run.parent.span_id for run in runs} == {publish.context.span_id}


@pytest.mark.django_db(transaction=True)
def test_a_traced_enqueue_rolled_back_leaves_no_row(exporter, tracer):
    with tracer.start_as_current_span("request"):
        with pytest.raises(RuntimeError), transaction.atomic():
            result = tasks.add.enqueue(1, 1)
            raise RuntimeError("rolled back")
    assert not Task.objects.filter(pk=result.id).exists()
    # The span ended with the insert, before the rollback it could not know of.
    (enqueue,) = spans_named(exporter, f"enqueue {PATH}.add")
    assert enqueue.status.status_code == StatusCode.UNSET


@pytest.mark.django_db(transaction=True)
def test_an_untraced_enqueue_stores_nothing_and_its_run_is_a_root_span(exporter, tracer):
    result = tasks.add.enqueue(2, 2)  # no span is current
    assert Task.objects.get(pk=result.id).trace_context is None
    assert not spans_named(exporter, f"enqueue {PATH}.add")
    # Nor a sampled-out span's: only a recording span's context is stored.
    sampled_out = trace.SpanContext(
        trace_id=0x1234, span_id=0x5678, is_remote=True, trace_flags=trace.TraceFlags(0)
    )
    with trace.use_span(trace.NonRecordingSpan(sampled_out)):
        other = tasks.add.enqueue(3, 3)
    assert Task.objects.get(pk=other.id).trace_context is None
    burst()
    runs = spans_named(exporter, f"run {PATH}.add")
    assert len(runs) == 2
    assert all(run.parent is None and not run.links for run in runs)


def test_a_run_never_adopts_the_worker_threads_own_current_span(exporter, tracer):
    # No database: the executor alone, inside some span of the worker's thread.
    from tests.test_execution import claimed

    with tracer.start_as_current_span("ambient"):
        outcome, _ = execute(claimed("add", 1, 2))
    assert outcome.return_value == 3
    (run,) = spans_named(exporter, f"run {PATH}.add")
    assert run.parent is None and not run.links


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "setup",
    [
        # The tracing extra is not installed.
        "sys.modules['opentelemetry'] = None",
        # Installed, but no SDK configured: spans are non-recording.
        "",
    ],
    ids=["not-installed", "api-only"],
)
def test_without_a_configured_sdk_nothing_is_stored(setup):
    script = f"""
import json, sys
{setup}
import django
django.setup()
from django_rdbtasks.observability import tracing
from tests.testapp import tasks
try:
    from opentelemetry import trace
    span = trace.get_tracer("x").start_as_current_span("request")
except ImportError:
    import contextlib
    span = contextlib.nullcontext()
with span:
    result = tasks.add.enqueue(1, 2)
print(json.dumps({{"enabled": tracing.ENABLED, "id": result.id}}))
"""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "RDBTASKS_TEST_WORKER": "1",
        "PYTHONPATH": str(ROOT),
    }
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer["enabled"] is (setup == "")
    assert Task.objects.get(pk=answer["id"]).trace_context is None


@pytest.mark.django_db(transaction=True)
def test_a_dedup_hit_ends_its_enqueue_span_in_error_and_returns_the_active_task(exporter, tracer):
    with tracer.start_as_current_span("request"):
        first = tasks.sync_account.enqueue("acme")
        second = tasks.sync_account.enqueue("acme")
    assert second.id == first.id
    spans = spans_named(exporter, f"enqueue {PATH}.sync_account")
    assert [s.status.status_code for s in spans] == [StatusCode.UNSET, StatusCode.ERROR]
    assert spans[1].attributes["error.type"].endswith("IntegrityError")
    # The row keeps the context of the enqueue that created it.
    stored = Task.objects.get(pk=first.id).trace_context
    assert traceparent_ids(stored["traceparent"]) == (
        spans[0].context.trace_id,
        spans[0].context.span_id,
    )


def test_a_run_skips_its_span_only_where_it_could_change_nothing(monkeypatch, provider):
    """No SDK configured (the API's proxy provider): an untraced row's run gets no
    span, a traced row's still does (its context is what the task propagates); with
    a recording provider every run gets one."""
    from django_rdbtasks.observability import tracing

    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    assert not tracing.provider_records()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    assert tracing.provider_records()
