"""Waiting for an item's result in `Client` and `AsyncClient`.

Each wait reads the item (operations.result_state) until it has ended, sleeping
between reads with a growing interval (RESULT_POLL_FIRST doubling to RESULT_POLL_MAX);
a connection of its own LISTENs on `trioworker_result`, which a finish with a result
notifies (work_finish_result_v1), so such a wait ends at once. The polling is the
fallback for everything else: a Failed or Cancelled item, a result of None, a link
through a transaction pooler where LISTEN hears nothing, or no listening connection
at all (the application's own pool was given).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, LiteralString

import psycopg

from trioworker._store.reads import RESULT_POLL_FIRST, next_poll

#: Listen on the channel a finish with results notifies (its payload: the item's id;
#: migrations/0002.results-steps.sql).
LISTEN: LiteralString = "LISTEN trioworker_result"

Read = Callable[[], tuple[bool, Any]]
ReadAsync = Callable[[], Awaitable[tuple[bool, Any]]]


def _give_up_at(timeout: float | None, now: float) -> float:
    if timeout is None:
        return math.inf
    if not timeout >= 0:
        raise ValueError(f"timeout must be a number of seconds >= 0 or None, not {timeout!r}")
    return now + timeout


def _timed_out(id: int, timeout: float | None) -> TimeoutError:
    return TimeoutError(f"item {id} had not ended after {timeout:g}s")


def wait_sync(
    read: Read, id: int, timeout: float | None, listen: Callable[[], psycopg.Connection[Any]] | None
) -> Any:  # pragma: no mutate block
    """`read()` until the item has ended; its result (TimeoutError after `timeout`)."""
    give_up = _give_up_at(timeout, time.monotonic())
    conn = None
    if listen is not None:
        try:
            conn = listen()
            conn.execute(LISTEN)
        except psycopg.Error:  # polling alone, then
            conn = None
    try:
        interval = RESULT_POLL_FIRST
        while True:
            done, value = read()
            if done:
                return value
            now = time.monotonic()
            if now >= give_up:
                raise _timed_out(id, timeout)
            pause = min(interval, give_up - now)
            if conn is None:
                time.sleep(pause)
            else:
                try:
                    for _ in conn.notifies(timeout=pause, stop_after=1):
                        pass
                except psycopg.Error:  # the listening link broke: poll on
                    conn.close()
                    conn = None
            interval = next_poll(interval)
    finally:
        if conn is not None:
            conn.close()


async def wait_async(
    read: ReadAsync,
    id: int,
    timeout: float | None,  # noqa: ASYNC109  Client.result's timeout=, passed on
    listen: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]] | None,
) -> Any:  # pragma: no mutate block
    """As `wait_sync`, on asyncio."""
    loop = asyncio.get_running_loop()
    give_up = _give_up_at(timeout, loop.time())
    conn = None
    if listen is not None:
        try:
            conn = await listen()
            await conn.execute(LISTEN)
        except psycopg.Error:
            conn = None
    try:
        interval = RESULT_POLL_FIRST
        while True:
            done, value = await read()
            if done:
                return value
            now = loop.time()
            if now >= give_up:
                raise _timed_out(id, timeout)
            pause = min(interval, give_up - now)
            if conn is None:
                await asyncio.sleep(pause)
            else:
                try:
                    async for _ in conn.notifies(timeout=pause, stop_after=1):
                        pass
                except psycopg.Error:
                    await conn.close()
                    conn = None
            interval = next_poll(interval)
    finally:
        if conn is not None:
            await conn.close()
