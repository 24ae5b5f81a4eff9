"""The two faces of a store (docs/design/architecture.md).

- `HandlerStore` (public, `trioworker.HandlerStore`): what handlers, applications and
  operators use under Trio: enqueue, cancel, retry, pause and resume, limits, the
  reads (`show`, `status`, ...), and transactions of their own. A handler's
  `ctx.store` is a `HandlerStoreView`: this face and nothing else. (The public
  `trioworker.Client` and `trioworker.AsyncClient` are the synchronous and asyncio
  clients: they offer the same operations, and all three run each operation of
  `_postgres/operations.py`.)
- `WorkerStore`: what only the Worker and its executor use: claim, heartbeat, the
  fenced writes after an attempt, lease recovery, settling, advertising.

`Store` is both; `PostgresStore` and the in-memory `trioworker.testing.MemoryStore`
implement it, and the contract tests hold both to the same behaviour.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, LiteralString, Protocol, cast

import trio

from trioworker._core.limits import Declared, Limit, LimitChange, Rate
from trioworker._core.model import (
    AttemptRecord,
    CancelOutcome,
    Enqueued,
    Fired,
    Heartbeat,
    HeldLease,
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
from trioworker._store.reads import ItemDetails, QueueCounts, QueueStatus

#: Called with the notification's scope ("" for unscoped work, None after a reconnect).
NotifyCallback = Callable[[str | None], None]

Params = Sequence[Any] | dict[str, Any] | None


class Transaction(Protocol):
    """A transaction of the caller's own (`HandlerStore.transaction()`): pass it as
    `tx=` to enqueue atomically with the caller's other writes."""

    async def execute(self, query: LiteralString, params: Params = None) -> list[tuple[Any, ...]]:
        """Run one statement; the rows it returns, as tuples (none for none)."""
        ...

    async def rows(self, query: LiteralString, params: Params = None) -> list[dict[str, Any]]:
        """Run one statement; the rows it returns, as dicts."""
        ...


class FencedTransaction(Transaction, Protocol):
    """What `Context.transaction()` yields: a transaction fenced by its attempt."""

    item_id: int
    attempt: int
    #: Whether the commit notes the attempt's success (`complete()` was called).
    completes: bool
    #: The result `complete(result=...)` was given, as the JSON text to store (None:
    #: none).
    result_json: str | None

    def complete(self, result: Any = None) -> None:
        """Commit the attempt's success with this transaction: durable once committed,
        while the item stays Running, holding its scope, until the Worker finishes it
        after the handler has returned. `result` (JSON) is the item's result, stored in
        the same commit; one that cannot be stored raises UnstorableResult here."""
        ...


class OpenFenced(Protocol):
    """`WorkerStore.fenced_transaction`, as a Context holds it to open its attempt's."""

    def __call__(
        self, id: int, attempt: int, *, until: Callable[[], float] | None = None
    ) -> AbstractAsyncContextManager[FencedTransaction]: ...


