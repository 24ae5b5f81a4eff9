"""One claimed attempt as the rule sees it, and the Worker slot it holds.

An attempt's self-stop deadline is half a lease after the send time of its last
heartbeat that succeeded (the claim counts as the first). Only a successful heartbeat
moves it (`renew`), and never once it has passed: from the deadline on the attempt is
self-stopped, whatever stopped it before, and writes nothing. Whoever else asks it to
stop (a lost lease, a cancel request, the shutdown) records why first (`stop`). The
handler itself never holds the scope: it reads `Context.deadline` and
`Context.stopping`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import trio

from trioworker._core.model import WorkItem
from trioworker._core.policy import CancelReason

if TYPE_CHECKING:
    from trioworker._worker.executor import AttemptTrace


class Attempt:
    """One attempt: its item, its self-stop deadline, why it was asked to stop, and
    the cancel scopes the executor runs its handler in."""

    __slots__ = (
        "_reason",
        "bound",
        "completed",
        "database_errors",
        "deadline",
        "item",
        "result",
        "scope",
        "slot",
        "stop_at",
        "timeout",
        "trace",
    )

    def __init__(self, item: WorkItem, deadline: float, slot: Slot, trace: AttemptTrace) -> None:
        self.item = item
        #: The self-stop deadline, on Trio's clock; the handler's scope carries it.
        self.deadline = deadline
        self.slot = slot
        self.trace = trace
        #: The handler's cancel scope (its nursery's), while the handler runs.
        self.scope: trio.CancelScope | None = None
        #: The kind's timeout, a scope of its own inside `scope`, if the kind has one.
        self.timeout: trio.CancelScope | None = None
        #: When someone first asked the attempt to stop (inf: nobody has).
        self.stop_at = math.inf
        #: When its handler must have ended: the StopWatch's key for it while the
        #: handler runs (the executor sets it), inf once it has ended.
        self.bound: float
        #: Whether its handler completed the item in its fenced transaction (committed):
        #: its success is durable, and the write after it finishes the item Succeeded.
        self.completed = False
        #: What its handler returned, as the JSON text to store with its Succeeded
        #: (None: it returned None, or completed in its own transaction).
        self.result: str | None = None
        #: The lost database links its fenced transactions raised: the Worker's
        #: problem, not the handler's.
        self.database_errors: list[BaseException] = []
        self._reason: CancelReason | None = None

    @property
    def self_stopped(self) -> bool:
        """Whether the deadline has passed: from then on the attempt writes nothing."""
        return trio.current_time() >= self.deadline

    @property
    def reason(self) -> CancelReason | None:
        """Why the handler was stopped; the self-stop beats any reason recorded before
        it, once the deadline has passed. The kind's timeout names itself: its scope's
        `cancel_called`), and wins over a reason recorded at or after its deadline."""
        if self.self_stopped:
            return CancelReason.SELF_STOP
        timeout = self.timeout
        if timeout is not None and timeout.cancel_called and timeout.deadline <= self.stop_at:
            return CancelReason.TIMEOUT
        return self._reason

    @property
    def stop_requested(self) -> bool:
        """Whether the handler has been asked to stop, for whatever reason."""
        return self.reason is not None

    @property
    def renewable(self) -> bool:
        """Whether a heartbeat may renew its lease: its handler runs, its deadline has
        not passed and no heartbeat found it lost (after a cancel request, a timeout or
        at shutdown the lease is still held, until the write that follows)."""
        return self._reason is not CancelReason.LOST and not self.self_stopped

    def renew(self, deadline: float) -> None:
        """A heartbeat renewed the lease: the deadline moves to `deadline`, unless it
        has passed already (a self-stop is for good) or is later than that."""
        if not self.self_stopped:
            self.deadline = max(self.deadline, deadline)
            if self.scope is not None:
                self.scope.deadline = self.deadline

    def stop(self, reason: CancelReason) -> None:
        """Record why, then cancel the handler (the first reason wins)."""
        if self._reason is None:
            self._reason = reason
            self.stop_at = trio.current_time()
        if self.scope is not None:
            self.scope.cancel()

    def hand_over_slot(self) -> Slot | None:
        """The slot this attempt holds, for another to take over (the claim along with
        its completion); it holds none from then on (None: it held none any more)."""
        slot = self.slot
        self.slot = SPENT
        return None if slot.spent else slot  # (SPENT is spent)

    def must_end_by(self, grace: float) -> float:
        """When the handler must have ended: `grace` after it was asked to stop, by
        its deadline at the latest."""
        timeout = math.inf if self.timeout is None else self.timeout.deadline
        return min(self.deadline, self.stop_at, timeout) + grace


class Slots:
    """A Worker's concurrency: a token per running attempt (`Slot`), so an attempt
    can give back only its own, once, even when a failover hands the same
    (id, attempt) to this Worker twice."""

    def __init__(self, total: int, on_release: Callable[[], None]) -> None:
        self._limiter = trio.CapacityLimiter(total)
        self._on_release = on_release

    async def take(self) -> Slot:
        """A free slot, waiting for one."""
        slot = Slot(self)
        await self._limiter.acquire_on_behalf_of(slot)
        return slot

    def take_free(self) -> list[Slot]:
        """Every slot that is free now, without waiting."""
        free = [Slot(self) for _ in range(int(self._limiter.available_tokens))]
        for slot in free:
            self._limiter.acquire_on_behalf_of_nowait(slot)
        return free

    def unused(self, slots: Sequence[Slot]) -> None:
        """Give back slots a claim found no work for (that wakes nobody)."""
        for slot in slots:
            self._limiter.release_on_behalf_of(slot)

    def _give_back(self, slot: Slot) -> None:
        self._limiter.release_on_behalf_of(slot)
        self._on_release()


class Slot:
    """One of a Worker's slots, held by one attempt until `release()`."""

    __slots__ = ("_slots",)

    def __init__(self, slots: Slots | None) -> None:
        self._slots: Slots | None = slots

    @property
    def spent(self) -> bool:
        """Whether it was given back."""
        return self._slots is None

    def release(self) -> None:
        """Give the slot back (its attempt is done with it): the Worker claims again at
        once, since more work may be waiting. Again: nothing."""
        slots, self._slots = self._slots, None
        if slots is not None:
            slots._give_back(self)


#: The slot of an attempt that handed its own over: giving it back does nothing.
SPENT = Slot(None)
