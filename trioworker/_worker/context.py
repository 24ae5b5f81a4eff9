"""What a handler gets besides its item: `Context`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio

from trioworker._core.errors import DatabaseUnavailable
from trioworker._core.model import WorkItem

if TYPE_CHECKING:
    from trioworker._store.api import Client, FencedTransaction, OpenFenced

T = TypeVar("T")


@attrs.define(eq=False)
class Context:
    """What a handler gets besides its item: ``async def handler(item, ctx)``.

    >>> ctx.worker_id                          # doctest: +SKIP
    'host-4711'
    """

    #: The Worker running the attempt (HOST-PID unless set with --worker-id).
    worker_id: str
    #: The attempt's own cancel scope: cancelled on self-stop, loss, a cancel request,
    #: the kind's timeout or shutdown. Handlers need not touch it; see `stopping`.
    cancel_scope: trio.CancelScope
    #: Bounds parallel file work across this Worker (`--max-concurrent-files`).
    limiter: trio.CapacityLimiter
    #: A logger whose lines carry the item's id, attempt, kind, scope and the Worker.
    log: logging.LoggerAdapter[logging.Logger]
    #: The queue's client face (never the Worker's own: no claims, no fenced writes):
    #: enqueue follow-up work with `await ctx.store.enqueue(...)` (pass `tx=` to
    #: enqueue inside `ctx.transaction()`), read, cancel, pause.
    store: Client
    #: The attempt this context belongs to.
    item: WorkItem
    #: Opens the attempt's fenced transaction (the Worker's store's).
    _open_fenced: OpenFenced = attrs.field(repr=False, kw_only=True)
    #: Called once a transaction that completed the item has committed.
    _on_completed: Callable[[], None] | None = attrs.field(default=None, repr=False)
    _completed: bool = attrs.field(default=False, init=False)
    _database_error: DatabaseUnavailable | None = attrs.field(default=None, init=False)

    @property
    def stopping(self) -> bool:
        """Whether this attempt has been asked to stop (its cancel scope is cancelled)."""
        return self.cancel_scope.cancel_called

    @property
    def completed_in_transaction(self) -> bool:
        """Whether the handler finished its item inside `transaction()` (committed)."""
        return self._completed

    def lost_database(self, error: BaseException | None) -> bool:
        """Whether `error` (what the handler raised) is, or holds, the lost database link
        that a `transaction()` of this attempt raised: the Worker's problem, not the
        handler's."""
        lost = self._database_error
        if lost is None or error is None:
            return False
        if isinstance(error, BaseExceptionGroup):
            return error.split(lambda e: e is lost)[0] is not None
        return error is lost

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
        raises `trioworker.Lost` (the Worker then writes nothing for the attempt). The
        handler's writes commit only while the attempt holds the item and before its
        self-stop deadline (past it, `trioworker.SelfStopped`, a `Lost`: nothing is
        kept); the row stays locked until the commit, so keep the transaction short (the
        item's heartbeat waits for it). Call `tx.complete()` to commit the attempt's
        success with the writes: exactly once for database effects, and durable (no
        attempt runs the item again). The item stays Running, its scope taken, until the
        handler has returned; then the Worker finishes it Succeeded and the scope's next
        item may start, so cleanup after the block (a `finally`) never overlaps it.

        A lost link to PostgreSQL, or a read-only answer (SQLSTATE 25006: a primary
        demoted in a failover), raises `trioworker.DatabaseUnavailable` here; let it
        propagate and the attempt counts as a stall (lease recovery requeues the item),
        not as a failure of the handler.

            async with ctx.transaction() as tx:
                await tx.execute("INSERT INTO thumbnails (asset) VALUES (%s)", [asset])
                tx.complete()
        """
        try:
            async with self._open_fenced(
                self.item.id, self.item.attempt, until=lambda: self.cancel_scope.deadline
            ) as tx:
                yield tx
        except DatabaseUnavailable as exc:
            self._database_error = exc
            raise
        if tx.completes:
            self._completed = True
            if self._on_completed is not None:
                self._on_completed()