class HandlerStore(Protocol):
    """The queue as a handler sees it: `ctx.store`, the store of the Worker running it,
    with its client operations and nothing of the Worker's own (no claim, heartbeat or
    fenced write). Enqueue follow-up work, read items and the queue, cancel, retry,
    pause, set limits, open a transaction.

    Type a handler's helpers with it: `PostgresStore` (from `open_store`) and
    `trioworker.testing.MemoryStore` offer it too, so a function that takes a
    `HandlerStore` runs on `ctx.store`, on a store a Trio script opened, and on the
    in-memory store of a unit test alike. Every method is async but `transaction()`
    (an async context manager) and `statistics()`. Not to be confused with
    `trioworker.Client`, the synchronous client for programs without Trio.

        async def index(item: WorkItem, ctx: Context) -> None:
            await queue_summary(ctx.store, item.scope)

        async def queue_summary(store: HandlerStore, folder: str | None) -> None:
            await store.enqueue("Summarise", scope=folder)
    """

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
        after: Sequence[int] | None = None,
        tx: Transaction | None = None,
    ) -> Enqueued:
        """Queue an item (InvalidWorkItem, writing nothing, for bad input). `tx`: a
        transaction of this store's (`transaction()`, or a handler's
        `ctx.transaction()`): the item exists only if it commits. `after`: ids of items
        it waits for (it is Waiting until each has Succeeded)."""
        ...

    async def enqueue_many(
        self, items: Sequence[NewItem], *, tx: Transaction | None = None
    ) -> list[Enqueued]:
        """Queue many items in one statement, all or none; the results in order."""
        ...

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """A transaction of the caller's own, committed when the block exits cleanly
        (rolled back if it raises). In a handler, `ctx.transaction()` is the one fenced
        by its attempt."""
        ...

    async def cancel(self, id: int) -> CancelOutcome:
        """Cancel a Queued item now, or ask a Running one to stop at its next heartbeat."""
        ...

    async def retry(self, ids: Sequence[int]) -> list[int]:
        """Failed or Cancelled items back to Queued, history kept; the ids retried."""
        ...

    async def failed_items(
        self, *, kind: str | None = None, since: dt.datetime | None = None
    ) -> list[int]:
        """Ids of Failed items (of `kind`) that finished at or after `since`, oldest first."""
        ...

    async def pause(self, *, kind: str | None = None, scope: str | None = None) -> bool:
        """Pause a kind or a scope: its Queued items are not claimed (Running ones go
        on). False: it was paused already."""
        ...

    async def resume(self, *, kind: str | None = None, scope: str | None = None) -> bool:
        """Lift a pause; False: it was not paused."""
        ...

    async def pauses(self) -> list[Pause]:
        """Every pause in force."""
        ...

    async def delete_finished(
        self,
        older_than: dt.timedelta,
        *,
        statuses: Sequence[Status] = ...,
        batch: int = ...,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> int:
        """Delete items of `statuses` (finished ones) that finished longer than
        `older_than` ago, `batch` rows per transaction, oldest first; how many."""
        ...

    async def scope_holder(self, scope: str) -> tuple[ScopeHolder | None, bool]:
        """The scope's first Running item (None: none), and whether it still has a head."""
        ...

    async def scope_holders(self, scope: str) -> tuple[list[ScopeHolder], bool]:
        """The scope's Running items (one per slot), and whether it still has a head."""
        ...

    async def set_limit(
        self,
        *,
        kind: str | None = None,
        scope: str | None = None,
        running: int | None = None,
        rate: Rate | str | None = None,
    ) -> Limit:
        """Set a running limit and/or a rate of a kind, a scope, or (neither) the
        default running limit of scopes; None keeps what is set (InvalidLimit: bad)."""
        ...

    async def clear_limit(self, *, kind: str | None = None, scope: str | None = None) -> bool:
        """Remove the limit of `kind`, `scope` or (neither) the default; False: none."""
        ...

    async def limits(self) -> list[Limit]:
        """Every limit, with what it holds now."""
        ...

    async def get_item(self, id: int) -> ItemState | None:
        """Item `id`'s state; None: no such item."""
        ...

    async def attempts(self, id: int) -> list[AttemptRecord]:
        """How each attempt of item `id` ended, oldest first."""
        ...

    async def show(self, id: int) -> ItemDetails | None:
        """Item `id` and how its attempts ended; None: no such item."""
        ...

    async def result(
        self,
        id: int,
        *,
        timeout: float | None = None,  # noqa: ASYNC109  issue 34 names it, as Client does
    ) -> Any:
        """Wait until item `id` has ended (at most `timeout` seconds, else TimeoutError;
        None: no bound); its result if it Succeeded, else ItemNotSucceeded naming its
        status and error (UnknownItem: no such item)."""
        ...

    async def queue_counts(self) -> QueueCounts:
        """How many items each kind has in each status, and how many scopes are busy."""
        ...

    async def status(self, *, failures: int = 10) -> QueueStatus:
        """What `python -m trioworker status` shows: counts, Running items, the latest
        `failures` failures, Workers, pauses, schedules."""
        ...

    async def schedules(self) -> list[ScheduleState]:
        """Every schedule, as the database holds it (when it is due next)."""
        ...

    def statistics(self) -> StoreStatistics:
        """The counters this store keeps about its own calls, as a frozen snapshot."""
        ...


class WorkerStore(Protocol):
    """The Worker's own face: claims, heartbeats and the fenced writes after them."""

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

    async def complete_and_claim(
        self,
        attempts: Sequence[tuple[int, int]],
        worker_id: str,
        lease: float,
        limit: int,
        scopes: Sequence[str] | None = None,
        *,
        unscoped: bool = True,
        kinds: Sequence[str],
    ) -> tuple[set[int], list[WorkItem]]:
        """`complete_batch(attempts)`, then `claim_batch(worker_id, lease, limit, ...)`,
        in one call: the ids whose completion applied, and the items claimed."""
        ...

    async def seconds_until_due(
        self,
        *,
        kinds: Sequence[str],
        scopes: Sequence[str] | None = None,
        unscoped: bool = True,
    ) -> float | None: ...

    async def heartbeat(self, id: int, attempt: int, lease: float) -> Heartbeat: ...

    async def heartbeat_many(
        self, attempts: Sequence[tuple[int, int]], lease: float
    ) -> dict[tuple[int, int], Heartbeat]:
        """Renew the leases of many attempts in one statement: for each (id, attempt)
        asked, OK or CANCEL_REQUESTED (renewed), or LOST (it no longer owns a Running
        item). An attempt whose row another transaction holds (its own fenced
        transaction, an operator's) is passed over, not waited for: it gets no answer."""
        ...

    async def complete(self, id: int, attempt: int) -> bool: ...

    async def complete_batch(
        self, attempts: Sequence[tuple[int, int]], results: Sequence[str | None] | None = None
    ) -> set[int]:
        """Finish many attempts Succeeded; the ids written. `results`: each one's result
        as JSON text (None: none, or the one its own transaction stored), written with
        its Succeeded or not at all."""
        ...

    async def parent_results(self, id: int) -> dict[int, Any]:
        """The results of item `id`'s parents (`after=`), by id."""
        ...

    async def step(self, id: int, name: str) -> tuple[bool, Any]:
        """Whether item `id` has a step `name` recorded, and its value."""
        ...

    async def record_step(
        self,
        id: int,
        attempt: int,
        name: str,
        result: str | None,
        *,
        until: Callable[[], float] | None = None,
        server_timeout: float | None = None,
    ) -> bool:
        """Record step `name`'s value (JSON text) for attempt (`id`, `attempt`), fenced
        as `fenced_transaction` is (Lost, SelfStopped). True: recorded now; False: a
        value was recorded before, and stands."""
        ...

    async def fail(
        self,
        id: int,
        attempt: int,
        reason: str,
        error: str | None = None,
        traceback: str | None = None,
    ) -> bool: ...

    async def cancel_attempt(self, id: int, attempt: int) -> bool:
        """End a Running attempt whose cancel was requested as Cancelled (fenced)."""
        ...

    async def release(self, id: int, attempt: int) -> bool: ...

    async def retry_later(
        self, id: int, attempt: int, delay: float, error: str, traceback: str | None = None
    ) -> bool: ...

    def fenced_transaction(
        self,
        id: int,
        attempt: int,
        *,
        until: Callable[[], float] | None = None,
        server_timeout: float | None = None,
    ) -> AbstractAsyncContextManager[FencedTransaction]:
        """A transaction that commits only while attempt (`id`, `attempt`) owns its
        Running item (else Lost), and only while `trio.current_time() < until()`, the
        attempt's self-stop deadline (else SelfStopped: it does not open, or it rolls
        back instead of committing; the check is the last thing before the COMMIT).
        `until` is a callable because the deadline moves as heartbeats succeed.
        `server_timeout` (`Settings.fenced_server_timeout`): how long the database may
        let the transaction sit idle, or run one statement, before it ends it, so that
        a client gone without a word cannot hold the item (None: no such bound)."""
        ...

    async def recover_expired_leases(
        self, max_stalls: int, *, batch: int = ...
    ) -> list[Recovered]: ...

    async def held_leases(self, *, batch: int = ...) -> list[HeldLease]:
        """Expired items another session has held a whole lease after their lease ran
        out (lease recovery passes over them until it lets go), the oldest first."""
        ...

    async def settle_noted_scopes(self, *, batch: int = ...) -> int: ...

    async def repair_heads(self, *, batch: int = ...) -> list[str]: ...

    async def advertise(self, worker: WorkerInfo) -> None: ...

    async def declare_limit(self, declared: LimitChange) -> Declared:
        """Put a kind's limit, as its handler declares it, in force (a part declared
        None is removed), unless the database holds exactly that one."""

    async def worker_stopped(self, worker_id: str) -> None: ...

    async def sync_schedules(self, schedules: Sequence[Schedule]) -> None: ...

    async def fire_schedules(
        self, schedules: Sequence[Schedule]
    ) -> tuple[list[Fired], float | None]: ...

    async def listen(
        self,
        on_notify: NotifyCallback,
        *,
        on_settle: NotifyCallback | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
        check_every: float = ...,
    ) -> None: ...

    def statistics(self) -> StoreStatistics: ...


class Store(HandlerStore, WorkerStore, Protocol):
    """Both faces: what a Worker is given (`Worker(store, registry)`)."""


class HandlerStoreView:
    """The handler face of a store, and nothing more: what a handler gets as
    `ctx.store`, so no handler can claim, finish or recover items behind its Worker's
    back. Each method is the store's own."""

    def __init__(self, store: HandlerStore) -> None:
        self._store = store
        for name in HANDLER_STORE_METHODS:
            setattr(self, name, getattr(store, name))

    def __repr__(self) -> str:
        return f"HandlerStoreView({self._store!r})"


def handler_view(store: HandlerStore) -> HandlerStore:
    """`store`'s handler face alone, typed as what it offers (`HandlerStoreView`)."""
    return cast(HandlerStore, HandlerStoreView(store))


#: The methods of `HandlerStore`, as `HandlerStoreView` offers them.
HANDLER_STORE_METHODS = (
    "enqueue", "enqueue_many", "transaction", "cancel", "retry", "failed_items", "pause",
    "resume", "pauses", "delete_finished", "scope_holder", "get_item", "attempts", "show",
    "queue_counts", "status", "schedules", "statistics", "scope_holders", "set_limit",
    "clear_limit", "limits", "result",
)  # fmt: skip
