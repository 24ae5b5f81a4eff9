"""The limits contract, run against PostgreSQL and the in-memory store alike, so that
MemoryStore (and every unit test on it) holds limits as the database does."""

from __future__ import annotations

import datetime as dt
import os
import socket

import trio

from tests.support.harness import Harness
from trioworker import Rate, Status
from trioworker._core.limits import LimitChange
from trioworker._core.model import WorkerInfo

LEASE = 30.0


async def claim_all(harness: Harness, kinds: list[str], batch: int = 1) -> list[int]:
    """Claim until nothing more comes; the ids claimed, in order."""
    ids = []
    while claimed := await harness.store.claim_batch("w", LEASE, batch, kinds=kinds):
        ids += [item.id for item in claimed]
    return ids


async def test_a_scope_at_limit_two_runs_two_and_then_the_next(harness: Harness) -> None:
    """S at 2: two of its five items run (one claim each, any batch size), T's item is
    not held up, and when one of S's ends the next starts."""
    store = harness.store
    await store.set_limit(scope="S", running=2)
    s = [(await store.enqueue("K", scope="S")).id for _ in range(5)]
    t = await store.enqueue("K", scope="T")
    assert sorted(await claim_all(harness, ["K"], batch=10)) == [s[0], s[1], t.id]
    item = next(i for i in harness.items() if i.id == s[0])
    assert await store.complete(s[0], item.attempt)
    assert await claim_all(harness, ["K"]) == [s[2]]


async def test_one_claim_takes_every_item_that_may_start(harness: Harness) -> None:
    """S at 3 with five items, T at the default 1 with two, K at 4 across them: one
    claim for ten takes S's first three (a kind limit of 4 leaves room for T's first),
    so a claim that comes back short means nothing more could start (a Worker then
    waits for a NOTIFY, a free slot or its poll)."""
    store = harness.store
    await store.set_limit(scope="S", running=3)
    await store.set_limit(kind="K", running=4)
    s = [(await store.enqueue("K", scope="S")).id for _ in range(5)]
    t = [(await store.enqueue("K", scope="T")).id for _ in range(2)]
    claimed = await store.claim_batch("w", LEASE, 10, kinds=["K"])
    assert sorted(item.id for item in claimed) == sorted([*s[:3], t[0]])
    assert await store.claim_batch("w", LEASE, 10, kinds=["K"]) == []


async def test_a_kind_limit_holds_across_scopes_and_combines_with_the_scope_limit(
    harness: Harness,
) -> None:
    """Kind K at 3 across scopes a..e (each at the default, 1): three start, whatever
    the batch; L is not held up."""
    store = harness.store
    await store.set_limit(kind="K", running=3)
    for scope in "abcde":
        await store.enqueue("K", scope=scope)
        await store.enqueue("K", scope=scope)
    other = await store.enqueue("L")
    claimed = await claim_all(harness, ["K", "L"], batch=10)
    assert other.id in claimed and len(claimed) == 4
    running = [i for i in harness.items() if i.status is Status.RUNNING and i.kind == "K"]
    assert len(running) == 3 and len({i.scope for i in running}) == 3


async def test_a_kind_at_its_limit_does_not_cut_a_claim_short(harness: Harness) -> None:
    """K at 1 with three due K items ahead of an L item, and scope S whose first item
    is a K one, then an L one: one claim for five takes one K item and both L items (a
    claim comes back short only when nothing more could start). Found by the lockstep
    machine: PostgreSQL's claim cut its window before applying K's room, and passed S
    over for the round."""
    store = harness.store
    await store.set_limit(kind="K", running=1)
    k = [(await store.enqueue("K")).id for _ in range(3)]
    l_unscoped = await store.enqueue("L")
    s_k = await store.enqueue("K", scope="S")
    s_l = await store.enqueue("L", scope="S")
    claimed = await store.claim_batch("w", LEASE, 5, kinds=["K", "L"])
    assert sorted(item.id for item in claimed) == [k[0], l_unscoped.id, s_l.id]
    assert s_k.id not in {item.id for item in claimed}


