"""A test app for tests/integration/test_own_locks.py: one handler under two kinds, one
the test leaves unlimited and one it gives a kind limit. It sleeps payload["seconds"]
(payload["first"] instead on an item's first attempt), recording start and end as
tests/apps/recording.py does."""

from __future__ import annotations

import trio

from tests.apps.recording import record
from trioworker import Context, Registry, WorkItem

registry = Registry()


async def sleep(item: WorkItem, ctx: Context) -> None:
    record("start", item, ctx)
    first = item.payload.get("first") if item.attempt == 1 else None
    await trio.sleep(float(first if first is not None else item.payload.get("seconds", 0.05)))
    record("end", item, ctx)


registry.handler("Sleep")(sleep)
registry.handler("Capped")(sleep)
