"""Waiting for an item's result under Trio: the Trio store's and MemoryStore's `result`."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from trioworker._store.reads import RESULT_POLL_FIRST, next_poll


async def wait_result(
    read: Callable[[], Awaitable[tuple[bool, Any]]],
    id: int,
    timeout: float | None,  # noqa: ASYNC109  the callers' timeout=, passed on
    woken: Callable[[], trio.Event] | None = None,
) -> Any:
    """Call `read()` (whether the item has ended, and its result; it raises for one
    that ended otherwise) until it says ended, polling with a growing interval; the
    result. TimeoutError once `timeout` seconds have passed (None: no bound). `woken()`,
    if given, is an event set when the item may have ended (a notification), which
    ends a poll's sleep early."""
    if timeout is not None and not timeout >= 0:
        raise ValueError(f"timeout must be a number of seconds >= 0 or None, not {timeout!r}")
    give_up = math.inf if timeout is None else trio.current_time() + timeout
    interval = RESULT_POLL_FIRST
    while True:
        event = woken() if woken is not None else None
        done, value = await read()
        if done:
            return value
        now = trio.current_time()
        if now >= give_up:
            raise TimeoutError(f"item {id} had not ended after {timeout:g}s")
        with trio.move_on_at(min(now + interval, give_up)):
            if event is None:
                await trio.sleep_forever()
            else:
                await event.wait()
        interval = next_poll(interval)
