"""`trioworker.testing.worker`: a real Worker over the in-memory store, on virtual time."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trioworker import Context, Registry, RetryPolicy, Status, WorkItem
from trioworker._core.policy import AttemptOutcome
from trioworker.testing import MemoryStore, worker


async def test_a_flaky_handler_is_retried_on_the_virtual_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The helper runs the real Worker: a handler that fails once is retried after its
    backoff (virtual seconds, no real wait) and then succeeds."""
    registry = Registry()
    calls: list[float] = []

    @registry.handler("Flaky", retry=RetryPolicy(initial_delay=30.0, jitter=0.0))
    async def flaky(item: WorkItem, ctx: Context) -> None:
        calls.append(trio.current_time())
        if len(calls) == 1:
            raise OSError("the share is not mounted yet")

    async with worker(registry) as w:
        item = await w.store.enqueue("Flaky", scope="7")
        state = await w.finished(item.id)
    assert (state.status, state.attempt, state.failures) == (Status.SUCCEEDED, 2, 1)
    assert calls[1] - calls[0] >= 30.0 and w.fail_stops == []


async def test_a_handler_completing_in_its_transaction_is_written_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`ctx.transaction()` works on the in-memory store too (without SQL): a handler
    that completes in it makes its success durable there, and the Worker's one write
    after it returns finishes the item Succeeded."""
    registry = Registry()

    @registry.handler("Done")
    async def done(item: WorkItem, ctx: Context) -> None:
        async with ctx.transaction() as tx:
            tx.complete()

    async with worker(registry) as w:
        item = await w.store.enqueue("Done")
        state = await w.finished(item.id)
    assert state.status is Status.SUCCEEDED
    applied = [write.op for write in w.store.writes if write.applied and write.op != "heartbeat"]
    assert applied == ["complete_in_transaction", "complete"]


async def test_enqueueing_in_another_transaction_says_memory_has_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Enqueueing in a transaction that is not a handler's own fenced one fails with a
    message saying why (the in-memory store has no others), not a TypeError."""
    other = MemoryStore()
    store = MemoryStore()
    await other.enqueue("K")
    item = await other.claim("w", 60.0, kinds=["K"])
    assert item is not None
    async with other.fenced_transaction(item.id, item.attempt) as tx:
        with pytest.raises(NotImplementedError, match="MemoryStore has no transactions"):
            await store.enqueue("Summarise", tx=tx)
    assert store.items() == []


async def test_periodic_false_fires_no_schedule_while_the_default_does(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`worker(registry, periodic=False)` runs none of the registry's periodic items
    over an hour of virtual time; the default fires them."""
    registry = Registry()
    registry.periodic("Tick", every=60)

    @registry.handler("Tick")
    async def tick(item: WorkItem, ctx: Context) -> None:
        pass

    async with worker(registry, periodic=False) as w:
        await trio.sleep(3600)
    assert w.store.items() == []
    assert registry.schedules != []
    async with worker(registry) as w:
        await trio.sleep(3600)
    assert {i.kind for i in w.store.items()} == {"Tick"}


async def test_the_helper_passes_a_tracer_to_the_worker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`worker(tracer=...)`: each attempt is traced, with the outcome of its write."""
    registry = Registry()
    ended: list[tuple[int, str]] = []

    class Trace:
        def __init__(self, item: WorkItem) -> None:
            self.item = item

        def event(self, name: str, detail: str | None = None) -> None:
            pass

        def end(self, outcome: AttemptOutcome, error: BaseException | None) -> None:
            ended.append((self.item.id, outcome.value))

    class Tracer:
        def start(self, item: WorkItem) -> Trace:
            return Trace(item)

    @registry.handler("Noop")
    async def noop(item: WorkItem, ctx: Context) -> None:
        pass

    async with worker(registry, tracer=Tracer()) as w:
        item = await w.store.enqueue("Noop")
        await w.finished(item.id)
    assert ended == [(item.id, "complete")]
