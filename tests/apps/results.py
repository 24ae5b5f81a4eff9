"""A test app for results and durable steps (issue 34): handlers that return values,
fail, and run a step whose function waits at a gate file, noting each call of it in
the observer log ($TW_OBSERVER_LOG)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import trio

from trioworker import Context, DoNotRetry, Registry, WorkItem

registry = Registry()


@registry.handler("Result")
async def result(item: WorkItem, ctx: Context) -> Any:
    """Returns the payload's "value"; fails for good when it has "fail"."""
    if "fail" in item.payload:
        raise DoNotRetry(item.payload["fail"])
    return item.payload.get("value")


def note(event: str, item: WorkItem, **fields: Any) -> None:
    line = {"event": event, "id": item.id, "attempt": item.attempt, "pid": os.getpid(),
            "t": time.monotonic(), **fields}  # fmt: skip
    fd = os.open(os.environ["TW_OBSERVER_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


@registry.handler("GatedStep")
async def gated_step(item: WorkItem, ctx: Context) -> Any:
    """One step, whose function notes that it ran, waits for the gate file named by the
    payload, notes that it returns, and returns the attempt that ran it."""

    async def scan() -> int:
        note("fn-start", item)
        gate = trio.Path(item.payload["gate"])
        while not await gate.exists():  # noqa: ASYNC110  another process's file is the gate
            await trio.sleep(0.02)
        note("fn-return", item)
        return item.attempt

    ran_by = await ctx.step("scan", scan)
    return {"step ran in attempt": ran_by}
