"""OpenTelemetry tracing: one span per attempt, joined to the request that asked for it.

Needs the otel extra (`opentelemetry-api`, `opentelemetry-sdk`). A Worker given an `OtelTracer`
traces each attempt as one span, from its claim to its one write:

    worker = Worker(store, registry, fail_stop=end_the_process, tracer=OtelTracer())

The span is named "trioworker.attempt KIND" (kind CONSUMER) and carries the item's id,
kind, scope and attempt, and at its end the outcome (`trioworker.outcome`: "complete",
"retry", ...); a failed or cut-off attempt's status is ERROR, with the handler's error
recorded. A failed heartbeat and a self-stop are span events.

An enqueue made while a span is current stores that span's trace context with the item
(the configured propagator's carrier: W3C `traceparent` and `tracestate`), and the
attempt's span is its child, so the work joins the trace of the request that asked for
it. While the handler runs its span is current: the handler's own spans, and items it
enqueues, join the same trace. docs/guide/tracing.md; why: docs/adr/0010-tracing.md.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from trioworker._core.errors import ConfigurationError
from trioworker._core.policy import AttemptOutcome, describe_error, formattable
from trioworker._core.public import public_names as _public_names
from trioworker._core.validation import MAX_TRACE_CONTEXT_BYTES

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.util.types import AttributeValue

    from trioworker._core.model import WorkItem

#: The span name's first word; the item's kind follows it.
SPAN_NAME = "trioworker.attempt"

#: Outcomes of an attempt that did not do its work: its span's status is ERROR.
ERROR_OUTCOMES = frozenset(
    {
        AttemptOutcome.FAIL,
        AttemptOutcome.RETRY,
        AttemptOutcome.SELF_STOPPED,
        AttemptOutcome.LOST,
        AttemptOutcome.DATABASE_LOST,
        AttemptOutcome.FENCED_OUT,
        AttemptOutcome.WRITE_FAILED,
        AttemptOutcome.ABANDONED,
    }
)

_EXPORTERS_GROUP = "opentelemetry_traces_exporter"


class OtelTracer:
    """Traces each attempt a Worker runs as an OpenTelemetry span (`Worker(tracer=)`).

    `tracer_provider`: where the spans go; None for the global one (set by the
    application, or by `python -m trioworker run --otel`)."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("trioworker", tracer_provider=tracer_provider)

    def start(self, item: WorkItem) -> AttemptSpan:
        """Open the attempt's span, a child of the context `item` was enqueued in."""
        # An empty context to extract into: an item without one starts a trace of its
        # own, never a child of whatever the Worker's task has current.
        parent = propagate.extract(item.trace_context or {}, context=Context())
        span = self._tracer.start_span(
            f"{SPAN_NAME} {item.kind}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attempt_attributes(item),
        )
        return AttemptSpan(span)


class AttemptSpan:
    """One attempt's span: current from `start` until `end` (the executor calls both
    in the attempt's own task, the handler running in between)."""

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self._token = otel_context.attach(trace.set_span_in_context(span))

    def event(self, name: str, detail: str | None = None) -> None:
        """A span event: "heartbeat_failed" (with why) or "self_stopped"."""
        self.span.add_event(name, {} if detail is None else {"trioworker.detail": detail})

    def end(self, outcome: AttemptOutcome, error: BaseException | None) -> None:
        """Close the span with the attempt's outcome (and the handler's error, if any)."""
        span = self.span
        span.set_attribute("trioworker.outcome", outcome.value)
        if error is not None:
            try:
                if not formattable(error):
                    raise ValueError("not formattable")
                span.record_exception(error)
            except BaseException:  # what a handler raised is data: record its description
                span.add_event(
                    "exception",
                    {
                        "exception.type": describe_error(error).partition(":")[0],
                        "exception.message": describe_error(error),
                    },
                )
        if outcome in ERROR_OUTCOMES:
            described = describe_error(error) if error is not None else outcome.value
            span.set_status(Status(StatusCode.ERROR, f"{outcome.value}: {described}"))
        otel_context.detach(self._token)
        span.end()


def attempt_attributes(item: WorkItem) -> dict[str, AttributeValue]:
    """The attributes of an attempt's span (an unscoped item has no scope attribute)."""
    attributes: dict[str, AttributeValue] = {
        "trioworker.item.id": item.id,
        "trioworker.item.kind": item.kind,
        "trioworker.item.attempt": item.attempt,
        "trioworker.item.priority": item.priority,
        "messaging.system": "trioworker",
        "messaging.operation.type": "process",
        "messaging.message.id": str(item.id),
    }
    if item.scope is not None:
        attributes["trioworker.item.scope"] = item.scope
    return attributes


def current_trace_context() -> dict[str, str] | None:
    """The current span's trace context, as `enqueue(trace_context=...)` takes it: what
    the configured propagator injects (W3C `traceparent` and `tracestate`, and
    baggage, by default), or None when no span is current.

    Enqueues call this themselves when given no trace context; pass its result to carry
    a context elsewhere (a plain SQL insert's `trace_context` column, say). A carrier
    over the store's limit loses its largest entries (baggage first) until it fits.
    """
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return _fit(carrier)


def _fit(carrier: dict[str, str]) -> dict[str, str] | None:
    for key in sorted(carrier, key=lambda k: len(carrier[k]), reverse=True):
        if len(json.dumps(carrier, separators=(",", ":")).encode()) <= MAX_TRACE_CONTEXT_BYTES:
            break
        del carrier[key]
    return carrier or None


def provider_from_environment() -> TracerProvider:
    """An SDK TracerProvider set up by the standard OTEL_* variables: the resource
    (OTEL_SERVICE_NAME, default "trioworker"; OTEL_RESOURCE_ATTRIBUTES), the sampler
    (OTEL_TRACES_SAMPLER), and a batch processor for each exporter OTEL_TRACES_EXPORTER
    names (default "otlp", which needs `opentelemetry-exporter-otlp`; "console" is the
    SDK's own; "none": no export). Each exporter reads its own variables
    (OTEL_EXPORTER_OTLP_ENDPOINT, ...). ConfigurationError names an exporter that is
    not installed."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "trioworker"}))
    provider = TracerProvider(resource=resource)
    for exporter in _exporters(os.environ.get("OTEL_TRACES_EXPORTER", "otlp")):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporters(names: str) -> list[Any]:
    exporters = []
    for name in (n.strip() for n in names.split(",")):
        if name in ("", "none"):
            continue
        found = importlib.metadata.entry_points(group=_EXPORTERS_GROUP, name=name)
        if not found:
            hint = " (pip install opentelemetry-exporter-otlp)" if name.startswith("otlp") else ""
            raise ConfigurationError(
                f"OTEL_TRACES_EXPORTER names {name!r}, which is not installed{hint};"
                " 'console' and 'none' need nothing more"
            )
        exporters.append(next(iter(found)).load()())
    return exporters


__all__ = [
    "ERROR_OUTCOMES",
    "SPAN_NAME",
    "AttemptSpan",
    "OtelTracer",
    "attempt_attributes",
    "current_trace_context",
    "provider_from_environment",
]

_public_names(__name__, globals(), __all__)
