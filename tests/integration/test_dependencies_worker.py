"""Dependencies run by a Worker on real PostgreSQL (issue 34): a handler fans out and in
from its fenced transaction, committed with its own completion; the fan-in's handler
reads its parents' results; a failed child cancels the fan-in; cancels and a failed
parent's cascade reach through a Worker's own finishes."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio

from tests.support import dependencies as deps
from trioworker import (
    Context,
    DoNotRetry,
    NewItem,
    PostgresStore,
    Registry,
    Settings,
    Status,
    Worker,
    WorkItem,
)

Conn = psycopg.Connection[Any]


def media_registry(seen: dict[str, Any]) -> Registry:
    """A crawl that enqueues a thumbnail for each file and burst detection after all of
    them, in its fenced transaction; thumbnails return their path; the detection reads
    them as its parents' results."""
    registry = Registry()

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        files = item.payload["files"]
        async with ctx.transaction() as tx:
            thumbs = await ctx.store.enqueue_many(
                [NewItem("Thumbnail", payload={"file": f}) for f in files], tx=tx
            )
            bursts = await ctx.store.enqueue(
                "Bursts", after=[t.id for t in thumbs], payload={"folder": "f"}, tx=tx
            )
            tx.complete(result={"thumbnails": [t.id for t in thumbs], "bursts": bursts.id})

    @registry.handler("Thumbnail")
    async def thumbnail(item: WorkItem, ctx: Context) -> dict[str, str]:
        if item.payload["file"].startswith("bad"):
            raise DoNotRetry(f"cannot read {item.payload['file']}")
        await trio.sleep(0.01 * len(item.payload["file"]))
        return {"thumbnail": item.payload["file"] + ".thumb"}

    @registry.handler("Bursts")
    async def bursts(item: WorkItem, ctx: Context) -> list[str]:
        seen["parents"] = await ctx.parent_results()
        seen["own_parents_when_none"] = None
        return sorted(r["thumbnail"] for r in seen["parents"].values())

    return registry


async def until_status(store: PostgresStore, id: int, *statuses: Status) -> Status:
    with trio.fail_after(30):
        while True:
            state = await store.get_item(id)
            if state is not None and state.status in statuses:
                return state.status
            await trio.sleep(0.05)


async def test_a_crawl_fans_out_and_in_from_its_fenced_transaction(store: PostgresStore) -> None:
    """The crawl's children and the item after them commit with its completion; the
    detection runs only after every thumbnail, and reads their results by id."""
    seen: dict[str, Any] = {}
    worker = Worker(
        store,
        media_registry(seen),
        Settings(poll=0.5, concurrency=4),
        worker_id="w",
        fail_stop=pytest.fail,
    )
    crawl = await store.enqueue("Crawl", payload={"files": ["a", "bb", "ccc"]})
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        result = await store.result(crawl.id, timeout=30)
        assert await store.result(result["bursts"], timeout=30) == [
            "a.thumb",
            "bb.thumb",
            "ccc.thumb",
        ]
        worker.stop()
    thumbs = result["thumbnails"]
    files = ["a", "bb", "ccc"]
    assert seen["parents"] == {
        id: {"thumbnail": f + ".thumb"} for id, f in zip(thumbs, files, strict=True)
    }
    states = [await store.get_item(id) for id in [*thumbs, result["bursts"]]]
    assert all(s is not None and s.started_at is not None for s in states)
    last_thumb_done = max(s.finished_at for s in states[:-1] if s is not None)
    assert states[-1] is not None and states[-1].started_at >= last_thumb_done


async def test_a_failed_thumbnail_cancels_the_detection(store: PostgresStore) -> None:
    """One child Failed (DoNotRetry): the fan-in ends Cancelled, naming it, and never
    runs; the other children still run."""
    seen: dict[str, Any] = {}
    worker = Worker(
        store, media_registry(seen), Settings(poll=0.5), worker_id="w", fail_stop=pytest.fail
    )
    crawl = await store.enqueue("Crawl", payload={"files": ["a", "bad", "c"]})
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        result = await store.result(crawl.id, timeout=30)
        assert await until_status(store, result["bursts"], Status.CANCELLED) is Status.CANCELLED
        for id in result["thumbnails"]:
            await until_status(store, id, Status.SUCCEEDED, Status.FAILED)
        worker.stop()
    bad = result["thumbnails"][1]
    state = await store.get_item(result["bursts"])
    assert state is not None and state.reason == f"parent {bad} failed"
    assert state.started_at is None and "parents" not in seen


async def test_a_child_noted_again_while_its_other_parent_commits_runs_long_before_the_poll(
    dsn: str, store: PostgresStore
) -> None:
    """The last two parents of a child finish at once in two transactions, as two
    Workers' finishes do: P2's commits first, having met the child held by P1's, noted
    it and announced it. The Worker's settle pass, run at the announcement while P1's
    transaction is still open, meets the child held again and notes it again,
    unannounced. Then P1's commits: the child runs within seconds, not at the Worker's
    next poll (60 s here)."""
    ran = trio.Event()
    registry = Registry()

    @registry.handler("C")
    async def child(item: WorkItem, ctx: Context) -> None:
        ran.set()

    worker = Worker(store, registry, Settings(poll=60), worker_id="w", fail_stop=pytest.fail)
    noted = "SELECT id FROM work_unsettled_waiting WHERE item_id = %s"
    with psycopg.connect(dsn, autocommit=True) as pg, psycopg.connect(dsn) as holder:
        (p1, a1), (p2, a2) = deps.running(pg, "P", 2)
        [c] = deps.insert(pg, "C", after=[p1, p2])
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            assert deps.finish(holder, [(p1, a1)]) == [p1]  # its transaction holds C
            assert deps.finish(pg, [(p2, a2)]) == [p2]  # met C held: noted, announced
            first = pg.execute(noted, (c,)).fetchall()
            assert len(first) == 1
            with trio.fail_after(10):  # the Worker's pass met C held: noted again
                while pg.execute(noted, (c,)).fetchall() == first:  # noqa: ASYNC110  another session
                    await trio.sleep(0.01)
            holder.commit()
            committed = trio.current_time()
            with trio.fail_after(20):
                await ran.wait()
            took = trio.current_time() - committed
            worker.stop()
    assert took < 10, took
