"""Dependencies (issue 34, `after=`): the Store contract, run against the in-memory
store, the Trio store, and the Trio store's client operations through `Client` and
`AsyncClient` (tests/conftest.py's `harness`). The schema's side is
migrations/0003.dependencies.sql; the concurrent cases are in
test_dependencies_concurrently.py."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tests.support.harness import Harness
from trioworker import CancelOutcome, InvalidWorkItem, NewItem, Status

LEASE = 30.0
KINDS = ("A", "B", "C")


def state(harness: Harness, id: int) -> Any:
    (row,) = [i for i in harness.items() if i.id == id]
    return row


def statuses(harness: Harness, *ids: int) -> list[Status]:
    return [state(harness, id).status for id in ids]


async def run(harness: Harness, id: int, *, ok: bool = True, result: str | None = None) -> None:
    """Claim item `id` (it must be the next claimable one of KINDS) and end it:
    Succeeded (with `result`, JSON text) or Failed."""
    item = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert item is not None and item.id == id, (item, id)
    if ok:
        assert await harness.store.complete_batch([(id, item.attempt)], [result]) == {id}
    else:
        assert await harness.store.fail(id, item.attempt, "failed", "boom")


async def test_an_item_waits_for_every_parent_then_runs(harness: Harness) -> None:
    """A child is Waiting, and never claimed, until every parent has Succeeded; then it
    is Queued and claimed like any other item."""
    a = (await harness.store.enqueue("A")).id
    b = (await harness.store.enqueue("B")).id
    child = (await harness.store.enqueue("C", after=[a, b])).id
    assert statuses(harness, a, b, child) == [Status.QUEUED, Status.QUEUED, Status.WAITING]
    await run(harness, a)
    assert state(harness, child).status is Status.WAITING
    assert await harness.store.claim("w1", LEASE, kinds=("C",)) is None
    await run(harness, b)
    assert state(harness, child).status is Status.QUEUED
    await run(harness, child)
    assert state(harness, child).status is Status.SUCCEEDED


async def test_a_parent_that_succeeded_before_counts_as_done(harness: Harness) -> None:
    """A parent already Succeeded when the child is enqueued: the child is Queued at
    once; one parent done and one not: Waiting."""
    a = (await harness.store.enqueue("A")).id
    await run(harness, a)
    child = (await harness.store.enqueue("C", after=[a])).id
    assert state(harness, child).status is Status.QUEUED
    b = (await harness.store.enqueue("B")).id
    other = (await harness.store.enqueue("C", after=[a, b])).id
    assert state(harness, other).status is Status.WAITING


async def test_a_failed_parent_cancels_its_waiting_descendants(harness: Harness) -> None:
    """A parent that ends Failed: its Waiting children end Cancelled with a reason that
    names it, and their own Waiting children with a reason naming their parent; an
    item after a parent that had failed before is Cancelled at its enqueue."""
    a = (await harness.store.enqueue("A")).id
    b = (await harness.store.enqueue("B")).id
    child = (await harness.store.enqueue("C", after=[a, b])).id
    grandchild = (await harness.store.enqueue("C", after=[child])).id
    await run(harness, a, ok=False)
    assert statuses(harness, child, grandchild) == [Status.CANCELLED, Status.CANCELLED]
    assert state(harness, child).reason == f"parent {a} failed"
    assert state(harness, grandchild).reason == f"parent {child} was cancelled"
    assert state(harness, child).finished_at is not None
    late = (await harness.store.enqueue("C", after=[b, a])).id
    assert state(harness, late).status is Status.CANCELLED
    assert state(harness, late).reason == f"parent {a} failed"
    assert state(harness, b).status is Status.QUEUED  # a sibling parent is left alone


async def test_cancelling_a_waiting_item_or_its_parent(harness: Harness) -> None:
    """`cancel` of a Waiting item cancels it as a Queued one; `cancel` of a Queued parent
    cancels its Waiting children too, naming it."""
    a = (await harness.store.enqueue("A")).id
    child = (await harness.store.enqueue("C", after=[a])).id
    assert await harness.store.cancel(child) is CancelOutcome.CANCELLED
    assert state(harness, child).status is Status.CANCELLED
    assert state(harness, child).reason == "cancelled before it ran"
    other = (await harness.store.enqueue("C", after=[a])).id
    assert await harness.store.cancel(a) is CancelOutcome.CANCELLED
    assert state(harness, other).status is Status.CANCELLED
    assert state(harness, other).reason == f"parent {a} was cancelled"


async def test_a_retried_child_waits_again_for_its_parents(harness: Harness) -> None:
    """Retrying a child cancelled by its failed parent: Cancelled again (its parent is
    still Failed); retried with its parent, it waits for the parent and then runs."""
    a = (await harness.store.enqueue("A")).id
    child = (await harness.store.enqueue("C", after=[a])).id
    await run(harness, a, ok=False)
    assert await harness.store.retry([child]) == [child]
    assert state(harness, child).status is Status.CANCELLED
    assert state(harness, child).reason == f"parent {a} failed"
    assert sorted(await harness.store.retry([a, child])) == [a, child]
    assert statuses(harness, a, child) == [Status.QUEUED, Status.WAITING]
    await run(harness, a)
    assert state(harness, child).status is Status.QUEUED


async def test_a_handler_reads_its_parents_results(harness: Harness) -> None:
    """`parent_results`: each parent's stored result, by id ({} without parents)."""
    a = (await harness.store.enqueue("A")).id
    b = (await harness.store.enqueue("B")).id
    await run(harness, a, result='{"thumb": "a.jpg"}')
    await run(harness, b)
    child = (await harness.store.enqueue("C", after=[b, a])).id
    assert await harness.store.parent_results(child) == {a: {"thumb": "a.jpg"}, b: None}
    assert await harness.store.parent_results(a) == {}


