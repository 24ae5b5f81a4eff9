"""A test app whose handlers raise what careless or hostile handlers raise (issue 18):
each must become its item's recorded error, and the Worker must go on."""

from __future__ import annotations

import os

import trio
import trio.lowlevel

from trioworker import Context, DoNotRetry, Registry, RetryPolicy, WorkItem

registry = Registry()
ONCE = RetryPolicy(max_attempts=1)
TWICE = RetryPolicy(max_attempts=2, initial_delay=0.0, jitter=0.0)


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@registry.handler("Surrogate")
async def surrogate(item: WorkItem, ctx: Context) -> None:
    """The guide's Index pattern, for a file name that is not UTF-8 (Latin-1 é)."""
    path = os.fsdecode(b"/media/caf\xe9.txt")
    raise DoNotRetry(f"no such file: {path}")


@registry.handler("BrokenStr", retry=ONCE)
async def broken_str(item: WorkItem, ctx: Context) -> None:
    raise BrokenStr


@registry.handler("Nul", retry=TWICE)
async def nul(item: WorkItem, ctx: Context) -> None:
    raise ValueError("before\x00after")


@registry.handler("Exit", retry=ONCE)
async def exit_(item: WorkItem, ctx: Context) -> None:
    raise SystemExit(3)  # what argparse does inside a handler


@registry.handler("Interrupt", retry=ONCE)
async def interrupt(item: WorkItem, ctx: Context) -> None:
    raise KeyboardInterrupt


@registry.handler("Bare", retry=TWICE)
async def bare(item: WorkItem, ctx: Context) -> None:
    raise BaseException("bare")


@registry.handler("Group", retry=ONCE)
async def group(item: WorkItem, ctx: Context) -> None:
    async def fails() -> None:
        raise KeyboardInterrupt

    async with trio.open_nursery() as nursery:
        nursery.start_soon(fails)
        nursery.start_soon(trio.sleep_forever)


@registry.handler("Quick")
async def quick(item: WorkItem, ctx: Context) -> None:
    await trio.lowlevel.checkpoint()
