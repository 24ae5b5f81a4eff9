"""Tracing on real PostgreSQL: the trace context stored with an item (both stores),
an attempt's span joined to the enqueuer's, and `run --otel`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from tests.support.fakes import running
from tests.support.harness import Harness
from tests.support.processes import ROOT, wait_for
from tests.support.spans import Spans
from trioworker import (
    Context,
    NewItem,
    PostgresStore,
    Registry,
    RetryPolicy,
    Settings,
    WorkItem,
)
from trioworker.otel import OtelTracer, current_trace_context

LEASE = 30.0
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CARRIER = {"traceparent": TRACEPARENT, "tracestate": "vendor=opaque"}


# -- the store contract: the trace context round-trips -----------------------------------


async def test_a_trace_context_round_trips_to_the_claim_and_the_item(harness: Harness) -> None:
    """What enqueue is given comes back on the claimed WorkItem and from get_item; an
    item enqueued without one (outside any span), or with {}, has none."""
    given = await harness.store.enqueue("A", trace_context=CARRIER)
    none = await harness.store.enqueue("A", scope="s")
    empty = await harness.store.enqueue("A", scope="t", trace_context={})
    claimed = await harness.store.claim_batch("w1", LEASE, 3, kinds=["A"])
    assert {i.id: i.trace_context for i in claimed} == {
        given.id: CARRIER, none.id: None, empty.id: None,
    }  # fmt: skip
    state = await harness.store.get_item(given.id)
    assert state is not None and state.trace_context == CARRIER
    other = await harness.store.get_item(none.id)
    assert other is not None and other.trace_context is None


async def test_enqueue_many_stores_each_items_trace_context(harness: Harness) -> None:
    """Each NewItem's trace context is its own, in one batch."""
    await harness.store.enqueue_many(
        [NewItem("A", scope="1", trace_context=CARRIER), NewItem("A", scope="2")]
    )
    claimed = await harness.store.claim_batch("w1", LEASE, 2, kinds=["A"])
    assert [i.trace_context for i in sorted(claimed, key=lambda i: i.id)] == [CARRIER, None]


async def test_an_enqueue_inside_a_span_carries_it(harness: Harness) -> None:
    """Without trace_context=, an enqueue inside a span stores that span's context."""
    spans = Spans()
    with spans.tracer.start_as_current_span("request"):
        expected = current_trace_context()
        await harness.store.enqueue("A")
        await harness.store.enqueue_many([NewItem("A")])
    claimed = await harness.store.claim_batch("w1", LEASE, 2, kinds=["A"])
    assert expected is not None and "traceparent" in expected
    assert [i.trace_context for i in claimed] == [expected, expected]


def test_the_database_refuses_a_trace_context_that_is_no_carrier(pg: Any) -> None:
    """Plain SQL writers are held to the same shape: an object of strings, small."""
    insert = "INSERT INTO work_items (kind, trace_context) VALUES ('A', %s::jsonb)"
    pg.execute(insert, (json.dumps(CARRIER),))
    for bad in ('["traceparent"]', '{"traceparent": 1}', json.dumps({"k": "x" * 9000})):
        with pytest.raises(psycopg.errors.CheckViolation) as raised:
            pg.execute(insert, (bad,))
        assert raised.value.diag.constraint_name == "work_items_trace_context_sane"


# -- a Worker's attempts, traced ----------------------------------------------------------


async def run_until_traced(
    store: PostgresStore, registry: Registry, spans: Spans, n: int
) -> list[ReadableSpan]:
    tracer = OtelTracer(spans.provider)
    async with running(store, registry, Settings(poll=0.2), tracer=tracer):
        with trio.fail_after(30):
            return await spans.wait_for(n)


async def test_an_attempts_span_is_a_child_of_the_span_that_enqueued_it(
    store: PostgresStore,
) -> None:
    """Enqueued inside a request's span, the item's attempt is a CONSUMER span of the
    same trace whose parent is that span, with the item's attributes and outcome."""
    spans, registry = Spans(), Registry()

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        pass

    with spans.tracer.start_as_current_span("POST /folders/7/crawl") as request:
        enqueued = await store.enqueue("Crawl", scope="cfg-7")
    (span,) = await run_until_traced(store, registry, spans, 1)
    requested = request.get_span_context()
    assert span.name == "trioworker.attempt Crawl" and span.kind is SpanKind.CONSUMER
    assert span.context.trace_id == requested.trace_id
    assert span.parent is not None and span.parent.span_id == requested.span_id
    attributes = dict(span.attributes or {})
    assert {k: attributes[k] for k in attributes if k.startswith("trioworker.")} == {
        "trioworker.item.id": enqueued.id,
        "trioworker.item.kind": "Crawl",
        "trioworker.item.scope": "cfg-7",
        "trioworker.item.attempt": 1,
        "trioworker.item.priority": 0,
        "trioworker.outcome": "complete",
    }
    assert span.status.status_code is StatusCode.UNSET


