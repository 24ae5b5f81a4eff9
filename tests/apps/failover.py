"""The failover chaos app: one handler that records each run of an attempt outside the
database, with an id of its own for each run.

After a failover lost a claim with the old primary, the new primary can hand out the
same (item, attempt) again: the observer must tell the two runs apart, so each start
line carries a fresh run id and its end (or cancel) line the same id.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import trio

from trioworker import Context, Registry, WorkItem

OBSERVER_ENV = "TW_OBSERVER_LOG"

registry = Registry()


def record(event: str, run: str, item: WorkItem, ctx: Context) -> None:
    line = json.dumps(
        {
            "event": event,
            "run": run,
            "id": item.id,
            "attempt": item.attempt,
            "scope": item.scope,
            "worker": ctx.worker_id,
            "pid": os.getpid(),
            "t": time.monotonic(),
        }
    )
    fd = os.open(os.environ[OBSERVER_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@registry.handler("Hold")
async def hold(item: WorkItem, ctx: Context) -> None:
    """Hold the scope payload["seconds"]; record the run's start and its end (or cancel)."""
    run = uuid.uuid4().hex
    record("start", run, item, ctx)
    try:
        await trio.sleep(float(item.payload.get("seconds", 0.1)))
    except trio.Cancelled:
        record("cancelled", run, item, ctx)
        raise
    record("end", run, item, ctx)
