"""A test app: handlers that record each attempt's start and end, outside the database.

The observer log ($TW_OBSERVER_LOG) gets one JSON line per event, written with
O_APPEND and flushed at once, with `time.monotonic()` stamps (one clock for every
process on the machine), so overlaps between Workers can be checked afterwards.
"""

from __future__ import annotations

import json
import os
import time

import trio

from trioworker import Context, Registry, WorkItem

registry = Registry()


def record(event: str, item: WorkItem, ctx: Context, **extra: object) -> None:
    path = os.environ["TW_OBSERVER_LOG"]
    line = json.dumps(
        {
            "event": event,
            "id": item.id,
            "attempt": item.attempt,
            "scope": item.scope,
            "worker": ctx.worker_id,
            "pid": os.getpid(),
            "t": time.monotonic(),
            **extra,
        }
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


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