async def test_a_scope_with_room_gives_every_line_its_turn_in_one_claim(
    harness: Harness,
) -> None:
    """S at 2 with two Queued items of two priorities (two lines, each with a head):
    one claim for three takes the better one, then the other (S has room for it), and
    the unscoped item. PostgreSQL's claim went round again only when its settle made a
    new head, so the other line's head waited for the next poll."""
    store = harness.store
    await store.set_limit(scope="S", running=2)
    low = await store.enqueue("K", scope="S")
    high = await store.enqueue("K", scope="S", priority=5)
    unscoped = await store.enqueue("K")
    claimed = await store.claim_batch("w", LEASE, 3, kinds=["K"])
    assert sorted(item.id for item in claimed) == [low.id, high.id, unscoped.id]


async def test_a_scope_whose_rate_is_spent_does_not_cut_a_claim_short(
    harness: Harness,
) -> None:
    """R's rate spent, R's head due before X's in the same line of kind and priority: a
    claim for one takes X (R's head must not fill the window and leave it empty)."""
    store = harness.store
    await store.set_limit(scope="R", rate="1/h")
    first = await store.enqueue("K", scope="R")
    [started] = await store.claim_batch("w", LEASE, 1, kinds=["K"])
    assert started.id == first.id and await store.complete(started.id, started.attempt)
    await store.enqueue("K", scope="R")  # a head, due before X's, whose rate is spent
    x = await store.enqueue("K", scope="X")
    claimed = await store.claim_batch("w", LEASE, 1, kinds=["K"])
    assert [item.id for item in claimed] == [x.id]


async def test_a_spent_scopes_next_item_starts_when_its_window_reopens(
    harness: Harness,
) -> None:
    """R at one start in 3 s: its first item starts and ends, its second waits while
    X's starts, the idle sleep is until R's window reopens, and then a claim takes R's
    second though nothing happened in R meanwhile (PostgreSQL: R gave up its heads when
    it was settled spent, and the claim settles it again once its window reopens)."""
    store = harness.store
    await store.set_limit(scope="R", rate=Rate(1, 3.0))
    first = await store.enqueue("K", scope="R")
    second = await store.enqueue("K", scope="R")
    [started] = await store.claim_batch("w", LEASE, 1, kinds=["K"])
    assert started.id == first.id and await store.complete(started.id, started.attempt)
    x = await store.enqueue("K", scope="X")
    assert [item.id for item in await store.claim_batch("w", LEASE, 10, kinds=["K"])] == [x.id]
    wait = await store.seconds_until_due(kinds=["K"])
    assert wait is not None and 0.0 < wait <= 3.0
    await trio.sleep(wait + 0.05)
    claimed = await store.claim_batch("w", LEASE, 10, kinds=["K"])
    assert [item.id for item in claimed] == [second.id]


async def test_a_paused_scope_does_not_cut_a_claim_short(harness: Harness) -> None:
    """P paused, P's head due before X's in the same line of kind and priority: a claim
    for one takes X (P's head must not fill the window and leave it empty)."""
    store = harness.store
    await store.enqueue("K", scope="P")
    await store.pause(scope="P")
    x = await store.enqueue("K", scope="X")
    claimed = await store.claim_batch("w", LEASE, 1, kinds=["K"])
    assert [item.id for item in claimed] == [x.id]


async def test_a_lowered_limit_stops_new_starts_until_under_it(harness: Harness) -> None:
    """K runs 3 at limit 3; lowered to 1, none is stopped; two end and still none
    starts; the third ends and one starts."""
    store = harness.store
    await store.set_limit(kind="K", running=3)
    for _ in range(6):
        await store.enqueue("K")
    first = await claim_all(harness, ["K"], batch=10)
    assert len(first) == 3
    limit = await store.set_limit(kind="K", running=1)
    assert (limit.kind, limit.running) == ("K", 1)
    attempts = {i.id: i.attempt for i in harness.items()}
    for id in first[:2]:
        assert await store.complete(id, attempts[id])
    assert await claim_all(harness, ["K"]) == []
    assert await store.complete(first[2], attempts[first[2]])
    assert len(await claim_all(harness, ["K"])) == 1


