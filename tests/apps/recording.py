"""A test app: handlers that record each attempt's start and end, outside the database.

The observer log ($TW_OBSERVER_LOG) is the media library's attempt log: one JSON line
per event, appended with O_APPEND, stamped with `time.monotonic()` (one clock for every
process on the machine), so overlaps between Workers can be checked afterwards.
"""

from __future__ import annotations

import os
import time

import trio

from examples.media import _observer
from trioworker import Context, Registry, RetryPolicy, WorkItem

registry = Registry()


def record(event: str, item: WorkItem, ctx: Context) -> None:
    _observer.record(os.environ["TW_OBSERVER_LOG"], event, item, ctx.worker_id)


@registry.handler("Record")
async def record_attempt(item: WorkItem, ctx: Context) -> None:
    """Sleep payload["seconds"], recording start and end (or cancel)."""
    record("start", item, ctx)
    try:
        await trio.sleep(float(item.payload.get("seconds", 0.1)))
    except trio.Cancelled:
        record("cancelled", item, ctx)
        raise
    record("end", item, ctx)


@registry.handler("BlockLoop")
async def block_loop(item: WorkItem, ctx: Context) -> None:
    """Blocks the event loop in synchronous code: only the watchdog thread can act."""
    record("start", item, ctx)
    time.sleep(float(item.payload.get("seconds", 60)))
    record("end", item, ctx)


@registry.handler("IgnoreCancel")
async def ignore_cancel(item: WorkItem, ctx: Context) -> None:
    """Swallows its cancel and keeps going: the Worker must fail-stop."""
    record("start", item, ctx)
    try:
        await trio.sleep_forever()
    except trio.Cancelled:
        record("cancelled", item, ctx)
        with trio.CancelScope(shield=True):
            await trio.sleep(600)


not_a_registry = object()


@registry.handler("Broken", retry=RetryPolicy(max_attempts=2, initial_delay=0.1, jitter=0.0))
async def broken(item: WorkItem, ctx: Context) -> None:
    """Fails as a handler with a bug does: a KeyError deep in the handler's code."""
    _look_up_the_path(item.payload)


def _look_up_the_path(payload: dict[str, str]) -> str:
    return payload["path"]
