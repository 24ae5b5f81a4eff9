"""Tracing with OpenTelemetry (`trioworker.otel`), on Trio's virtual clock with the
in-memory store; the spans go to the SDK's in-memory exporter."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import trio
import trio.testing
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.trace import SpanKind, StatusCode

from tests.support.fakes import ScriptedStore, always, running
from tests.support.spans import Spans
from trioworker import (
    ConfigurationError,
    Context,
    NewItem,
    Registry,
    WorkItem,
)
from trioworker._core.policy import AttemptOutcome
from trioworker._core.validation import MAX_TRACE_CONTEXT_BYTES
from trioworker._store import tracing as _store
from trioworker.otel import (
    OtelTracer,
    _exporters,
    attempt_attributes,
    current_trace_context,
    provider_from_environment,
)
from trioworker.testing import MemoryStore

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans() -> Iterator[Spans]:
    spans = Spans()
    yield spans
    spans.provider.shutdown()


def events(span: ReadableSpan) -> list[tuple[str, object]]:
    return [(e.name, (e.attributes or {}).get("trioworker.detail")) for e in span.events]


# -- an attempt's span ------------------------------------------------------------------


async def test_an_attempt_is_one_consumer_span_child_of_the_enqueuers(
    autojump_clock: trio.testing.MockClock, spans: Spans
) -> None:
    """Enqueued inside a span, the item's attempt is a CONSUMER span of that span's
    trace, its parent, with the item's id, kind, scope and attempt and the outcome."""
    store, registry = MemoryStore(), Registry()
    registry.handler("Crawl")(nothing)
    with spans.tracer.start_as_current_span("request") as request:
        enqueued = await store.enqueue("Crawl", scope="cfg-7", priority=3)
    async with running(store, registry, tracer=OtelTracer(spans.provider)):
        (span,) = await spans.wait_for()
    assert span.name == "trioworker.attempt Crawl" and span.kind is SpanKind.CONSUMER
    assert span.parent is not None
    assert span.parent.span_id == request.get_span_context().span_id
    assert span.context.trace_id == request.get_span_context().trace_id
    assert dict(span.attributes or {}) == {
        "trioworker.item.id": enqueued.id,
        "trioworker.item.kind": "Crawl",
        "trioworker.item.scope": "cfg-7",
        "trioworker.item.attempt": 1,
        "trioworker.item.priority": 3,
        "messaging.system": "trioworker",
        "messaging.operation.type": "process",
        "messaging.message.id": str(enqueued.id),
        "trioworker.outcome": "complete",
    }
    assert span.status.status_code is StatusCode.UNSET and span.events == ()


async def nothing(item: WorkItem, ctx: Context) -> None:
    pass


async def test_an_item_enqueued_outside_any_span_starts_a_trace_of_its_own(
    autojump_clock: trio.testing.MockClock, spans: Spans
) -> None:
    """No span was current at enqueue: the attempt's span is a root, even if the
    Worker itself runs inside a span; an unscoped item has no scope attribute."""
    store, registry = MemoryStore(), Registry()
    registry.handler("Purge")(nothing)
    await store.enqueue("Purge")
    with spans.tracer.start_as_current_span("around the worker"):
        async with running(store, registry, tracer=OtelTracer(spans.provider)):
            (span,) = await spans.wait_for()
    assert span.parent is None
    assert "trioworker.item.scope" not in (span.attributes or {})


async def test_a_failing_handler_leaves_an_error_span_with_the_exception(
    autojump_clock: trio.testing.MockClock, spans: Spans
) -> None:
    """A handler that raises: outcome retry, status ERROR naming the error, and the
    exception recorded as an event (with its type and message)."""
    store, registry = MemoryStore(), Registry()

    @registry.handler("Crawl")
    async def broken(item: WorkItem, ctx: Context) -> None:
        raise KeyError("path")

    await store.enqueue("Crawl")
    async with running(store, registry, tracer=OtelTracer(spans.provider)):
        span = (await spans.wait_for())[0]
    assert (span.attributes or {})["trioworker.outcome"] == "retry"
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "retry: KeyError: 'path'"
    (exception,) = span.events
    assert exception.name == "exception"
    assert (exception.attributes or {})["exception.type"] == "KeyError"


