"""The Store protocol: what the executor and Worker need from durable storage.

Two implementations: `PostgresStore` and the in-memory `trioworker.testing.MemoryStore`.
The contract tests run against both, so the fake cannot drift from PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, LiteralString, Protocol

import attrs
import trio

from trioworker._core.model import (
    AttemptRecord,
    CancelOutcome,
    Enqueued,
    Fired,
    Heartbeat,
    ItemState,
    NewItem,
    Pause,
    Recovered,
    ScheduleState,
    ScopeHolder,
    Status,
    StoreStatistics,
    WorkerInfo,
    WorkItem,
)
from trioworker._core.schedule import Schedule

#: Called with the notification's scope ("" for unscoped work, None after a reconnect).
NotifyCallback = Callable[[str | None], None]


class FencedTransactionLike(Protocol):
    """What `Context.transaction()` yields (`FencedTransaction` on PostgreSQL)."""

    item_id: int
    attempt: int
    completes: bool

    async def execute(
        self, query: LiteralString, params: Sequence[Any] | dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]: ...

    async def rows(
        self, query: LiteralString, params: Sequence[Any] | dict[str, Any] | None = None
    ) -> list[dict[str, Any]]: ...

    def complete(self) -> None: ...


class Store(Protocol):
    async def enqueue(
        self,
        kind: str,
        *,
        scope: str | None = None,
        payload: Any = None,
        dedup_key: str | None = None,
        run_after: dt.datetime | dt.timedelta | None = None,
        priority: int = 0,
        trace_context: Mapping[str, str] | None = None,
        tx: Any = None,
    ) -> Enqueued:
        """`tx`: a transaction of this store's (`store.transaction()`, or a handler's
        `ctx.transaction()`): the item exists only if it commits."""
        ...

    async def claim(
        self,
        worker_id: str,
        lease: float,
        scopes: Sequence[str] | None = None,
        *,
        unscoped: bool = True,
        kinds: Sequence[str],
    ) -> WorkItem | None: ...

    async def claim_batch(
        self,
        worker_id: str,
        lease: float,
        limit: int,
        scopes: Sequence[str] | None = None,
        *,
        unscoped: bool = True,
        kinds: Sequence[str],
    ) -> list[WorkItem]: ...

    async def seconds_until_due(
        self,
        *,
        kinds: Sequence[str],
        scopes: Sequence[str] | None = None,
        unscoped: bool = True,
    ) -> float | None: ...

    async def heartbeat(self, id: int, attempt: int, lease: float) -> Heartbeat: ...

    async def complete(self, id: int, attempt: int) -> bool: ...

    async def complete_batch(self, attempts: Sequence[tuple[int, int]]) -> set[int]: ...

    async def fail(
        self,
        id: int,
        attempt: int,
        reason: str,
        error: str | None = None,
        traceback: str | None = None,
    ) -> bool: ...

    async def cancel(self, id: int, attempt: int) -> bool: ...

    async def release(self, id: int, attempt: int) -> bool: ...

    async def retry_later(
        self, id: int, attempt: int, delay: float, error: str, traceback: str | None = None
    ) -> bool: ...

    def fenced_transaction(
        self, id: int, attempt: int
    ) -> AbstractAsyncContextManager[FencedTransactionLike]: ...

    async def recover_expired_leases(self, max_stalls: int) -> list[Recovered]: ...

    async def settle_noted_scopes(self) -> int: ...

    async def repair_heads(self) -> list[str]: ...

    async def advertise(self, worker: WorkerInfo) -> None: ...

    async def worker_stopped(self, worker_id: str) -> None: ...

    async def request_cancel(self, id: int) -> CancelOutcome: ...

    async def enqueue_many(self, items: Sequence[NewItem], *, tx: Any = None) -> list[Enqueued]: ...

    async def delete_finished(
        self,
        older_than: dt.timedelta,
        *,
        statuses: Sequence[Status] = ...,
        batch: int = ...,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> int: ...

    async def pause(self, *, kind: str | None = None, scope: str | None = None) -> bool: ...

    async def resume(self, *, kind: str | None = None, scope: str | None = None) -> bool: ...

    async def pauses(self) -> list[Pause]: ...

    async def retry(self, ids: Sequence[int]) -> list[int]: ...

    async def failed_items(
        self, *, kind: str | None = None, since: dt.datetime | None = None
    ) -> list[int]: ...

    async def scope_holder(self, scope: str) -> tuple[ScopeHolder | None, bool]: ...

    async def sync_schedules(self, schedules: Sequence[Schedule]) -> None: ...

    async def fire_schedules(
        self, schedules: Sequence[Schedule]
    ) -> tuple[list[Fired], float | None]: ...

    async def schedules(self) -> list[ScheduleState]: ...

    async def get_item(self, id: int) -> ItemState | None: ...

    async def attempts(self, id: int) -> list[AttemptRecord]: ...

    async def listen(
        self,
        on_notify: NotifyCallback,
        *,
        on_settle: NotifyCallback | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None: ...

    def statistics(self) -> StoreStatistics: ...


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
