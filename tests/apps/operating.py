"""A test app for scheduling and operating: a periodic Tick every second, and handlers
that hold their scope (each records its attempts like tests/apps/recording.py)."""

from __future__ import annotations

import trio

from tests.apps.recording import record, record_attempt
from trioworker import Context, Registry, WorkItem

registry = Registry()
registry.periodic("Tick", every=1)


@registry.handler("Tick")
async def tick(item: WorkItem, ctx: Context) -> None:
    record("start", item, ctx)
    await trio.sleep(0.05)
    record("end", item, ctx)


#: Sleeps payload["seconds"], cancellable (the recording app's handler).
registry.handler("Hold")(record_attempt)


@registry.handler("Stubborn")
async def stubborn(item: WorkItem, ctx: Context) -> None:
    """Ignores its cancel for payload["ignore"] seconds (default 600), shielded: the
    Worker fail-stops once its stop grace is over."""
    record("start", item, ctx)
    try:
        await trio.sleep_forever()
    except trio.Cancelled:
        record("cancelled", item, ctx)
        with trio.CancelScope(shield=True):
            await trio.sleep(float((item.payload or {}).get("ignore", 600)))
        raise
