"""The fenced transaction keeps the self-stop rule (issue 31): it opens and commits only
before its attempt's self-stop deadline. On the in-memory store and Trio's virtual
clock; tests/integration/test_fenced.py holds PostgreSQL to the same."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from tests.support.contexts import a_context
from tests.support.fakes import running
from trioworker import Context, Lost, Registry, SelfStopped, Settings, Status, WorkItem
from trioworker._core.policy import Action, Outcome, RetryPolicy, decide
from trioworker.testing import MemoryStore


async def claimed(store: MemoryStore) -> WorkItem:
    await store.enqueue("K", scope="s")
    item = await store.claim("w", 60.0, kinds=["K"])
    assert item is not None
    return item


async def test_past_its_deadline_a_fenced_transaction_does_not_open(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """At or after `until()`, SelfStopped (a Lost) as it opens: the body never runs and
    the store is not called."""
    store = MemoryStore()
    item = await claimed(store)
    await trio.sleep(5)
    with pytest.raises(SelfStopped):
        async with store.fenced_transaction(item.id, item.attempt, until=lambda: 5.0):
            raise AssertionError("opened past the deadline")  # pragma: no cover
    assert "fenced_transaction" not in store.calls
    assert issubclass(SelfStopped, Lost)


async def test_a_deadline_reached_inside_the_transaction_refuses_the_commit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Opened at 0 s with the deadline at 5 s, committing at 5 s exactly: SelfStopped,
    and the completion is not applied (the item is Running, no success noted)."""
    store = MemoryStore()
    item = await claimed(store)
    with pytest.raises(SelfStopped):
        async with store.fenced_transaction(item.id, item.attempt, until=lambda: 5.0) as tx:
            tx.complete()
            await trio.sleep(5)
    [state] = store.items()
    assert (state.status, state.completed_at) == (Status.RUNNING, None)
    assert [w.op for w in store.writes] == []


async def test_a_deadline_moved_on_meanwhile_lets_it_commit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`until` is asked again at the commit: a deadline a good heartbeat moved past the
    commit lets it commit, just before the deadline too."""
    store = MemoryStore()
    item = await claimed(store)
    deadline = [5.0]
    async with store.fenced_transaction(item.id, item.attempt, until=lambda: deadline[0]) as tx:
        tx.complete()
        deadline[0] = 40.0
        await trio.sleep(39.5)
    [state] = store.items()
    assert state.status is Status.RUNNING and state.completed_at is not None
    assert [w.op for w in store.writes] == ["complete_in_transaction"]


async def test_a_handlers_transaction_commits_only_before_its_attempts_self_stop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`ctx.transaction()` passes the attempt's self-stop deadline as `until`: a handler
    that goes on past it (shielded, say) has its completing commit refused, and what it
    raises is a Lost, for which the Worker writes nothing. Once the deadline is moved on
    (a heartbeat succeeded), the same commit is made."""
    store = MemoryStore()
    item = await claimed(store)
    ctx, attempt = a_context(store, item, deadline=trio.current_time() + 30.0)
    with pytest.raises(SelfStopped) as raised:
        async with ctx.transaction() as tx:
            tx.complete()
            await trio.sleep(31)
    assert not ctx.completed_in_transaction
    assert store.items()[0].completed_at is None
    no_write = decide(None, Outcome(error=raised.value), failures_before=0, policy=RetryPolicy())
    assert no_write.action is Action.NOTHING
    ctx, attempt = a_context(store, item, deadline=trio.current_time() + 5.0)
    async with ctx.transaction() as tx:
        tx.complete()
        attempt.renew(trio.current_time() + 30.0)
        await trio.sleep(10)
    assert ctx.completed_in_transaction
    assert store.items()[0].completed_at is not None


async def test_a_workers_fenced_transactions_ask_the_server_to_end_them_past_their_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The Worker opens each handler's transaction with its settings' server timeout (the
    self-stop and a quarter of it): what the server lets it sit idle, or run one
    statement, before it ends it (a host gone without a word)."""
    store, registry = MemoryStore(), Registry()

    @registry.handler("K")
    async def handler(item: WorkItem, ctx: Context) -> None:
        async with ctx.transaction() as tx:
            tx.complete()

    await store.enqueue("K", scope="s")
    async with running(store, registry, Settings(lease=8, heartbeat=1)):
        await trio.sleep(1)
    assert store.server_timeouts == [5.0]