async def test_a_rate_limit_holds_back_starts_and_says_when_it_opens(harness: Harness) -> None:
    """K at 2 starts per minute: two start, the rest wait Queued (never failed), the
    idle sleep is until the window opens, and limits() shows the window full."""
    store = harness.store
    await store.set_limit(kind="K", rate=Rate(2, 60.0))
    for _ in range(5):
        await store.enqueue("K")
    assert len(await claim_all(harness, ["K"], batch=10)) == 2
    wait = await store.seconds_until_due(kinds=["K"])
    assert wait is not None and 55.0 < wait <= 60.0
    [limit] = await store.limits()
    assert (limit.rate, limit.started_in_window, limit.waiting) == (Rate(2, 60.0), 2, 3)
    assert [i.status for i in harness.items()].count(Status.QUEUED) == 3


async def test_limits_lists_each_with_what_it_holds_and_clear_removes_one(
    harness: Harness,
) -> None:
    """limits() lists kinds, then scopes, then the default, each with its Running
    count; clear_limit removes one (False when there was none)."""
    store = harness.store
    await store.set_limit(running=2)
    await store.set_limit(scope="S", running=3, rate="10/s")
    await store.set_limit(kind="K", running=4)
    for _ in range(3):
        await store.enqueue("K", scope="S")
    await store.enqueue("K", scope="T")
    await claim_all(harness, ["K"])
    listed = [(lim.kind, lim.scope, lim.running, lim.in_use) for lim in await store.limits()]
    assert listed == [("K", None, 4, 4), (None, "S", 3, 3), (None, None, 2, 1)]
    assert await store.clear_limit(scope="S")
    assert not await store.clear_limit(scope="S")
    holders, _ = await store.scope_holders("S")
    assert len(holders) == 3


async def test_a_declared_limit_replaces_the_kinds_limit_and_is_written_only_when_it_differs(
    harness: Harness,
) -> None:
    """declare_limit (a handler's `limit=`, `rate=`): with none in the database it is
    written; declared again, nothing is written; against one set otherwise (here a
    running limit of 5 and a rate), it replaces it whole, a part it does not declare
    removed, and says what was there."""
    store = harness.store
    running_2 = LimitChange("K", None, 2, None)
    first = await store.declare_limit(running_2)
    assert (first.before, first.written) == (None, True)
    again = await store.declare_limit(running_2)
    assert (again.before, again.written) == ((2, None), False)
    await store.set_limit(kind="K", running=5, rate="10/s")
    replaced = await store.declare_limit(running_2)
    assert (replaced.before, replaced.written) == ((5, Rate(10, 1.0)), True)
    [limit] = await store.limits()
    assert (limit.kind, limit.running, limit.rate) == ("K", 2, None)
    rate_only = await store.declare_limit(LimitChange("K", None, None, Rate(3, 60.0)))
    assert (rate_only.before, rate_only.written) == ((2, None), True)
    [limit] = await store.limits()
    assert (limit.kind, limit.running, limit.rate) == ("K", None, Rate(3, 60.0))


async def test_show_says_why_a_queued_item_waits(harness: Harness) -> None:
    """`show` of a Queued item names what holds it back: its scope full (behind the
    items before it), its kind paused, its run_after ahead, no live Worker for its
    kind in its scope; a Running item has no reasons, and a Queued item nothing holds
    says so."""
    store = harness.store
    await store.advertise(
        WorkerInfo("w1", socket.gethostname(), os.getpid(), ("K",), ("S",), False, 1, 30.0)
    )
    first = await store.enqueue("K", scope="S")
    second = await store.enqueue("K", scope="S")
    third = await store.enqueue("K", scope="S")
    [running] = await store.claim_batch("w1", LEASE, 5, kinds=["K"])
    assert running.id == first.id
    details = await store.show(second.id)
    assert details is not None and list(details.waiting) == ["scope S is full: 1 of 1 Running"]
    details = await store.show(third.id)
    assert details is not None and list(details.waiting) == [
        "scope S is full: 1 of 1 Running",
        "1 due item(s) of scope S come before it",
    ]
    details = await store.show(first.id)
    assert details is not None and list(details.waiting) == []
    assert await store.complete(first.id, running.attempt)
    details = await store.show(second.id)
    assert details is not None and list(details.waiting) == [
        "nothing holds it back: a Worker should take it within its poll"
    ]
    await store.pause(kind="L")
    later = await store.enqueue("L", scope="T", run_after=dt.timedelta(seconds=600))
    details = await store.show(later.id)
    assert details is not None and [r.split(" another ")[0] for r in details.waiting] == [
        "not due for",
        "kind L is paused",
        "no live Worker serves kind L in scope T",
    ]
