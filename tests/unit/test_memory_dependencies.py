"""Dependencies in the in-memory store (issue 34): the decisions that settle a Waiting
item, the pairs of parents and children, and a Worker fanning out and in over the
store on Trio's virtual clock. The contract with PostgreSQL is
tests/integration/test_dependencies_contract.py."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import trio
import trio.testing

from trioworker import Context, DoNotRetry, NewItem, Registry, Status, WorkItem
from trioworker.testing import worker
from trioworker.testing._memory_dependencies import (
    Dependencies,
    Verdict,
    cascade_reason,
    verdict,
)

S, Q, R, F, C, W = (
    Status.SUCCEEDED, Status.QUEUED, Status.RUNNING, Status.FAILED, Status.CANCELLED,
    Status.WAITING,
)  # fmt: skip


@pytest.mark.parametrize(
    ("parents", "expected"),
    [
        ([(1, S)], Verdict(Q)),
        ([(1, S), (2, S)], Verdict(Q)),
        ([(1, S), (2, R)], Verdict(W)),
        ([(1, Q), (2, W)], Verdict(W)),
        ([(1, F)], Verdict(C, "parent 1 failed")),
        ([(1, C)], Verdict(C, "parent 1 was cancelled")),
        ([(1, Q), (5, F)], Verdict(C, "parent 5 failed")),  # before a lower pending one
        ([(7, F), (3, C), (2, R)], Verdict(C, "parent 3 was cancelled")),  # the lowest
        ([(3, F), (2, S)], Verdict(C, "parent 3 failed")),
        ([(2, R), (4, None)], Verdict(C, "parent 4 no longer exists")),  # deleted
        ([(5, None), (4, F)], Verdict(C, "parent 4 failed")),
    ],
)
def test_a_waiting_items_verdict_from_its_parents(
    parents: list[tuple[int, Status | None]], expected: Verdict
) -> None:
    """Queued once every parent has Succeeded; Cancelled naming the lowest parent Failed,
    Cancelled or gone (None: deleted), before any still pending; else Waiting."""
    assert verdict(parents) == expected
    assert verdict(list(reversed(parents))) == expected


@pytest.mark.parametrize(
    ("ended", "parents", "expected"),
    [
        ((4, S), [(2, S), (4, S)], Verdict(Q)),
        ((4, S), [(2, R), (4, S)], Verdict(W)),
        ((4, S), [(2, F), (4, S)], Verdict(W)),  # the Failed parent's to cancel
        ((4, S), [(2, None), (4, S)], Verdict(W)),
        ((4, F), [(2, C), (4, F)], Verdict(C, "parent 4 failed")),
        ((4, C), [(2, Q), (4, C)], Verdict(C, "parent 4 was cancelled")),
    ],
)
def test_a_parents_last_transition_decides_by_its_own_outcome(
    ended: tuple[int, Status], parents: list[tuple[int, Status | None]], expected: Verdict
) -> None:
    """Settled by a parent's end: that parent's Failed or Cancelled cancels, naming it;
    its Succeeded queues the child when no other parent is undone."""
    assert verdict(parents, ended=ended) == expected


def test_a_cascades_reason_names_the_lowest_parent_cancelled_above() -> None:
    assert cascade_reason({9, 4, 12}) == "parent 4 was cancelled"


def test_pairs_go_with_either_item_and_after_stays_as_written() -> None:
    """`after` ascending and each id once; children ascending; a deleted item's pairs go,
    as a child and as a parent, but its children's `after` still names it."""
    deps = Dependencies()
    deps.add(5, [3, 1, 3])
    deps.add(6, [3])
    assert (deps.after(5), deps.children(3), deps.children(1)) == ((1, 3), [5, 6], [5])
    assert deps.after(1) == () and deps.children(6) == []
    deps.forget(3)
    assert (deps.after(5), deps.after(6), deps.children(3)) == ((1, 3), (3,), [])
    deps.forget(5)
    assert deps.children(1) == [] and deps.after(5) == ()


def fan_registry(seen: dict[str, Any]) -> Registry:
    """A crawl that enqueues thumbnails and, after them all, a detection, in its own
    transaction; the detection reads the thumbnails' results."""
    registry = Registry()

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        async with ctx.transaction() as tx:
            thumbs = await ctx.store.enqueue_many(
                [NewItem("Thumbnail", payload={"file": f}) for f in item.payload["files"]], tx=tx
            )
            bursts = await ctx.store.enqueue("Bursts", after=[t.id for t in thumbs], tx=tx)
            tx.complete(result={"thumbnails": [t.id for t in thumbs], "bursts": bursts.id})

    @registry.handler("Thumbnail")
    async def thumbnail(item: WorkItem, ctx: Context) -> str:
        if item.payload["file"].startswith("bad"):
            raise DoNotRetry(f"cannot read {item.payload['file']}")
        await trio.sleep(len(item.payload["file"]))
        return f"{item.payload['file']}.thumb"

    @registry.handler("Bursts")
    async def bursts(item: WorkItem, ctx: Context) -> list[str]:
        seen["parents"] = await ctx.parent_results()
        seen["started"] = trio.current_time()
        return sorted(seen["parents"].values())

    return registry


async def test_a_worker_fans_out_and_in_over_the_memory_store(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The children and the item after them exist once the crawl's transaction commits;
    the detection starts only after the slowest thumbnail and reads every result."""
    seen: dict[str, Any] = {}
    async with worker(fan_registry(seen)) as w:
        crawl = await w.store.enqueue("Crawl", payload={"files": ["a", "bbbbb", "cc"]})
        result = await w.store.result(crawl.id, timeout=60)
        assert await w.store.result(result["bursts"], timeout=60) == [
            "a.thumb", "bbbbb.thumb", "cc.thumb",
        ]  # fmt: skip
    thumbs = result["thumbnails"]
    assert seen["parents"] == dict(zip(thumbs, ["a.thumb", "bbbbb.thumb", "cc.thumb"], strict=True))
    slowest, detection = [await w.store.get_item(id) for id in (thumbs[1], result["bursts"])]
    assert slowest is not None and detection is not None
    started, finished = detection.started_at, slowest.finished_at
    assert isinstance(started, dt.datetime) and isinstance(finished, dt.datetime)
    assert started >= finished


async def test_a_failed_child_cancels_the_fan_in_which_never_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A thumbnail that fails (DoNotRetry): the detection ends Cancelled naming it, its
    result raises, and the other thumbnails still run."""
    seen: dict[str, Any] = {}
    async with worker(fan_registry(seen)) as w:
        crawl = await w.store.enqueue("Crawl", payload={"files": ["a", "bad", "c"]})
        result = await w.store.result(crawl.id, timeout=60)
        state = await w.finished(result["bursts"])
        others = [await w.finished(id) for id in result["thumbnails"]]
    bad = result["thumbnails"][1]
    assert (state.status, state.reason, state.started_at) == (
        Status.CANCELLED, f"parent {bad} failed", None,
    )  # fmt: skip
    assert [s.status for s in others] == [Status.SUCCEEDED, Status.FAILED, Status.SUCCEEDED]
    assert "parents" not in seen
