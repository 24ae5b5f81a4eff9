"""Run psycopg's asyncio coroutines from Trio, giving control back at once on cancel.

trio-asyncio's own adapters wait for the asyncio side to finish cancelling. psycopg
answers a cancelled query by cancelling it on the server (`cancel_safe`, up to 5 s)
and then waiting for the server, which on a dead link holds the caller about 10.5 s.
Here the asyncio task is shielded: a Trio cancel returns at once, the task is
cancelled in the background, and `on_abandon` lets the caller discard the connection
the task was using.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio_asyncio

T = TypeVar("T")


def current_loop() -> asyncio.AbstractEventLoop:
    loop: asyncio.AbstractEventLoop | None = trio_asyncio.current_loop.get(None)
    if loop is None:
        raise RuntimeError("no trio-asyncio loop here: open the store inside `open_store`")
    return loop


async def run(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop | None = None) -> T:
    """Await an asyncio coroutine from Trio; a Trio cancel returns immediately.

    `loop` is the trio-asyncio loop to run it on (default: this task's). Passing the
    loop a store was opened in lets any Trio task use the store.
    """
    task = (loop or current_loop()).create_task(coro)
    try:
        return await trio_asyncio.run_aio_future(asyncio.shield(task))  # type: ignore[no-any-return]
    finally:
        if not task.done():
            task.cancel()
            task.add_done_callback(consume_result)


def consume_result(task: asyncio.Task[Any]) -> None:
    """A done callback for a task nobody awaits: retrieving its outcome keeps asyncio
    from logging "exception was never retrieved"."""
    if not task.cancelled():
        task.exception()


def has_loop() -> bool:
    return trio_asyncio.current_loop.get(None) is not None


@asynccontextmanager
async def ensure_loop() -> AsyncIterator[None]:
    """Open a trio-asyncio loop unless one is already running here.

    The loop's nurseries are an implementation detail, so an error from the body
    comes out as itself, not wrapped in their exception groups.
    """
    if has_loop():
        yield
        return
    try:
        async with trio_asyncio.open_loop():
            yield
    except BaseExceptionGroup as group:
        raise _sole_leaf(group) or group from None


def _sole_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    if len(group.exceptions) != 1:
        return None
    inner = group.exceptions[0]
    if isinstance(inner, BaseExceptionGroup):
        return _sole_leaf(inner)
    return inner
