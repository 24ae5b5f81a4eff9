"""A small pool of TrioConnections, and the background work of a store.

The pool keeps what the store relied on psycopg_pool for: between `min_size` and
`max_size` connections, opened in the background (so a caller whose time bound ends
while a connection is being made does not waste it for the next one), each configured
once by the `configure` hook; a connection is handed out only if it is idle and its
backend has said nothing meanwhile (a terminated backend's last words make its socket
readable), and comes back only if it is idle and alive: a broken one, or one left in a
transaction, is closed and forgotten. Nothing else is kept per session, so the pool
may sit behind PgBouncer in transaction mode. Waiting for a connection is part of the
caller's call, under the caller's time bound (Connections.call).
"""

from __future__ import annotations

import collections
import logging
import select
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import trio
from psycopg import pq

from trioworker._core.retry import Backoff
from trioworker._postgres.trio_connection import TrioConnection

log = logging.getLogger("trioworker.store")

Conn = TrioConnection[Any]
IDLE = pq.TransactionStatus.IDLE


class Background:
    """Work that must not hold the task that starts it: the cancel of an abandoned
    statement, a transaction's ROLLBACK after its caller was cancelled, opening a
    connection for the pool.

    Each runs as a Trio system task (the store may be used from any task, and its
    work must outlive the caller that started it, as it would on psycopg_pool's own
    asyncio tasks); each bounds itself, and `aclose` ends what is left when the
    store closes. Errors are logged: they belong to nobody who could act on them.
    """

    def __init__(self) -> None:
        self._running: set[trio.CancelScope] = set()
        self._idle = trio.Event()
        self._idle.set()

    def start(self, work: Callable[[], Awaitable[None]], what: str) -> None:
        scope = trio.CancelScope()
        self._running.add(scope)
        self._idle = trio.Event() if self._idle.is_set() else self._idle

        async def run() -> None:
            try:
                with scope:
                    await work()
            except Exception:
                log.exception("the store's background work failed: %s", what)
            finally:
                self._running.discard(scope)
                if not self._running:
                    self._idle.set()

        trio.lowlevel.spawn_system_task(run, name=f"trioworker: {what}")

    async def aclose(self, grace: float) -> None:
        """Give what is running `grace` seconds to end, then cancel it."""
        with trio.move_on_after(grace):
            await self._idle.wait()
        for scope in list(self._running):
            scope.cancel()
        await self._idle.wait()


