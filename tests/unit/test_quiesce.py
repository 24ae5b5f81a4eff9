"""Quiescing a scope on Trio's virtual clock, with the in-memory store."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from tests.support.fakes import ScriptedStore
from trioworker import InvalidWorkItem
from trioworker._core.model import ScopeHolder
from trioworker._store.quiesce import QUIESCE_POLL, QuiesceResult, describe, quiesce


async def ghost(store: ScriptedStore, scope: str = "s", lease: float = 60.0) -> None:
    """An item of `scope` Running on a Worker that will never answer."""
    await store.enqueue("A", scope=scope)
    assert await store.claim("ghost", lease, kinds=["A"])


async def test_an_idle_scope_is_quiet_at_once_and_stays_paused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Nothing running: done at once, and the scope is paused."""
    store = ScriptedStore()
    await trio.sleep(10)  # the wait is counted from the call, not from time 0
    assert await quiesce(store, "s", timeout=10) == QuiesceResult(True, 0.0, None)
    assert [p.scope for p in await store.pauses()] == ["s"]
    assert "request_cancel" not in store.calls


async def test_a_running_item_is_asked_once_to_stop_and_watched_until_it_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The holder is asked to stop (once); when it has written at 10 s, the next look
    (every 7 s) finds the scope quiet, and says what held it last."""
    store = ScriptedStore()
    await ghost(store)

    async def finish() -> None:
        await trio.sleep(10)
        assert await store.cancel_attempt(1, 1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(finish)
        result = await quiesce(store, "s", timeout=100, poll=7)
    # Issue 20: not "cancel requested, lease expires in 53.0s" of an item already ended.
    ended = "item 1 (A) attempt 1 on Worker ghost, which has ended"
    assert result == QuiesceResult(True, 14.0, ended)
    assert store.calls.count("request_cancel") == 1
    assert store.times["scope_holder"] == [0.0, 7.0, 14.0]


async def test_a_holder_that_never_answers_is_waited_out_to_its_lease(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A Worker cut off from the database: its lease (60 s) is the end of it, not a
    moment before (a look at 59.5 s, half a second before, waits on)."""
    store = ScriptedStore()
    await trio.sleep(10)
    await ghost(store)
    result = await quiesce(store, "s", timeout=100, poll=6)
    assert (result.done, result.waited) == (True, 60.0)
    later = ScriptedStore()
    await ghost(later)
    assert (await quiesce(later, "s", timeout=200, poll=59.5)).waited == 119.0
    assert result.holder is not None
    assert result.holder.startswith(
        "item 1 (A) attempt 1 on Worker ghost: cancel requested, lease expired"
    )


async def test_quiesce_times_out_saying_what_still_holds_the_scope(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """timeout=30 against a 60 s lease: not done, after 30 s, with the last holder seen."""
    store = ScriptedStore()
    await trio.sleep(10)
    await ghost(store)
    result = await quiesce(store, "s", timeout=30, poll=7)
    assert result == QuiesceResult(
        False,
        30.0,
        "item 1 (A) attempt 1 on Worker ghost: cancel requested, lease expires in 32.0s",
    )


async def test_a_new_attempt_holding_the_scope_is_asked_to_stop_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The holder ends, and the scope's next item is taken at once (by someone who
    resumed the scope meanwhile): that attempt gets its own cancel request."""
    store = ScriptedStore()
    await ghost(store)
    await store.enqueue("A", scope="s")

    async def take_over() -> None:
        await trio.sleep(6.5)  # between two looks
        assert await store.cancel_attempt(1, 1)
        await store.resume(scope="s")
        assert await store.claim("ghost2", 60.0, kinds=["A"])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take_over)
        result = await quiesce(store, "s", timeout=20, poll=1)
    assert store.calls.count("request_cancel") == 2
    assert result.holder is not None and "item 2 (A) attempt 1 on Worker ghost2" in result.holder


class HeadStore(ScriptedStore):
    """The scope shows a head nobody holds, twice."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = [True, True]

    async def scope_holders(self, scope: str) -> tuple[list[ScopeHolder], bool]:
        holders, _ = await super().scope_holders(scope)
        return holders, (self.heads.pop(0) if self.heads else False)