async def test_heartbeat_failures_and_the_self_stop_are_span_events(
    autojump_clock: trio.testing.MockClock, spans: Spans
) -> None:
    """Every heartbeat fails: one event per failed heartbeat (with why), then the
    self-stop; the span ends with outcome self_stopped, status ERROR."""
    store, registry = ScriptedStore(), Registry()

    @registry.handler("Crawl")
    async def forever(item: WorkItem, ctx: Context) -> None:
        await trio.sleep_forever()

    store.script["heartbeat"] = always("fail")
    await store.enqueue("Crawl", scope="7")
    async with running(store, registry, tracer=OtelTracer(spans.provider)):
        (span,) = await spans.wait_for()
    failed = "heartbeat: down"
    # Heartbeats at 10 s and 20 s fail; the self-stop at 30 s comes before the third.
    assert events(span) == [
        ("heartbeat_failed", failed), ("heartbeat_failed", failed), ("self_stopped", None),
    ]  # fmt: skip
    assert (span.attributes or {})["trioworker.outcome"] == "self_stopped"
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "self_stopped: self_stopped"


async def test_a_heartbeat_that_hangs_is_an_event_saying_so(
    autojump_clock: trio.testing.MockClock, spans: Spans
) -> None:
    """A heartbeat that gets no answer within the interval is an event too."""
    store, registry = ScriptedStore(), Registry()

    @registry.handler("Crawl")
    async def forever(item: WorkItem, ctx: Context) -> None:
        await trio.sleep_forever()

    store.script["heartbeat"] = always("hang")
    await store.enqueue("Crawl")
    async with running(store, registry, tracer=OtelTracer(spans.provider)):
        (span,) = await spans.wait_for()
    assert ("heartbeat_failed", "no answer within 10s") in events(span)
    assert events(span)[-1] == ("self_stopped", None)


async def test_the_handlers_spans_and_enqueues_join_the_attempts_trace(
    autojump_clock: trio.testing.MockClock, spans: Spans
) -> None:
    """While the handler runs its attempt's span is current: a span the handler
    starts is its child, and an item it enqueues carries its context."""
    store, registry = MemoryStore(), Registry()

    @registry.handler("Parent")
    async def parent(item: WorkItem, ctx: Context) -> None:
        with spans.tracer.start_as_current_span("handler work"):
            pass
        await ctx.store.enqueue("Child")

    @registry.handler("Child")
    async def child(item: WorkItem, ctx: Context) -> None:
        pass

    await store.enqueue("Parent")
    async with running(store, registry, tracer=OtelTracer(spans.provider)):
        first, second = await spans.wait_for(2)
    (work,) = spans.finished("handler work")
    assert work.parent is not None and work.parent.span_id == first.context.span_id
    assert first.name == "trioworker.attempt Parent" and first.parent is None
    assert second.parent is not None and second.parent.span_id == first.context.span_id


def test_the_attempts_span_is_current_from_start_to_end(spans: Spans) -> None:
    """`start` makes the span current (the handler runs in between); `end` restores
    what was current before."""
    attempt = OtelTracer(spans.provider).start(WorkItem(1, "K", None, {}, 1))
    assert trace.get_current_span() is attempt.span
    attempt.end(AttemptOutcome("complete"), None)
    assert not trace.get_current_span().get_span_context().is_valid


@pytest.mark.parametrize(
    ("outcome", "error"),
    [
        ("fail", ValueError("bad")),
        ("lost", None),
        ("fenced_out", None),
        ("write_failed", None),
    ],
)
def test_outcomes_that_did_not_do_the_work_are_errors(
    spans: Spans, outcome: str, error: BaseException | None
) -> None:
    """fail, lost, fenced-out and write-failed end in status ERROR."""
    attempt = OtelTracer(spans.provider).start(WorkItem(1, "K", None, {}, 1))
    attempt.end(AttemptOutcome(outcome), error)
    (span,) = spans.finished()
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["trioworker.outcome"] == outcome