async def test_enqueue_after_is_checked_before_anything_is_written(harness: Harness) -> None:
    """An unknown parent, a dedup key with parents, or ids that are not ids: a clear
    InvalidWorkItem, and no item is stored."""
    a = (await harness.store.enqueue("A")).id
    before = len(harness.items())
    with pytest.raises(InvalidWorkItem, match=f"after names items that do not exist: {a + 99}"):
        await harness.store.enqueue("C", after=[a, a + 99])
    with pytest.raises(InvalidWorkItem, match="takes no dedup_key"):
        await harness.store.enqueue("C", after=[a], dedup_key="k")
    with pytest.raises(InvalidWorkItem, match="after takes item ids"):
        await harness.store.enqueue("C", after=["1"])  # type: ignore[list-item]
    with pytest.raises(InvalidWorkItem, match="after must be a list of item ids"):
        await harness.store.enqueue("C", after=a)  # type: ignore[arg-type]
    with pytest.raises(InvalidWorkItem, match=r"item 1: after names items that do not exist"):
        await harness.store.enqueue_many([NewItem("C"), NewItem("C", after=[a + 99])])
    assert len(harness.items()) == before


async def test_enqueue_many_fans_out_and_an_item_fans_in(harness: Harness) -> None:
    """Children after one parent (enqueue_many), and an item after all of them: the
    children run after the parent, the fan-in only after the last child. (From a
    handler's fenced transaction: test_dependencies_worker.py.)"""
    root = (await harness.store.enqueue("A")).id
    children = [
        e.id
        for e in await harness.store.enqueue_many(
            [NewItem("B", payload={"n": n}, after=[root]) for n in range(3)]
        )
    ]
    fan_in = (await harness.store.enqueue("C", after=children)).id
    assert statuses(harness, *children, fan_in) == [Status.WAITING] * 4
    await run(harness, root)
    assert statuses(harness, *children) == [Status.QUEUED] * 3
    for child in children:
        assert state(harness, fan_in).status is Status.WAITING
        await run(harness, child)
    assert state(harness, fan_in).status is Status.QUEUED


