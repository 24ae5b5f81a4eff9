"""A test app that makes a Worker use every kind of write it has, for a Worker running
as the Worker role (tests/integration/test_roles.py): claims of scoped and unscoped
items, heartbeats, a retry after an error, a fenced transaction that writes the
application's own table and completes, an enqueue from a handler, a periodic item and
retention."""

from __future__ import annotations

import trio

from trioworker import Context, Registry, RetryPolicy, WorkItem

registry = Registry()
registry.periodic("Tick", every=1)
registry.retention(3600, every=1)


@registry.handler("Record")
async def record(item: WorkItem, ctx: Context) -> None:
    await trio.sleep(float(item.payload.get("seconds", 0)))


@registry.handler("Tick")
async def tick(item: WorkItem, ctx: Context) -> None:
    pass


@registry.handler("FailOnce", retry=RetryPolicy(initial_delay=0, jitter=0))
async def fail_once(item: WorkItem, ctx: Context) -> None:
    if item.attempt == 1:
        raise RuntimeError("the first attempt fails")


@registry.handler("Fenced")
async def fenced(item: WorkItem, ctx: Context) -> None:
    """Writes the application's table `results` and completes, in one commit."""
    async with ctx.transaction() as tx:
        await tx.execute(
            "INSERT INTO results (item_id, attempt) VALUES (%s, %s)", [item.id, item.attempt]
        )
        tx.complete()


@registry.handler("FollowUp")
async def follow_up(item: WorkItem, ctx: Context) -> None:
    """Enqueues a Record in the item's scope, as handlers do."""
    await ctx.store.enqueue("Record", scope=item.scope, payload={"seconds": 0})


@registry.handler("SlowFirst")
async def slow_first(item: WorkItem, ctx: Context) -> None:
    """Its first attempt runs until its Worker is killed; the next one returns."""
    if item.attempt == 1:
        await trio.sleep(600)
