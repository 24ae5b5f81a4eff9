"""Spans a test can wait for: a TracerProvider of the test's own, exporting to memory
(OpenTelemetry's SDK), for the unit and the integration tests of tracing alike."""

from __future__ import annotations

import trio
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class Spans(SpanProcessor):
    """A TracerProvider of its own for one test, exporting to memory (and a span
    processor itself, to wake a test waiting for spans)."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(shutdown_on_exit=False)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.provider.add_span_processor(self)
        self.tracer = self.provider.get_tracer("tests")
        self._ended = trio.Event()

    def on_end(self, span: ReadableSpan) -> None:
        self._ended.set()

    def finished(self, prefix: str = "trioworker.attempt") -> list[ReadableSpan]:
        """The finished spans whose names start with `prefix` (attempts by default)."""
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith(prefix)]

    async def wait_for(self, n: int = 1) -> list[ReadableSpan]:
        """Wait until `n` attempts' spans have ended; they."""
        while len(self.finished()) < n:
            self._ended = trio.Event()
            await self._ended.wait()
        return self.finished()
