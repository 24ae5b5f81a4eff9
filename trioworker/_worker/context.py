"""What a handler gets besides its item: `Context`."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

import trio

from trioworker._core.errors import DatabaseUnavailable, Lost
from trioworker._core.model import WorkItem
from trioworker._core.validation import result_json
from trioworker._worker.logging import item_logger

if TYPE_CHECKING:
    from trioworker._store.api import FencedTransaction, HandlerStore, OpenFenced
    from trioworker._worker.asyncio_loop import AsyncioLoop
    from trioworker._worker.attempt import Attempt

T = TypeVar("T")


class Shared:
    """What every attempt of one Worker shares: built once, not per item."""

    __slots__ = (
        "asyncio_loop",
        "limiter",
        "log",
        "lost",
        "open_fenced",
        "steps",
        "store",
        "worker_id",
    )

    def __init__(
        self,
        worker_id: str,
        limiter: trio.CapacityLimiter,
        store: HandlerStore,
        open_fenced: OpenFenced,
        log: logging.Logger,
        *,
        steps: Steps,
        lost: Callable[[Attempt], None],
    ) -> None:
        self.worker_id = worker_id
        self.limiter = limiter
        self.store = store
        self.open_fenced = open_fenced
        self.log = log
        #: Where `Context.step` reads and records steps (the Worker's store).
        self.steps = steps
        #: Stops an attempt as lost (the executor's: it owns the attempt's scope).
        self.lost = lost
        #: Where `Context.run_asyncio` runs asyncio code (the Worker sets it as it starts).
        self.asyncio_loop: AsyncioLoop | None = None


class Context:
    """What a handler gets besides its item: ``async def handler(item, ctx)``.

    The attempt's cancel scope is the Worker's, never the handler's: a handler reads
    `deadline` and `stopping`, and opens scopes of its own for its own time limits.

    >>> ctx.worker_id                          # doctest: +SKIP
    'host-4711'
    """

    __slots__ = ("_attempt", "_log", "_shared")

    def __init__(self, shared: Shared, attempt: Attempt) -> None:
        self._shared = shared
        self._attempt = attempt
        self._log: logging.LoggerAdapter[logging.Logger] | None = None

    @property
    def worker_id(self) -> str:
        """The Worker running the attempt (HOST-PID unless set with --worker-id)."""
        return self._shared.worker_id

    @property
    def item(self) -> WorkItem:
        """The attempt this context belongs to."""
        return self._attempt.item

    @property
    def limiter(self) -> trio.CapacityLimiter:
        """Bounds parallel file work across this Worker (`--max-concurrent-files`)."""
        return self._shared.limiter

    @property
    def store(self) -> HandlerStore:
        """The Worker's store as a `trioworker.HandlerStore`: its client operations,
        never the Worker's own (no claims, no fenced writes). Enqueue follow-up work
        with `await ctx.store.enqueue(...)` (pass `tx=` to enqueue inside
        `ctx.transaction()`), read, cancel, pause."""
        return self._shared.store

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger whose lines carry the item's id, attempt, kind, scope and the Worker."""
        if self._log is None:
            self._log = item_logger(self._shared.log, self.item, self.worker_id)
        return self._log

    @property
    def deadline(self) -> float:
        """The attempt's self-stop deadline on Trio's clock (`trio.current_time()`):
        half a lease after the last heartbeat that succeeded. Successful heartbeats
        move it later; at it the handler is cancelled. Read it to size a step
        (`trio.current_effective_deadline()` gives the sooner of it and the kind's
        timeout); nothing a handler does moves it."""
        return self._attempt.deadline

    @property
    def stopping(self) -> bool:
        """Whether this attempt has been asked to stop: its self-stop deadline has
        passed, a heartbeat found it lost or a cancel requested, the kind's timeout ran
        out, or the Worker is shutting down. Its cancel scope is cancelled then."""
        return self._attempt.stop_requested

    @property
    def cancel_scope(self) -> NoReturn:
        """Gone (0.2): the attempt's scope is the Worker's alone."""
        raise AttributeError(
            "ctx.cancel_scope is gone: the attempt's cancel scope belongs to the Worker."
            " Read ctx.deadline and ctx.stopping; for a time limit of the handler's own,"
            " open a scope inside it (with trio.move_on_after(...): ...)"
        )

    @property
    def completed_in_transaction(self) -> bool:
        """Whether the handler completed its item inside `transaction()` (committed)."""
        return self._attempt.completed

    async def run_asyncio(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run the asyncio coroutine function `fn(*args)` (an asyncio-only library's
        call) on the Worker's asyncio loop, opened on first use; its result, or its
        exception. A cancel of the attempt cancels the asyncio task and returns once
        it has ended (docs/guide/handlers.md, "Calling asyncio libraries")."""
        loop = self._shared.asyncio_loop
        if loop is None:
            raise RuntimeError("ctx.run_asyncio needs a running Worker (Worker.run)")
        return await loop.run(fn, *args)

    async def run_in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking file work in a thread, within the Worker's file limiter.

        A cancel waits for the thread to return (it is not abandoned, since an
        abandoned thread would go on writing files); inside long loops, call
        `trio.from_thread.check_cancelled()` to stop early.
        """
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[FencedTransaction]:
        """A transaction on the Worker's own connections, fenced by this attempt.

        It locks the item's row and checks that this attempt still owns it; if not, it
        raises `trioworker.Lost` (the Worker then writes nothing for the attempt). It
        commits only while the attempt owns the item and before its self-stop
        deadline; past the deadline it rolls back and raises `trioworker.SelfStopped`.
        The row stays locked until the commit, so keep the transaction short (the
        Worker's heartbeat passes over the item meanwhile). Call `tx.complete()` to
        make the item's success durable in the same commit as the writes: exactly once
        for database effects. The item then stays Running, holding its scope, until
        the handler has returned: its cleanup (a `finally` removing a folder, say)
        still runs alone in the scope; the Worker then finishes it as Succeeded,
        whatever the handler does after that commit.

        A lost link to PostgreSQL, or a read-only answer (SQLSTATE 25006: a primary
        demoted in a failover), raises `trioworker.DatabaseUnavailable` here; let it
        propagate and the attempt counts as a stall (lease recovery requeues the item),
        not as a failure of the handler.

            async with ctx.transaction() as tx:
                await tx.execute("INSERT INTO thumbnails (asset) VALUES (%s)", [asset])
                tx.complete()
        """
        attempt = self._attempt
        try:
            async with self._shared.open_fenced(
                attempt.item.id, attempt.item.attempt, until=self._deadline
            ) as tx:
                yield tx
        except DatabaseUnavailable as exc:
            attempt.database_errors.append(exc)
            raise
        if tx.completes:
            attempt.completed = True

    async def step(self, name: str, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run `await fn(*args)` once for this item, across its attempts: its value
        (JSON) is recorded, fenced by this attempt and before its self-stop deadline,
        and a later attempt (after a self-stop, a stall, a retry) gets the recorded
        value back without calling `fn`. What it returns is the value as stored JSON
        reads back (a tuple comes back a list), on every attempt alike.

        `fn` runs again on a later attempt if this one ends before the record commits
        (its process killed, its link lost, its deadline passed): make its effects safe
        to repeat. A value that cannot be stored raises UnstorableResult; if another
        attempt owns the item now, the record is refused, the attempt stops as lost and
        this raises `trioworker.Lost` (SelfStopped past the deadline).

            folders = await ctx.step("scan /photos/2024", scan, "/photos/2024")
        """
        check_step_name(name)
        attempt = self._attempt
        item, steps = attempt.item, self._shared.steps
        try:
            found, value = await steps.step(item.id, name)
            if found:
                return value
            text = result_json(await fn(*args), f"step {name!r}'s value")
            recorded = await steps.record_step(
                item.id, item.attempt, name, text, until=self._deadline
            )
        except DatabaseUnavailable as exc:
            attempt.database_errors.append(exc)
            raise
        except Lost:  # SelfStopped too: past its deadline, the self-stop is its reason
            self._shared.lost(attempt)
            raise
        if not recorded:  # this attempt recorded it already, in a step of the same name
            return (await steps.step(item.id, name))[1]
        return None if text is None else json.loads(text)

    async def parent_results(self) -> dict[int, Any]:
        """The results of the items this one was enqueued after (`after=`), by id, as
        stored JSON reads back: every one Succeeded before this item could be claimed.
        {} for an item without parents.

            thumbnails = await ctx.parent_results()   # {12: {"path": ...}, 13: ...}
        """
        attempt = self._attempt
        try:
            return await self._shared.steps.parent_results(attempt.item.id)
        except DatabaseUnavailable as exc:
            attempt.database_errors.append(exc)
            raise

    def _deadline(self) -> float:
        return self._attempt.deadline


class Steps(Protocol):
    """What `Context.step` and `Context.parent_results` read and write through the
    Worker's store (`WorkerStore.step`, `record_step`, `parent_results`)."""

    async def step(self, id: int, name: str) -> tuple[bool, Any]: ...

    async def parent_results(self, id: int) -> dict[int, Any]: ...

    async def record_step(
        self, id: int, attempt: int, name: str, result: str | None, *, until: Callable[[], float]
    ) -> bool: ...


def check_step_name(name: object) -> None:
    """A step's name: a non-empty string of at most 200 characters (ValueError)."""
    if not isinstance(name, str) or not name or len(name) > MAX_STEP_NAME:
        raise ValueError(
            f"a step's name is a non-empty string of at most {MAX_STEP_NAME} characters,"
            f" not {name!r:.80}"
        )


#: The longest step name (the table's work_steps_name_sane).
MAX_STEP_NAME = 200