async def test_a_head_held_in_another_transaction_is_paused_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A head outlived the pause: pause again, and look again after the poll."""
    store = HeadStore()
    result = await quiesce(store, "s", timeout=10)
    assert result == QuiesceResult(
        True,
        pytest.approx(2 * QUIESCE_POLL),  # type: ignore[arg-type]
        "a queued item still a head (held by another transaction)",
    )
    assert store.calls.count("pause") == 3


async def test_a_bad_scope_is_refused(autojump_clock: trio.testing.MockClock) -> None:
    """The scope is checked like an enqueue's."""
    with pytest.raises(InvalidWorkItem):
        await quiesce(ScriptedStore(), "", timeout=1)


def holder(lease_left: float, cancel_requested: bool = False) -> ScopeHolder:
    return ScopeHolder(3, 2, "K", "w", cancel_requested, lease_left)


def test_a_holder_is_described_for_people() -> None:
    """Its item, attempt, Worker, state and lease."""
    assert (
        describe(holder(12.5))
        == "item 3 (K) attempt 2 on Worker w: running, lease expires in 12.5s"
    )
    assert describe(holder(-2.5, True)) == (
        "item 3 (K) attempt 2 on Worker w: cancel requested, lease expired 2.5s ago"
    )
    assert describe(holder(0.0)).endswith("lease expired 0.0s ago")  # not -0.0s
    assert describe(holder(0.5)).endswith("lease expires in 0.5s")


async def test_quiesce_waits_for_every_slot_of_a_scope(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Scope s runs two items (limit 2): both are asked to stop. The first holder's
    Worker never answers and its lease (3 s) runs out; that is not the end while the
    second, in slot 2, still writes: quiesce is done at the first look after it ends
    at 11.5 s."""
    store = ScriptedStore()
    await store.set_limit(scope="s", running=2)
    await ghost(store, lease=3.0)
    await ghost(store)
    assert [h.slot for h in (await store.scope_holders("s"))[0]] == [1, 2]

    async def finish() -> None:
        await trio.sleep(11.5)  # between two looks
        assert await store.cancel_attempt(2, 1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(finish)
        result = await quiesce(store, "s", timeout=100, poll=1)
    assert (result.done, result.waited) == (True, 12.0)
    assert store.calls.count("request_cancel") == 2


async def test_holders_that_ended_between_two_looks_are_each_named_as_ended(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Both slots of a scope at limit 2 end at 10 s; the next look (14 s) finds it quiet
    and names the two, in slot order, as ended."""
    store = ScriptedStore()
    await store.set_limit(scope="s", running=2)
    await ghost(store)
    await ghost(store)

    async def finish() -> None:
        await trio.sleep(10)
        assert await store.cancel_attempt(1, 1)
        assert await store.cancel_attempt(2, 1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(finish)
        result = await quiesce(store, "s", timeout=100, poll=7)
    assert (result.done, result.waited) == (True, 14.0)
    assert result.holder == (
        "item 1 (A) attempt 1 on Worker ghost, which has ended;"
        " item 2 (A) attempt 1 on Worker ghost, which has ended"
    )


async def test_a_timeout_names_every_slot_still_holding_the_scope(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two holders of a scope at limit 2 that never answer: on timeout, both are named,
    in slot order."""
    store = ScriptedStore()
    await store.set_limit(scope="s", running=2)
    await ghost(store)
    await ghost(store)
    result = await quiesce(store, "s", timeout=5, poll=1)
    assert not result.done and result.holder is not None
    first, second = result.holder.split("; ")
    assert first.startswith("item 1 (A) attempt 1 on Worker ghost: cancel requested")
    assert second.startswith("item 2 (A) attempt 1 on Worker ghost: cancel requested")
