"""The trace context an enqueue stores: the caller's, or the current span's."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import attrs

from trioworker._core.model import NewItem


def trace_context_or_current(
    trace_context: Mapping[str, str] | None,
) -> Mapping[str, str] | None:
    """What an enqueue stores as its trace context: `trace_context` as given, or for
    None the current OpenTelemetry span's, if the otel extra is installed and a span is
    current (docs/adr/0010-tracing.md)."""
    if trace_context is not None:
        return trace_context
    current = _current_trace_context()
    return None if current is None else current()


def with_current_trace(items: Sequence[NewItem]) -> Sequence[NewItem]:
    """`items` for `enqueue_many`, those without a trace context given the current
    span's (as `trace_context_or_current`); anything else is left for validation."""
    current = trace_context_or_current(None)
    if current is None or isinstance(items, str | bytes) or not isinstance(items, Sequence):
        return items
    return [
        attrs.evolve(item, trace_context=current)
        if isinstance(item, NewItem) and item.trace_context is None
        else item
        for item in items
    ]


@functools.cache
def _current_trace_context() -> Callable[[], dict[str, str] | None] | None:
    try:
        from trioworker.otel import current_trace_context
    except ImportError:  # no opentelemetry (the otel extra): nothing to carry
        return None
    return current_trace_context
