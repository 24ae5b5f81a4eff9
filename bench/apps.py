"""Handlers for bench Workers: `python -m trioworker run --app bench.apps:registry`.

`Noop` does nothing (throughput). `Pickup` appends "ITEM_ID MONOTONIC" to the file named
by $BENCH_PICKUP_LOG as it starts; `time.monotonic()` is one clock for every process on
Linux, so the benchmark compares it with its own enqueue time.
"""

from __future__ import annotations

import os
import time

from trioworker import Context, Registry, WorkItem

PICKUP_LOG_ENV = "BENCH_PICKUP_LOG"

registry = Registry()


@registry.handler("Noop")
async def noop(item: WorkItem, ctx: Context) -> None:
    """Nothing: the Worker's own cost per item is all there is."""


@registry.handler("Pickup")
async def pickup(item: WorkItem, ctx: Context) -> None:
    """Record when the handler started, before anything else."""
    started = time.monotonic()
    fd = os.open(os.environ[PICKUP_LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{item.id} {started:.9f}\n".encode())
    finally:
        os.close(fd)
