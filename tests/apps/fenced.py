"""A test app whose handler writes its result and completes in one fenced transaction,
then (when its payload says so) kills its own Worker right after the commit."""

from __future__ import annotations

import os
import signal

from trioworker import Context, Registry, WorkItem

registry = Registry()


@registry.handler("Thumbnail")
async def thumbnail(item: WorkItem, ctx: Context) -> None:
    async with ctx.transaction() as tx:
        await tx.execute(
            "INSERT INTO thumbnails (item_id, attempt) VALUES (%s, %s)", [item.id, item.attempt]
        )
        tx.complete()
    if item.payload.get("die_after_commit"):
        os.kill(os.getpid(), signal.SIGKILL)
