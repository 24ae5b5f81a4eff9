"""Two apps with different kinds, for the routing tests: `crawls` serves Crawl and
`purges` serves Purge (each records its attempts like tests/apps/recording.py)."""

from __future__ import annotations

import trio

from tests.apps.recording import record
from trioworker import Context, Registry, WorkItem

crawls = Registry()
purges = Registry()


@crawls.handler("Crawl")
@purges.handler("Purge")
async def short_attempt(item: WorkItem, ctx: Context) -> None:
    record("start", item, ctx)
    await trio.sleep(0.05)
    record("end", item, ctx)
