"""Run psycopg's asyncio coroutines from Trio, giving control back at once on cancel.

trio-asyncio's own adapters wait for the asyncio side to finish cancelling. psycopg
answers a cancelled query by cancelling it on the server (`cancel_safe`, up to 5 s)
and then waiting for the server, which on a dead link holds the caller about 10.5 s.
Here the asyncio task is shielded: a Trio cancel returns at once, the task is
cancelled in the background, and `on_abandon` lets the caller discard the connection
the task was using.

psycopg's waiting functions call `get_running_loop`, which psycopg/waiting.py binds
(`from asyncio import get_running_loop`) when it is first imported. trio-asyncio
replaces `asyncio.get_running_loop` when it is imported, with one that finds the
trio-asyncio loop of the current Trio task; a psycopg imported before trio-asyncio
keeps the original, finds no running loop inside Trio, and every call fails or hangs
("no running event loop", then a StoreTimeout). So the binding is renewed here,
after trio-asyncio's patch, whichever was imported first.

trio-asyncio is imported only when the Trio store first needs it, not with
`trioworker`: importing it also replaces asyncio's event loop policy, so that
`asyncio.run` would run an asyncio application (one using `AsyncClient`) on a
trio-asyncio loop.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg.waiting
import sniffio

from trioworker._core.errors import ConfigurationError

T = TypeVar("T")


@functools.cache
def _trio_asyncio() -> Any:
    """trio-asyncio, imported (and psycopg rebound to its patch) on first use."""
    import trio_asyncio

    rebind_psycopg()
    return trio_asyncio


def rebind_psycopg() -> None:
    """Point psycopg's waiting functions at asyncio's `get_running_loop` as it is now
    (trio-asyncio's, once imported), even if psycopg was imported first."""
    psycopg.waiting.get_running_loop = asyncio.get_running_loop  # type: ignore[attr-defined]


def current_loop() -> asyncio.AbstractEventLoop:
    loop: asyncio.AbstractEventLoop | None = _trio_asyncio().current_loop.get(None)
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
        return await _trio_asyncio().run_aio_future(asyncio.shield(task))  # type: ignore[no-any-return]
    finally:
        if not task.done():
            task.cancel()
            task.add_done_callback(consume_result)


def consume_result(task: asyncio.Task[Any]) -> None:
    """A done callback for a task nobody awaits: retrieving its outcome keeps asyncio
    from logging "exception was never retrieved"."""
    if not task.cancelled():
        task.exception()


def require_trio(what: str) -> None:
    """Raise ConfigurationError unless this runs in Trio: `what` is Trio's alone."""
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = None
    if library != "trio":
        raise ConfigurationError(
            f"{what} runs under Trio (the Worker's world), and this is not a Trio task: from"
            " asyncio (FastAPI, Starlette, aiohttp) use trioworker.AsyncClient, from"
            " synchronous code (Django, Flask, scripts) trioworker.Client"
        )


def has_loop() -> bool:
    return _trio_asyncio().current_loop.get(None) is not None


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
        async with _trio_asyncio().open_loop():
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