class Pool:
    """Between `min_size` and `max_size` connections made by `connect` and set up by
    `configure`; each handed to one caller at a time."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Conn]],
        *,
        min_size: int,
        max_size: int,
        configure: Callable[[Conn], Awaitable[None]] | None = None,
        background: Background,
        reconnect_timeout: float = 5.0,
        max_lifetime: float = 3600.0,
        max_idle: float = 600.0,
        name: str = "trioworker",
    ) -> None:  # pragma: no mutate block
        self._connect = connect
        self._configure = configure
        self.min_size, self.max_size = min_size, max_size
        self._background = background
        self.reconnect_timeout = reconnect_timeout
        self.max_lifetime, self.max_idle = max_lifetime, max_idle
        self.name = name
        #: Idle connections, the most recently returned last (handed out first), each
        #: with (when it was made, when it came back).
        self._idle: collections.deque[tuple[Conn, float, float]] = collections.deque()
        self._born: dict[int, float] = {}
        #: Connections open, lent or being opened; of those, being opened; callers
        #: waiting for one.
        self.size = 0
        self._opening = 0
        self._waiting = 0
        self._returned = trio.lowlevel.ParkingLot()
        self._closed = True

    def open(self) -> None:  # pragma: no mutate block
        self._closed = False
        self._grow_to_min()

    async def close(self) -> None:  # pragma: no mutate block
        """Close the idle connections; those lent are closed as they come back."""
        self._closed = True
        while self._idle:
            conn, _, _ = self._idle.pop()
            self._forget(conn)
            await conn.close()
        self._returned.unpark_all()

    async def getconn(self) -> Conn:  # pragma: no mutate block
        """An idle connection, or a new one once made; waits (under the caller's time
        bound) while all `max_size` are lent."""
        while True:
            if self._closed:
                raise psycopg.OperationalError(f"the pool {self.name!r} is closed")
            conn = self._take_idle()
            if conn is not None:
                return conn
            self._waiting += 1
            try:
                # One connection opening for each caller waiting, within max_size.
                if self.size < self.max_size and self._opening < self._waiting:
                    self._grow()
                await self._returned.park()
            finally:
                self._waiting -= 1

    def putconn(self, conn: Conn) -> None:  # pragma: no mutate block
        """Take back a connection: kept if idle and alive, else closed and forgotten.
        Never waits, so it can run in a cancelled scope."""
        now = trio.current_time()
        born = self._born.get(id(conn), now)
        if (
            self._closed
            or conn.closed
            or conn.pgconn.transaction_status != IDLE
            or now - born > self.max_lifetime
        ):
            self._discard(conn)
        else:
            self._idle.append((conn, born, now))
            self._shrink(now)
        self._returned.unpark()

    def _take_idle(self) -> Conn | None:
        while self._idle:
            conn, _, _ = self._idle.pop()
            if conn.closed or _has_spoken(conn):
                self._discard(conn)
                continue
            return conn
        return None

    def _shrink(self, now: float) -> None:
        """Close the connection idle longest once unused for max_idle (above min_size)."""
        if self._idle and self.size > self.min_size:
            conn, _, since = self._idle[0]
            if now - since > self.max_idle:
                self._idle.popleft()
                self._discard(conn)

    def _discard(self, conn: Conn) -> None:
        self._forget(conn)
        conn.close_now()
        self._grow_to_min()

    def _forget(self, conn: Conn) -> None:
        if self._born.pop(id(conn), None) is not None:
            self.size -= 1

    def _grow_to_min(self) -> None:
        while not self._closed and self.size < self.min_size:
            self._grow()

    def _grow(self) -> None:
        """Open one more connection in the background, trying again (with backoff)
        for up to reconnect_timeout: a caller waiting for it gets it, or, once its own
        time bound is over, the next caller does."""
        self.size += 1
        self._opening += 1
        self._background.start(self._add_connection, f"connect pool {self.name!r}")

    async def _add_connection(self) -> None:  # pragma: no mutate block
        backoff = Backoff(initial=0.1, maximum=2.0)
        conn: Conn | None = None
        try:
            with trio.move_on_after(self.reconnect_timeout):
                while conn is None:
                    conn = await self._new_connection(backoff)
        finally:
            self._opening -= 1
            if conn is None or self._closed:
                self.size -= 1
                if conn is not None:
                    await conn.close()
            else:
                now = trio.current_time()
                self._born[id(conn)] = now
                self._idle.append((conn, now, now))
            self._returned.unpark()

    async def _new_connection(self, backoff: Backoff) -> Conn | None:  # pragma: no mutate block
        conn: Conn | None = None
        try:
            conn = await self._connect()
            if self._configure is not None:
                await self._configure(conn)
        except (psycopg.Error, OSError) as exc:
            if conn is not None:
                await conn.close()
            delay = backoff.next()
            log.warning(
                "cannot connect pool %r (%s: %s); trying again in %.1fs",
                self.name,
                type(exc).__name__,
                exc,
                delay,
            )
            await trio.sleep(delay)
            return None
        except BaseException:
            if conn is not None:
                await conn.close()
            raise
        return conn


def _has_spoken(conn: Conn) -> bool:
    """Whether an idle connection's socket has something to read: nothing was asked,
    so its backend is gone (a terminated backend's FATAL, then EOF) or has news no
    statement of ours waits for. Either way it is not handed out."""
    poller = select.poll()
    poller.register(conn.pgconn.socket, select.POLLIN)
    return bool(poller.poll(0))