@pytest.mark.parametrize("outcome", ["complete", "succeeded_in_transaction", "cancel", "release"])
def test_outcomes_that_are_no_failure_leave_the_status_unset(spans: Spans, outcome: str) -> None:
    """A completion, a requested cancel and a release at shutdown are no errors."""
    attempt = OtelTracer(spans.provider).start(WorkItem(1, "K", None, {}, 1))
    attempt.end(AttemptOutcome(outcome), None)
    (span,) = spans.finished()
    assert span.status.status_code is StatusCode.UNSET


def test_a_malformed_trace_context_gives_a_root_span(spans: Spans) -> None:
    """A carrier no propagator can read (a plain SQL insert's, say) is ignored."""
    item = WorkItem(1, "K", None, {}, 1, trace_context={"traceparent": "not one"})
    OtelTracer(spans.provider).start(item).end(AttemptOutcome("complete"), None)
    (span,) = spans.finished()
    assert span.parent is None


def test_the_attributes_of_a_scoped_item() -> None:
    """The scope is an attribute when the item has one."""
    item = WorkItem(5, "K", "s", {}, 2, priority=-1)
    assert attempt_attributes(item)["trioworker.item.scope"] == "s"
    assert attempt_attributes(item)["trioworker.item.attempt"] == 2


# -- the enqueue side ------------------------------------------------------------------


def test_no_current_span_means_no_trace_context(spans: Spans) -> None:
    """Outside any span there is nothing to carry."""
    assert current_trace_context() is None
    assert _store.trace_context_or_current(None) is None


def test_inside_a_span_its_w3c_context_is_carried(spans: Spans) -> None:
    """The current span's traceparent (trace id and span id) is what is carried."""
    with spans.tracer.start_as_current_span("request") as span:
        carrier = current_trace_context()
        automatic = _store.trace_context_or_current(None)
    context = span.get_span_context()
    assert (
        carrier
        == automatic
        == {
            "traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}"
            f"-{int(context.trace_flags):02x}"
        }
    )


def test_a_given_trace_context_wins_and_an_empty_one_stays_empty(spans: Spans) -> None:
    """An explicit carrier is stored as given, even inside a span; {} carries none."""
    with spans.tracer.start_as_current_span("request"):
        assert _store.trace_context_or_current({"traceparent": TRACEPARENT}) == {
            "traceparent": TRACEPARENT
        }
        assert _store.trace_context_or_current({}) == {}


def test_baggage_too_large_for_the_store_is_left_behind(spans: Spans) -> None:
    """The propagator's baggage rides along while it fits; past the store's limit the
    largest entries go first, so the traceparent is kept."""
    with spans.tracer.start_as_current_span("request"):
        small = otel_context.attach(baggage.set_baggage("user", "7"))
        carrier = current_trace_context()
        otel_context.detach(small)
        big = otel_context.attach(baggage.set_baggage("blob", "x" * MAX_TRACE_CONTEXT_BYTES))
        trimmed = current_trace_context()
        otel_context.detach(big)
    assert carrier is not None and carrier["baggage"] == "user=7" and "traceparent" in carrier
    assert trimmed is not None and set(trimmed) == {"traceparent"}


@pytest.mark.parametrize(("value", "kept"), [(4008, True), (4009, False)])
def test_a_carrier_of_exactly_the_limit_keeps_its_baggage(
    spans: Spans, value: int, kept: bool
) -> None:
    """traceparent (55 characters) and 4008 characters of baggage value make exactly
    4096 bytes of compact JSON, which fit; one more and the baggage (the larger entry)
    is left behind, the traceparent kept."""
    with spans.tracer.start_as_current_span("request"):
        token = otel_context.attach(baggage.set_baggage("k", "x" * value))
        carrier = current_trace_context()
        otel_context.detach(token)
    assert carrier is not None
    assert set(carrier) == ({"traceparent", "baggage"} if kept else {"traceparent"})


def test_the_spans_come_from_the_trioworker_tracer(spans: Spans) -> None:
    """The instrumentation scope of an attempt's span names the library."""
    attempt = OtelTracer(spans.provider).start(WorkItem(1, "K", None, {}, 1))
    attempt.end(AttemptOutcome.COMPLETE, None)
    (span,) = spans.finished()
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == "trioworker"


