"""asyncio code inside a Trio Worker: a trio-asyncio loop, opened when first needed.

The Worker's own statements need no asyncio (the store waits on psycopg with Trio). A
handler that must call an asyncio-only library (an SDK written for asyncio, an
`asyncio.open_connection` client) runs it through `AsyncioLoop.run`, on a
trio-asyncio loop that runs as a task of the nursery the Worker gives, opened on the
first call and closed with the Worker.

trio-asyncio is imported on that first call, not before: importing it replaces asyncio's
event loop policy and `asyncio.new_event_loop` for the whole process (so that
`asyncio.run` elsewhere in the process would run on a trio-asyncio loop). A process
whose handlers never call asyncio code never imports it. It also replaces
`asyncio.get_running_loop`, which psycopg's waiting module binds when first imported:
psycopg's asyncio API (`AsyncClient`, say) called through `run` needs that binding
renewed, which `_trio_asyncio` does.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

T = TypeVar("T")


@functools.cache
def _trio_asyncio() -> Any:
    """trio-asyncio, imported on first use (and psycopg, if loaded, pointed at its
    `get_running_loop`)."""
    import trio_asyncio

    waiting = sys.modules.get("psycopg.waiting")
    if waiting is not None:  # imported before trio-asyncio patched asyncio
        waiting.get_running_loop = asyncio.get_running_loop  # type: ignore[attr-defined]
    return trio_asyncio


class AsyncioLoop:
    """Runs asyncio coroutine functions from Trio tasks, on one trio-asyncio loop that
    is opened, as a task in `nursery`, when `run` is first called.

    `close()` ends the loop (the Worker calls it as it ends; cancelling `nursery` ends
    it too). Calls still running then are cancelled as asyncio cancels tasks.
    """

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opened: trio.Event | None = None
        self._closing = trio.Event()

    @property
    def is_open(self) -> bool:
        """Whether the loop has been opened (and not closed)."""
        return self._loop is not None

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`await fn(*args)` on the asyncio loop, `fn` an asyncio coroutine function;
        its result, or its exception. A Trio cancel of the caller cancels the asyncio
        task and returns once it has ended."""
        loop = self._loop or await self._open()
        result: T = await _trio_asyncio().aio_as_trio(fn, loop=loop)(*args)
        return result

    def close(self) -> None:
        """End the loop (if it was opened); `run` may not be called afterwards."""
        self._closing.set()

    async def _open(self) -> asyncio.AbstractEventLoop:
        if self._closing.is_set():
            raise RuntimeError("the asyncio loop is closed")
        if self._opened is None:  # the first caller starts it; the others wait too
            self._opened = trio.Event()
            self._nursery.start_soon(self._serve, name="trioworker: asyncio loop")
        await self._opened.wait()
        if self._loop is None:
            raise RuntimeError("the asyncio loop is closed")
        return self._loop

    async def _serve(self) -> None:
        assert self._opened is not None
        try:
            if not self._closing.is_set():
                async with _trio_asyncio().open_loop() as loop:
                    self._loop = loop
                    self._opened.set()
                    await self._closing.wait()
        finally:
            self._loop = None
            self._opened.set()  # callers waiting for a loop that will not come raise