async def test_a_scoped_child_takes_its_place_in_its_scopes_line(harness: Harness) -> None:
    """A child in a busy scope becomes Queued when its parent succeeds and runs after the
    scope's Running item, one at a time."""
    parent = (await harness.store.enqueue("A")).id
    busy = (await harness.store.enqueue("B", scope="s")).id
    child = (await harness.store.enqueue("C", scope="s", after=[parent])).id
    item = await harness.store.claim("w1", LEASE, kinds=("B",))
    assert item is not None and item.id == busy
    await run(harness, parent)
    assert state(harness, child).status is Status.QUEUED
    assert await harness.store.claim("w1", LEASE, kinds=("C",)) is None  # the scope is busy
    assert await harness.store.complete_batch([(busy, item.attempt)], [None]) == {busy}
    await run(harness, child)


async def test_show_lists_parents_and_children(harness: Harness) -> None:
    a = (await harness.store.enqueue("A")).id
    child = (await harness.store.enqueue("C", after=[a])).id
    shown = await harness.store.show(child)
    assert shown is not None
    assert [(r.id, r.kind, r.status) for r in shown.parents] == [(a, "A", Status.QUEUED)]
    assert shown.children == []
    parent = await harness.store.show(a)
    assert parent is not None
    assert [(r.id, r.kind, r.status) for r in parent.children] == [(child, "C", Status.WAITING)]


async def test_retention_keeps_a_parent_that_a_child_still_needs(harness: Harness) -> None:
    """A Succeeded parent whose child is Waiting or Queued is not deleted by retention;
    once the child has ended, both go."""
    a = (await harness.store.enqueue("A")).id
    b = (await harness.store.enqueue("B")).id
    child = (await harness.store.enqueue("C", after=[a, b])).id
    await run(harness, a)
    harness.age(a, 3600)
    assert await harness.store.delete_finished(dt.timedelta(minutes=1)) == 0
    await run(harness, b)
    await run(harness, child)
    for id in (a, b, child):
        harness.age(id, 3600)
    assert await harness.store.delete_finished(dt.timedelta(minutes=1)) == 3
    assert harness.items() == []


# -- added by the memory store's author


def reasons(harness: Harness, *ids: int) -> list[str | None]:
    """The items' reasons, in the order of `ids`."""
    return [state(harness, id).reason for id in ids]


#: The stores a handler's fenced transaction is made on (the clients take none): the
#: tests of one run on these alone.
TRIO_STORES = pytest.mark.parametrize("harness", ["memory", "postgres"], indirect=True)


async def child_of(harness: Harness, *parents: int, kind: str = "C") -> int:
    """A new item of `kind` after `parents`: its id."""
    return (await harness.store.enqueue(kind, after=list(parents))).id


async def test_a_cascade_names_each_descendants_parent_level_by_level(harness: Harness) -> None:
    """A failed parent: its Waiting children name it; below them, each descendant names
    its lowest parent cancelled at the level above; an item that is not Waiting (a
    child cancelled before) is left alone, and so is a sibling parent."""
    p1 = (await harness.store.enqueue("A")).id
    p2 = (await harness.store.enqueue("B")).id
    x = await child_of(harness, p1, p2)
    y = await child_of(harness, x)
    z = await child_of(harness, y, x)
    w = await child_of(harness, z, y)
    v = await child_of(harness, w)
    lone = await child_of(harness, p1)
    assert await harness.store.cancel(lone) is CancelOutcome.CANCELLED
    await run(harness, p1, ok=False)
    assert statuses(harness, x, y, z, w, v) == [Status.CANCELLED] * 5
    assert reasons(harness, x, y, z, w, v, lone) == [
        f"parent {p1} failed",
        f"parent {x} was cancelled",
        f"parent {x} was cancelled",
        f"parent {y} was cancelled",
        f"parent {w} was cancelled",
        "cancelled before it ran",
    ]
    assert state(harness, p2).status is Status.QUEUED


async def test_a_failed_parent_is_named_before_a_lower_pending_one(harness: Harness) -> None:
    """Of a Waiting item's parents, a Failed or Cancelled one decides, the lowest first,
    before any still pending; a Cancelled one is said to be cancelled."""
    pending = (await harness.store.enqueue("A")).id
    cancelled = (await harness.store.enqueue("B")).id
    failed = (await harness.store.enqueue("B")).id
    assert await harness.store.cancel(cancelled) is CancelOutcome.CANCELLED
    item = await harness.store.claim("w1", LEASE, kinds=("B",))
    assert item is not None and item.id == failed
    assert await harness.store.fail(failed, item.attempt, "failed", "boom")
    one = await child_of(harness, pending, failed)
    both = await child_of(harness, pending, failed, cancelled)
    assert reasons(harness, one, both) == [
        f"parent {failed} failed",
        f"parent {cancelled} was cancelled",
    ]
    assert state(harness, pending).status is Status.QUEUED