async def test_enqueue_many_gives_the_current_context_to_items_without_one(
    spans: Spans,
) -> None:
    """Inside a span, items of a batch without a trace context get the span's; one
    given its own (or {}) keeps it."""
    store = MemoryStore()
    with spans.tracer.start_as_current_span("request"):
        current = current_trace_context()
        await store.enqueue_many(
            [NewItem("A"), NewItem("A", trace_context={"traceparent": TRACEPARENT}),
             NewItem("A", trace_context={})]
        )  # fmt: skip
    assert [i.trace_context for i in store.items()] == [
        current, {"traceparent": TRACEPARENT}, None,
    ]  # fmt: skip


def test_with_current_trace_leaves_what_validation_refuses_alone(spans: Spans) -> None:
    """A batch that is not a sequence of NewItem reaches validation as it was given."""
    with spans.tracer.start_as_current_span("request"):
        assert _store.with_current_trace("AB") == "AB"  # type: ignore[arg-type]
        assert _store.with_current_trace([{"kind": "A"}]) == [{"kind": "A"}]  # type: ignore[list-item]
    assert _store.with_current_trace([NewItem("A")]) == [NewItem("A")]


def test_without_opentelemetry_nothing_is_captured(
    spans: Spans, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When trioworker.otel cannot be imported (no otel extra), an enqueue carries no
    trace context, span or not."""
    monkeypatch.setitem(sys.modules, "trioworker.otel", None)  # import raises ImportError
    _store._current_trace_context.cache_clear()
    try:
        with spans.tracer.start_as_current_span("request"):
            assert _store.trace_context_or_current(None) is None
    finally:
        _store._current_trace_context.cache_clear()


# -- run --otel: a provider from the OTEL_* variables -----------------------------------


def test_the_environment_names_the_exporters(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_TRACES_EXPORTER picks the exporters (none: none); the service is named
    trioworker unless OTEL_SERVICE_NAME says otherwise."""
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    provider = provider_from_environment()
    assert provider.resource.attributes["service.name"] == "trioworker"
    assert provider._active_span_processor._span_processors == ()
    provider.shutdown()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "media-workers")
    provider = provider_from_environment()
    assert provider.resource.attributes["service.name"] == "media-workers"
    (processor,) = provider._active_span_processor._span_processors
    assert type(processor).__name__ == "BatchSpanProcessor"
    provider.shutdown()


@pytest.mark.parametrize(
    ("name", "hint"),
    [("otlp_absent", " (pip install opentelemetry-exporter-otlp)"), ("zipkin_absent", "")],
)
def test_an_exporter_that_is_not_installed_is_named(
    monkeypatch: pytest.MonkeyPatch, name: str, hint: str
) -> None:
    """An unknown exporter is a configuration error naming it (and, for OTLP, what
    to install)."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", f"console, {name}")
    message = (
        f"OTEL_TRACES_EXPORTER names {name!r}, which is not installed{hint};"
        " 'console' and 'none' need nothing more"
    )
    with pytest.raises(ConfigurationError) as raised:
        provider_from_environment()
    assert str(raised.value) == message


def test_exporters_are_looked_up_by_name_among_span_exporters() -> None:
    """Each name (blank and "none" skipped) is a span exporter's entry point: "console"
    is the SDK's ConsoleSpanExporter, not its log or metric namesake."""
    exporters = _exporters("none, console,")
    assert [type(e).__name__ for e in exporters] == ["ConsoleSpanExporter"]


def test_the_default_exporter_is_otlp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without OTEL_TRACES_EXPORTER the exporter is OTLP, as the specification says:
    refused by name when opentelemetry-exporter-otlp is not installed."""
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    try:
        exporters = _exporters_of(provider_from_environment())
    except ConfigurationError as exc:
        assert "names 'otlp', which is not installed" in str(exc)
    else:
        assert [type(e).__name__ for e in exporters] == ["OTLPSpanExporter"]


def _exporters_of(provider: TracerProvider) -> list[object]:
    processors = provider._active_span_processor._span_processors
    exporters = [p._batch_processor._exporter for p in processors]  # type: ignore[attr-defined]
    provider.shutdown()
    return exporters
