"""Quiesce a scope: wait until no attempt for it can still be writing.

Pause the scope, ask its Running items (one per slot: a scope may run more than one,
docs/design/limits.md) to stop, and watch them until each has ended with its fenced
write, or its lease has expired by the database's clock: an attempt cut
off from the database stops itself at lease/2 after its last good heartbeat and its
process is dead by lease/2 + stop grace + kill margin, both before its lease ends
(docs/design/quiesce.md has the argument and the assumption it rests on). The scope
stays paused.
"""

from __future__ import annotations

import attrs
import trio

from trioworker._core.model import ScopeHolder
from trioworker._core.settings import QUIESCE_POLL
from trioworker._core.text import visible
from trioworker._core.validation import validate_scope
from trioworker._store.api import Store


@attrs.frozen
class QuiesceResult:
    """`done`: nothing can be writing for the scope any more. `holder`: what held it
    last (None: nothing was running), as text for people."""

    done: bool
    waited: float
    holder: str | None


def _attempt(holder: ScopeHolder) -> str:
    return (
        f"item {holder.id} ({visible(holder.kind)}) attempt {holder.attempt} on Worker"
        f" {visible(str(holder.worker_id))}"
    )


def describe(holder: ScopeHolder) -> str:
    """The scope's holder as last seen Running."""
    state = "cancel requested" if holder.cancel_requested else "running"
    lease = (
        f"lease expires in {holder.lease_left:.1f}s"
        if holder.lease_left > 0
        else f"lease expired {abs(holder.lease_left):.1f}s ago"
    )
    return f"{_attempt(holder)}: {state}, {lease}"


def describe_ended(holder: ScopeHolder) -> str:
    """A holder seen Running before, no longer Running: its attempt has written."""
    return f"{_attempt(holder)}, which has ended"


async def quiesce(
    store: Store,
    scope: str,
    *,
    timeout: float,  # noqa: ASYNC109  (on timeout it says what still holds the scope)
    poll: float = QUIESCE_POLL,
) -> QuiesceResult:
    """Pause `scope` and wait (up to `timeout` seconds) until no attempt for it can be
    writing; `done` False on timeout, with what still holds it."""
    validate_scope(scope)
    started = trio.current_time()
    held_by: str | None = None
    last: tuple[ScopeHolder, ...] = ()  # the holders seen at the last look
    with trio.move_on_after(timeout):
        await store.pause(scope=scope)
        asked: set[tuple[int, int]] = set()
        while True:
            # Every slot of the scope: a scope whose limit is over one runs several.
            holders, heads = await store.scope_holders(scope)
            seen, last = last, tuple(holders)
            if holders:
                held_by = "; ".join(describe(holder) for holder in holders)
                live = [holder for holder in holders if holder.lease_left > 0]
                if not live:
                    return QuiesceResult(True, trio.current_time() - started, held_by)
                for holder in live:
                    if (holder.id, holder.attempt) not in asked:
                        await store.cancel(holder.id)
                        asked.add((holder.id, holder.attempt))
            elif heads:
                # A head outlived the pause's bounded wait (held in someone's own
                # transaction): a claim in flight may hold another, so pause again.
                held_by = "a queued item still a head (held by another transaction)"
                await store.pause(scope=scope)
            else:
                # those seen at the last look have ended since: not their leases as then
                held_by = "; ".join(describe_ended(holder) for holder in seen) or held_by
                return QuiesceResult(True, trio.current_time() - started, held_by)
            await trio.sleep(poll)
    return QuiesceResult(False, trio.current_time() - started, held_by)