async def test_cancelling_a_waiting_item_cancels_its_waiting_descendants(harness: Harness) -> None:
    """`cancel` of a Waiting item: it ends Cancelled, and so do its Waiting children and
    theirs, each naming its parent; its own parent is left alone."""
    a = (await harness.store.enqueue("A")).id
    b = await child_of(harness, a)
    c = await child_of(harness, b)
    d = await child_of(harness, c, b)
    assert await harness.store.cancel(b) is CancelOutcome.CANCELLED
    assert statuses(harness, a, b, c, d) == [Status.QUEUED] + [Status.CANCELLED] * 3
    assert reasons(harness, b, c, d) == [
        "cancelled before it ran",
        f"parent {b} was cancelled",
        f"parent {b} was cancelled",
    ]
    assert await harness.store.cancel(c) is CancelOutcome.ALREADY_FINISHED
    await run(harness, a)
    assert statuses(harness, b, c, d) == [Status.CANCELLED] * 3


async def test_a_retry_of_a_chain_settles_it_in_id_order(harness: Harness) -> None:
    """Retrying a child and its grandchild while the root is still Failed: the child is
    Cancelled again naming the root, the grandchild naming the child; retried with the
    root too, both wait, and run in turn; a retried item whose parents have Succeeded
    is Queued at once."""
    a = (await harness.store.enqueue("A")).id
    b = await child_of(harness, a)
    c = await child_of(harness, b)
    await run(harness, a, ok=False)
    assert sorted(await harness.store.retry([c, b])) == [b, c]
    assert statuses(harness, b, c) == [Status.CANCELLED] * 2
    assert reasons(harness, b, c) == [f"parent {a} failed", f"parent {b} was cancelled"]
    assert sorted(await harness.store.retry([a, b, c])) == [a, b, c]
    assert statuses(harness, a, b, c) == [Status.QUEUED, Status.WAITING, Status.WAITING]
    assert reasons(harness, b, c) == [
        "retried by an operator after attempt 1",
        "retried by an operator after attempt 1",
    ]
    await run(harness, a)
    assert statuses(harness, b, c) == [Status.QUEUED, Status.WAITING]
    await run(harness, b, ok=False)
    assert reasons(harness, c) == [f"parent {b} failed"]
    assert await harness.store.retry([b]) == [b]
    await run(harness, b)
    assert await harness.store.retry([c]) == [c]
    assert state(harness, c).status is Status.QUEUED


async def test_lease_recovery_and_a_superseded_requeue_cancel_children(harness: Harness) -> None:
    """A parent failed by lease recovery (stalls), or Cancelled as superseded by a Queued
    item with its dedup key: its Waiting children end Cancelled, naming it."""
    a = (await harness.store.enqueue("A")).id
    child = await child_of(harness, a)
    item = await harness.store.claim("w1", LEASE, kinds=("A",))
    assert item is not None and item.id == a
    harness.expire_lease(a)
    [recovered] = await harness.store.recover_expired_leases(max_stalls=1)
    assert recovered.status is Status.FAILED
    assert reasons(harness, child) == [f"parent {a} failed"]

    keyed = (await harness.store.enqueue("B", dedup_key="k")).id
    below = await child_of(harness, keyed)
    item = await harness.store.claim("w1", LEASE, kinds=("B",))
    assert item is not None and item.id == keyed
    sibling = (await harness.store.enqueue("B", dedup_key="k")).id
    assert await harness.store.release(keyed, item.attempt)
    assert reasons(harness, keyed, below) == [
        f"superseded by queued item {sibling}",
        f"parent {keyed} was cancelled",
    ]
    assert state(harness, below).status is Status.CANCELLED


