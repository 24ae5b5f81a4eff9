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