async def test_a_failing_handler_gives_error_spans_retry_then_fail(store: PostgresStore) -> None:
    """Each attempt is a span of the enqueuer's trace: the first retried, the last
    failed for good, both with status ERROR and the exception recorded."""
    spans, registry = Spans(), Registry()

    @registry.handler("Crawl", retry=RetryPolicy(max_attempts=2, initial_delay=0.0, max_delay=0.0))
    async def broken(item: WorkItem, ctx: Context) -> None:
        raise OSError(f"disk gone (attempt {item.attempt})")

    with spans.tracer.start_as_current_span("request") as request:
        await store.enqueue("Crawl")
    first, second = await run_until_traced(store, registry, spans, 2)
    trace_id = request.get_span_context().trace_id
    assert [s.context.trace_id for s in (first, second)] == [trace_id, trace_id]
    assert [(s.attributes or {})["trioworker.item.attempt"] for s in (first, second)] == [1, 2]
    assert [(s.attributes or {})["trioworker.outcome"] for s in (first, second)] == [
        "retry", "fail",
    ]  # fmt: skip
    assert [s.status.status_code for s in (first, second)] == [StatusCode.ERROR] * 2
    assert first.status.description == "retry: OSError: disk gone (attempt 1)"
    assert [e.name for e in first.events] == ["exception"]


# -- run --otel -----------------------------------------------------------------------------


@pytest.fixture
def no_opentelemetry(tmp_path: Path) -> Iterator[str]:
    """A PYTHONPATH under which `import opentelemetry` fails, as without the extra."""
    package = tmp_path / "blocked" / "opentelemetry"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('opentelemetry is not installed')\n")
    yield str(package.parent)


def trioworker(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioworker", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_run_otel_without_the_extra_says_what_to_install(dsn: str, no_opentelemetry: str) -> None:
    """`run --otel` without opentelemetry is a usage error naming the extra, before
    anything connects."""
    result = trioworker(
        "--dsn", dsn, "run", "--app", "tests.apps.recording:registry", "--otel",
        env={"PYTHONPATH": no_opentelemetry},
    )  # fmt: skip
    assert result.returncode == 2
    assert "pip install opentelemetry-api opentelemetry-sdk" in result.stderr


def test_run_otel_with_an_exporter_not_installed_is_one_clear_line(dsn: str) -> None:
    """An OTEL_TRACES_EXPORTER that names no installed exporter is refused at start."""
    result = trioworker(
        "--dsn", dsn, "run", "--app", "tests.apps.recording:registry", "--otel",
        env={"OTEL_TRACES_EXPORTER": "otlp_absent"},
    )  # fmt: skip
    assert result.returncode == 1
    assert "OTEL_TRACES_EXPORTER names 'otlp_absent', which is not installed" in result.stderr


def run_traced(dsn: str, app: str, env: dict[str, str], out: Path) -> str:
    """`run --otel --app APP` (printing to `out`) until an attempt's span is printed,
    then SIGTERM; what it printed."""
    with out.open("w") as stdout:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trioworker", "--dsn", dsn, "run", "--otel",
             "--app", app, "--poll", "0.2"],
            cwd=ROOT, env=env, stdout=stdout, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for(lambda: '"trioworker.outcome": "complete"' in out.read_text(), 30, "a span")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    return out.read_text()


def test_run_otel_exports_each_attempt_as_the_environment_says(
    dsn: str, pg: Any, tmp_path: Path
) -> None:
    """`run --otel` with OTEL_TRACES_EXPORTER=console: the attempt of an item enqueued
    with a traceparent is printed as a span of that trace, named by the service."""
    pg.execute(
        "INSERT INTO work_items (kind, payload, trace_context) VALUES ('Record', '{}', %s)",
        (json.dumps({"traceparent": TRACEPARENT}),),
    )
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_SERVICE_NAME": "media-workers",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "TW_OBSERVER_LOG": str(tmp_path / "observer.jsonl"),
    }
    text = run_traced(dsn, "tests.apps.recording:registry", env, tmp_path / "worker.out")
    assert '"name": "trioworker.attempt Record"' in text
    assert '"trace_id": "0x0af7651916cd43dd8448eb211c80319c"' in text
    assert '"parent_id": "0xb7ad6b7169203331"' in text
    assert '"service.name": "media-workers"' in text


APP_WITH_ITS_OWN_TRACING = """
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from trioworker import Registry

provider = TracerProvider(resource=Resource.create({"service.name": "from-the-app"}))
provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer(__name__)
registry = Registry()


@registry.handler("Render")
async def render(item, ctx):
    with tracer.start_as_current_span("render the thumbnail"):
        pass
"""


def test_run_otel_uses_the_provider_the_app_set_up(dsn: str, pg: Any, tmp_path: Path) -> None:
    """An --app module that sets up its own global TracerProvider gets the attempts'
    spans there (the OTEL_* variables are not read), its handler's spans their children."""
    (tmp_path / "tracedapp.py").write_text(APP_WITH_ITS_OWN_TRACING)
    pg.execute("INSERT INTO work_items (kind) VALUES ('Render')")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "OTEL_TRACES_EXPORTER": "otlp_absent"}
    spans = parse_console_spans(run_traced(dsn, "tracedapp:registry", env, tmp_path / "out"))
    attempt, render = spans["trioworker.attempt Render"], spans["render the thumbnail"]
    assert attempt["resource"]["attributes"]["service.name"] == "from-the-app"
    assert render["parent_id"] == attempt["context"]["span_id"]
    assert render["context"]["trace_id"] == attempt["context"]["trace_id"]


def parse_console_spans(text: str) -> dict[str, dict[str, Any]]:
    """The spans ConsoleSpanExporter printed (one JSON object each), by name."""
    decoder, spans, at = json.JSONDecoder(), {}, 0
    while (at := text.find("{", at)) != -1:
        try:
            span, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            at += 1
            continue
        if isinstance(span, dict) and "name" in span and "context" in span:
            spans[span["name"]] = span
        at = end
    return spans