@TRIO_STORES
async def test_a_handler_enqueues_children_in_its_fenced_transaction(harness: Harness) -> None:
    """In a fenced transaction: an item after one enqueued earlier in it, and one after
    the handler's own item; nothing exists until the commit; then they wait, and the
    one after the handler's item is Queued once it has Succeeded. One after an item not
    yet committed elsewhere is refused."""
    first = (await harness.store.enqueue("A")).id
    item = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert item is not None and item.id == first
    async with harness.store.fenced_transaction(first, item.attempt) as tx:
        early = await harness.store.enqueue("B", tx=tx)
        later = await harness.store.enqueue("C", after=[early.id], tx=tx)
        own = await harness.store.enqueue("C", after=[first], tx=tx)
        assert len(harness.items()) == 1
        tx.complete(result=[1])
    assert statuses(harness, early.id, later.id, own.id) == [
        Status.QUEUED,
        Status.WAITING,
        Status.WAITING,
    ]
    assert await harness.store.complete_batch([(first, item.attempt)]) == {first}
    assert state(harness, own.id).status is Status.QUEUED
    assert await harness.store.parent_results(own.id) == {first: [1]}


async def test_counts_and_retention_with_dependencies(harness: Harness) -> None:
    """Waiting items are counted under their status; a parent whose child has ended
    (any way) may be deleted, and is then no longer among the child's parents; a Failed
    parent's Cancelled child does not hold it."""
    a = (await harness.store.enqueue("A")).id
    b = (await harness.store.enqueue("B")).id
    child = await child_of(harness, a, b)
    counts = await harness.store.queue_counts()
    assert counts.totals["Waiting"] == 1 and counts.by_kind["C"]["Waiting"] == 1
    status = await harness.store.status()
    assert status.counts.totals["Waiting"] == 1
    await run(harness, a)
    await run(harness, b, ok=False)
    assert state(harness, child).status is Status.CANCELLED
    harness.age(a, 3600)
    harness.age(b, 3600)
    assert await harness.store.delete_finished(dt.timedelta(minutes=1)) == 2
    shown = await harness.store.show(child)
    assert shown is not None and shown.parents == []
    assert await harness.store.parent_results(child) == {}
    assert await harness.store.retry([child]) == [child]
    assert state(harness, child).status is Status.CANCELLED
    assert state(harness, child).reason == f"parent {a} no longer exists"


async def test_a_running_child_keeps_its_parent(harness: Harness) -> None:
    """A Succeeded parent whose child is Running is not deleted; a Succeeded parent of
    only finished children is."""
    a = (await harness.store.enqueue("A")).id
    await run(harness, a)
    child = await child_of(harness, a)
    item = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert item is not None and item.id == child
    harness.age(a, 3600)
    assert await harness.store.delete_finished(dt.timedelta(minutes=1)) == 0
    assert await harness.store.complete_batch([(child, item.attempt)]) == {child}
    assert await harness.store.delete_finished(dt.timedelta(minutes=1)) == 1
    shown = await harness.store.show(child)
    assert shown is not None and shown.parents == []


async def test_show_says_which_parents_a_waiting_item_waits_for(harness: Harness) -> None:
    """`show` of a Waiting item: the parents that have not Succeeded, with their kinds
    and statuses; of a parent, its children with theirs."""
    a = (await harness.store.enqueue("A")).id
    b = (await harness.store.enqueue("B")).id
    c = (await harness.store.enqueue("A")).id
    child = await child_of(harness, c, a, b)
    await run(harness, a)
    item = await harness.store.claim("w1", LEASE, kinds=("B",))
    assert item is not None and item.id == b
    shown = await harness.store.show(child)
    assert shown is not None
    assert list(shown.waiting) == [f"for parent {b} (B, Running), parent {c} (A, Queued)"]
    assert [(r.id, r.status) for r in shown.parents] == [
        (a, Status.SUCCEEDED), (b, Status.RUNNING), (c, Status.QUEUED),
    ]  # fmt: skip
    parent = await harness.store.show(a)
    assert parent is not None and list(parent.waiting) == []
    assert [(r.id, r.kind, r.status) for r in parent.children] == [(child, "C", Status.WAITING)]
