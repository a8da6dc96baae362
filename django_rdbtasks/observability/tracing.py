"""OpenTelemetry spans: one around each enqueue, one around each run, linked.

Optional (the ``tracing`` extra, ``opentelemetry-api``). Nothing is configured
here: the project sets up the SDK (a tracer provider, an exporter) as it does
for its web processes, and these spans join whatever it exports.

- **Enqueue.** When a span is recording in the caller (a traced request,
  say), the insert runs inside a PRODUCER span ``enqueue <task path>`` (one
  per statement: a ``bulk_enqueue`` batch is one span), and that span's
  context is written into the row's ``trace_context`` column through the
  global propagator (W3C ``traceparent``/``tracestate`` by default). With no
  recording span nothing is stored and nothing is done: one context lookup.
- **Run.** The worker wraps each run of a claimed row in a CONSUMER span
  ``run <task path>``, current while the task runs (so the task's own spans
  nest under it). Following the messaging conventions (a "process" span
  SHOULD link to the message's creation context and, for a single message,
  MAY be its child), the run span both links to the enqueue span and is its
  child: the request and every attempt of its task are one trace, and tools
  that follow links find the producer too. A row enqueued untraced gets a
  root span, never the worker thread's ambient context.

If ``opentelemetry`` cannot be imported, ``ENABLED`` is False and the worker
and the backend skip this module entirely.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ..db.rows import NewBatch
from ..states import OutcomeKind

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
except ImportError:  # the ``tracing`` extra is not installed
    ENABLED = False
else:
    ENABLED = True

if TYPE_CHECKING:
    from ..db.rows import ClaimedRow, NewTask, Outcome

#: ``messaging.system``: no registered value fits a task table, so our own.
SYSTEM = "django_rdbtasks"
#: The instrumentation scope of every span here.
SCOPE = "django_rdbtasks"

#: Outcomes that end the attempt in error; the others (release, postpone,
#: handover...) are the queue working as meant and leave the status unset.
_ERROR_KINDS = frozenset(
    {OutcomeKind.FAILURE, OutcomeKind.RETRY, OutcomeKind.ABANDON, OutcomeKind.CANCELLED}
)

_tracer: Any = trace.get_tracer(SCOPE) if ENABLED else None
#: Providers that never record: the API's own, until a project configures an SDK.
_SILENT_PROVIDERS: tuple[type, ...] = (
    (trace.ProxyTracerProvider, trace.NoOpTracerProvider) if ENABLED else ()
)


def _mark_failed(span: Any, error: BaseException) -> None:
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:500]))
    span.set_attribute("error.type", f"{type(error).__module__}.{type(error).__qualname__}")


# -- enqueue ---------------------------------------------------------------------------


class EnqueueSpan:
    """The PRODUCER span around one insert statement, and the context it leaves in rows."""

    __slots__ = ("_token", "carrier", "span")

    def __init__(self, span: Any) -> None:
        self.span = span
        self._token: Any = None
        #: What goes into ``trace_context``: the propagator's fields for this span.
        self.carrier: dict[str, str] = {}

    def __enter__(self) -> EnqueueSpan:
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        propagate.inject(self.carrier)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None:
                _mark_failed(self.span, exc)
        finally:
            otel_context.detach(self._token)
            self.span.end()

    def mark(self, tasks: Sequence[NewTask] | NewBatch) -> None:
        """Put this span's context into the rows about to be inserted."""
        if self.carrier:  # empty if the propagator is configured to write nothing
            text = json.dumps(self.carrier)
            if isinstance(tasks, NewBatch):
                tasks.trace_context = text
                return
            for task in tasks:
                task.trace_context = text


def enqueue_span(tasks: Sequence[NewTask] | NewBatch) -> EnqueueSpan | None:
    """A PRODUCER span for inserting ``tasks``, or None when nothing is being traced.

    Called for every enqueue: without a recording span it costs a context
    lookup and nothing else (no span, no row change).
    """
    if not ENABLED or not trace.get_current_span().is_recording():
        return None
    first = tasks if isinstance(tasks, NewBatch) else tasks[0]
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.name": "enqueue",
        "messaging.destination.name": first.queue_name,
        "rdbtasks.task.path": first.task_path,
    }
    if len(tasks) == 1:
        # One message: this span is its creation context.
        attributes["messaging.operation.type"] = "create"
        attributes["messaging.message.id"] = (
            tasks.ids[0] if isinstance(tasks, NewBatch) else str(tasks[0].id)
        )
    else:
        # A batch: one publish span, whose context every row carries.
        attributes["messaging.operation.type"] = "publish"
        attributes["messaging.batch.message_count"] = len(tasks)
    span = _tracer.start_span(
        f"enqueue {first.task_path}", kind=SpanKind.PRODUCER, attributes=attributes
    )
    return EnqueueSpan(span)


# -- run -------------------------------------------------------------------------------


def provider_records() -> bool:
    """Whether spans can record: an SDK's tracer provider is configured.

    With none (the API's proxy or no-op provider) a run span of an untraced
    row would be invalid and change nothing the task can see, so a run skips
    it. A traced row still gets one: its context (a non-recording span that
    carries the enqueue's trace) is what task code propagates onward.
    """
    return ENABLED and not isinstance(trace.get_tracer_provider(), _SILENT_PROVIDERS)


class RunSpan:
    """The CONSUMER span around one run of a claimed row; current while it runs."""

    __slots__ = ("_token", "span")

    def __init__(self, row: ClaimedRow, worker_id: str, task_id: str) -> None:
        links: list[Any] = []
        # An empty context, not the thread's current one: an untraced row
        # starts a trace of its own.
        parent = otel_context.Context()
        if row.trace_context:
            parent = propagate.extract(row.trace_context, context=parent)
            creation = trace.get_current_span(parent).get_span_context()
            if creation.is_valid:
                links.append(Link(creation))
        self.span = _tracer.start_span(
            f"run {row.task_path}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.name": "run",
                "messaging.operation.type": "process",
                "messaging.destination.name": row.queue_name,
                "messaging.message.id": task_id,
                "messaging.client.id": worker_id,
                "rdbtasks.task.path": row.task_path,
                "rdbtasks.task.attempt": row.attempts,
                "rdbtasks.task.max_attempts": row.max_attempts,
            },
        )
        self._token: Any = None

    def __enter__(self) -> RunSpan:
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None:  # the worker's own code raised, not the task
                _mark_failed(self.span, exc)
        finally:
            otel_context.detach(self._token)
            self.span.end()

    def ended(self, outcome: Outcome) -> Outcome:
        """Record what became of the run; returns ``outcome`` unchanged."""
        span = self.span
        span.set_attribute("rdbtasks.outcome", outcome.kind.value)
        error = outcome.error
        if error is not None and outcome.kind in _ERROR_KINDS:
            _mark_failed(span, error)
        return outcome


def flush(timeout_millis: int = 5000) -> None:
    """Export the spans still buffered: worker processes end with ``os._exit``,
    which skips the SDK's own flush at exit."""
    if not ENABLED:
        return
    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        try:
            force_flush(timeout_millis)
        except Exception:  # an exporter's trouble must not stop a worker from exiting
            pass
