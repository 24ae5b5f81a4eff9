"""A test app: handlers that record each attempt's start and end, outside the database.

The observer log ($TW_OBSERVER_LOG) is the media library's attempt log: one JSON line
per event, appended with O_APPEND, stamped with `time.monotonic()` (one clock for every
process on the machine), so overlaps between Workers can be checked afterwards.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import threading
import time
from typing import Any

import trio

from examples.media import _observer
from trioworker import Context, Registry, RetryPolicy, WorkItem

registry = Registry()


def record(event: str, item: WorkItem, ctx: Context) -> None:
    _observer.record(os.environ["TW_OBSERVER_LOG"], event, item, ctx.worker_id)


def note(event: str, item: WorkItem, ctx: Context, **fields: Any) -> None:
    """An observer line with more fields (read raw: `read_spans` takes it for an end)."""
    line = {"event": event, "id": item.id, "attempt": item.attempt, "worker": ctx.worker_id,
            "pid": os.getpid(), "t": time.monotonic(), **fields}  # fmt: skip
    fd = os.open(os.environ["TW_OBSERVER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def monotonic_deadline(ctx: Context) -> float:
    """The attempt's self-stop deadline as a `time.monotonic()` instant."""
    return time.monotonic() + (ctx.deadline - trio.current_time())


async def heartbeats_stopped(ctx: Context, heartbeat: float) -> float:
    """Once the attempt's self-stop deadline has not moved for 1.5 heartbeats (they no
    longer get through): that deadline, as a `time.monotonic()` instant."""
    deadline, moved_at = ctx.deadline, trio.current_time()
    while trio.current_time() < moved_at + 1.5 * heartbeat:
        await trio.sleep(0.05)
        if ctx.deadline != deadline:
            deadline, moved_at = ctx.deadline, trio.current_time()
    return monotonic_deadline(ctx)


#: libc, called without releasing the GIL (ctypes.PyDLL): one C call that stops the
#: event loop and every thread of the process, as `sum(range(10**10))` does, for as
#: long as the test says.
GIL_HOLDING_LIBC = ctypes.PyDLL(None)


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
    """Blocks the event loop in synchronous code: only the supervisor can act."""
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


@registry.handler("HoldGIL")
async def hold_gil(item: WorkItem, ctx: Context) -> None:
    """On the Worker payload["holder"] names: once its heartbeats stop getting through,
    holds the GIL in one C call for payload["seconds"], so that only its supervisor can
    end it; notes the self-stop deadline first. Elsewhere it just runs."""
    record("start", item, ctx)
    if ctx.worker_id == item.payload["holder"]:
        deadline = await heartbeats_stopped(ctx, float(item.payload["heartbeat"]))
        note("gil", item, ctx, deadline=deadline)
        GIL_HOLDING_LIBC.sleep(int(item.payload["seconds"]))
    record("end", item, ctx)


@registry.handler("HoldRow")
async def hold_row(item: WorkItem, ctx: Context) -> None:
    """On the Worker payload["holder"] names: opens the attempt's fenced transaction
    (which locks the item's row), notes its backend's pid and the self-stop deadline,
    and sits in it, idle, until cancelled. Elsewhere it just runs."""
    record("start", item, ctx)
    if ctx.worker_id == item.payload["holder"]:
        async with ctx.transaction() as tx:
            [row] = await tx.rows("SELECT pg_backend_pid() AS pid")
            note("holding", item, ctx, backend=row["pid"], deadline=monotonic_deadline(ctx))
            await trio.sleep_forever()
    record("end", item, ctx)


@registry.handler("FloodLog")
async def flood_log(item: WorkItem, ctx: Context) -> None:
    """Logs long lines from a thread until they block (stderr a pipe nobody reads), notes
    each move of its self-stop deadline, and ignores its cancel."""
    record("start", item, ctx)
    threading.Thread(target=_flood, args=(ctx.log,), daemon=True).start()
    with trio.CancelScope(shield=True):
        noted = None
        while True:
            if ctx.deadline != noted:
                noted = ctx.deadline
                note("deadline", item, ctx, deadline=monotonic_deadline(ctx))
            await trio.sleep(0.05)


def _flood(log: logging.LoggerAdapter[logging.Logger]) -> None:
    while True:
        log.warning("flood %s", "x" * 1000)


not_a_registry = object()


@registry.handler("Broken", retry=RetryPolicy(max_attempts=2, initial_delay=0.1, jitter=0.0))
async def broken(item: WorkItem, ctx: Context) -> None:
    """Fails as a handler with a bug does: a KeyError deep in the handler's code."""
    _look_up_the_path(item.payload)


def _look_up_the_path(payload: dict[str, str]) -> str:
    return payload["path"]
