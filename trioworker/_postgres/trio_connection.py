"""psycopg's async connection, waited on by Trio.

psycopg's protocol code is generators that yield the socket readiness they wait for
(`Wait`) and are sent what the socket became (`Ready`); its sync and asyncio
connections differ only in the function that waits. `TrioConnection` is a real
`psycopg.AsyncConnection` (cursors, transactions, adapters, `notifies()` all psycopg's)
whose waiting goes through `trio.lowlevel.wait_readable` / `wait_writable`, so a
statement costs one trip through Trio's scheduler, and no asyncio loop is involved.
The psycopg names this relies on that psycopg does not document are all in
psycopg_internals.py, with where psycopg's own code would reach for asyncio.

A Trio cancel (a call's time bound, a self-stop) returns at once. If a statement was in
flight, the connection is closed at once, so nobody can use it again, and the
statement is cancelled on the server in the background (`on_abandon`), where it would
otherwise run on, holding its locks, until it next wrote to the closed socket.
"""

from __future__ import annotations

import contextlib
import logging
import select
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import sniffio
import trio
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import AsyncRowFactory, Row

from trioworker._core.errors import ConfigurationError
from trioworker._postgres import psycopg_internals as internals
from trioworker._postgres.psycopg_internals import Gen, GenConn, Ready, Wait

log = logging.getLogger("trioworker.store")

RV = TypeVar("RV")
WAIT_R, WAIT_W = Wait.R, Wait.W
READY_NONE, READY_R, READY_W = Ready.NONE, Ready.R, Ready.W
ACTIVE = pq.TransactionStatus.ACTIVE
#: How long a cancel request to the server may take, in the background (psycopg's own
#: `_try_cancel` allows the same).
CANCEL_WITHIN = 5.0

#: Work that must not hold the task that started it (the cancel of an abandoned
#: statement): `Background.start` in pool.py.
StartInBackground = Callable[[Callable[[], Awaitable[None]], str], None]


class TrioLock:
    """The lock psycopg takes around each operation on a connection (`async with
    conn.lock`), for Trio: uncontended, it takes no trip through the scheduler (as
    asyncio.Lock, which a second task could not wait on without asyncio's loop)."""

    def __init__(self) -> None:
        self._held = False
        self._waiting = trio.lowlevel.ParkingLot()

    async def __aenter__(self) -> None:
        while self._held:
            await self._waiting.park()
        self._held = True

    async def __aexit__(self, *exc: object) -> None:
        self._held = False
        self._waiting.unpark()

    def locked(self) -> bool:
        return self._held


class TrioConnection(psycopg.AsyncConnection[Row]):
    """A psycopg async connection whose every wait is Trio's."""

    #: Where the cancel of an abandoned statement runs; None: it is not sent (the
    #: connection is closed all the same).
    on_abandon: StartInBackground | None = None

    def __init__(self, pgconn: pq.abc.PGconn, row_factory: AsyncRowFactory[Row] | None = None):
        if row_factory is None:
            super().__init__(pgconn)
        else:
            super().__init__(pgconn, row_factory)
        self.lock = TrioLock()  # type: ignore[assignment]  # psycopg's is an asyncio.Lock

    @classmethod
    async def connect(  # fewer options than psycopg's
        cls,
        conninfo: str = "",
        *,
        autocommit: bool = False,
        prepare_threshold: int | None = 5,
        **kwargs: Any,
    ) -> TrioConnection[Any]:
        """Connect as `psycopg.AsyncConnection.connect` does: each host (and each
        address a host name resolves to) in turn, each within connect_timeout."""
        params = conninfo_to_dict(conninfo, **kwargs)
        timeout = internals.timeout_from_conninfo(params)
        attempts = await trio.to_thread.run_sync(
            internals.conninfo_attempts, params, abandon_on_cancel=True
        )
        failures: list[tuple[psycopg.Error, str]] = []
        for attempt in attempts:
            where = f"host: {attempt.get('host')!r}, port: {attempt.get('port')!r}"
            log.debug("connection attempt: %s", where)
            try:
                with trio.fail_after(timeout):
                    gen = internals.connect_generator(cls, make_conninfo("", **attempt))
                    conn = await wait_conn(gen)
            except trio.TooSlowError:
                timed_out = psycopg.errors.ConnectionTimeout("connection timeout expired")
                failures.append((timed_out, where))
            except psycopg.Error as exc:
                failures.append((exc, where))
            else:
                assert isinstance(conn, TrioConnection)
                await conn.set_autocommit(autocommit)
                conn.prepare_threshold = prepare_threshold
                log.debug("connection succeeded: %s", where)
                return conn
            log.debug("connection failed: %s: %s", where, failures[-1][0])
        raise _connection_failed(failures)

    async def wait(
        self,
        gen: Gen[RV],
        interval: float = 0.0,
        timeout: float | None = None,  # noqa: ASYNC109  # psycopg's signature: psycopg calls it
    ) -> RV:
        """Run `gen` to its end, waiting on the socket with Trio; raise WaitTimeout
        after `timeout` seconds. (psycopg's `interval` wakes its loop to poll for
        interrupts; Trio delivers cancellation itself, so it is unused.)"""
        try:
            fileno = self.pgconn.socket
            if timeout is None:
                return await _drive(gen, fileno)
            with trio.move_on_after(timeout):
                return await _drive(gen, fileno)
            raise internals.WaitTimeout("wait timeout expired")
        except psycopg.Error:
            raise
        except (OSError, trio.ClosedResourceError) as exc:
            self.pgconn.finish()
            raise psycopg.OperationalError("connection socket closed") from exc
        except BaseException:
            # Cancelled (or interrupted) with a statement in flight: the connection is
            # in an unknown state. Closed here and now, cancelled on the server later.
            if not self.closed and self.pgconn.transaction_status == ACTIVE:
                self.abandon()
            raise

    def abandon(self) -> None:
        """Close the connection now, and cancel its statement on the server in the
        background (`on_abandon`): the caller is not held, however dead the link."""
        try:
            cancel = _cancel_request(self.pgconn)
        except psycopg.Error:  # no cancel without a live connection: closing will do
            cancel = None
        self.close_now()
        if cancel is not None and self.on_abandon is not None:
            self.on_abandon(cancel, "cancel an abandoned statement")

    async def cancel_safe(self, *, timeout: float = 30.0) -> None:  # noqa: ASYNC109  # psycopg's
        """Cancel the current statement on the server, within `timeout` seconds."""
        if self.closed:
            return
        with trio.move_on_after(timeout or float("inf")) as scope:
            await _cancel_request(self.pgconn)()
        if scope.cancelled_caught:
            raise psycopg.errors.CancellationTimeout("cancellation timeout expired")

    async def close(self) -> None:
        """psycopg's close (it never waits), after waking any task waiting on the
        socket, as Trio requires before a socket it watches is closed."""
        if not self.closed:
            with contextlib.suppress(psycopg.Error):
                trio.lowlevel.notify_closing(self.pgconn.socket)
        await super().close()

    def close_now(self) -> None:
        """Close the connection without waiting: any task waiting on its socket is
        woken first (it raises), as Trio requires."""
        if self.closed:
            return
        with contextlib.suppress(psycopg.Error):
            trio.lowlevel.notify_closing(self.pgconn.socket)
        self.pgconn.finish()


async def _drive(gen: Gen[RV], fileno: int) -> RV:
    """Run a protocol generator on a socket that does not change (a statement)."""
    try:
        wait = next(gen)
        while True:
            wait = gen.send(await _ready(fileno, wait))
    except StopIteration as done:
        result: RV = done.value
        return result


async def wait_conn(gen: GenConn[RV]) -> RV:
    """Run a generator whose socket may change as it goes (connecting, cancelling)."""
    try:
        fileno, wait = next(gen)
        while True:
            fileno, wait = gen.send(await _ready(fileno, wait))
    except StopIteration as done:
        result: RV = done.value
        return result


async def _ready(fileno: int, wait: int) -> int:
    """Wait until the socket is as `wait` asks; what it became."""
    if wait == WAIT_R:
        await trio.lowlevel.wait_readable(fileno)
        return READY_R
    # Asked for writing (to flush), it nearly always is writable already: a poll costs
    # less than a trip through the scheduler.
    now = _poll(fileno, wait)
    if now:
        return now
    if wait == WAIT_W:
        await trio.lowlevel.wait_writable(fileno)
        return READY_W
    return await _either(fileno)


def _poll(fileno: int, wait: int) -> int:
    poller = select.poll()
    poller.register(fileno, (select.POLLIN if wait & WAIT_R else 0) | select.POLLOUT)
    ready: int = READY_NONE
    for _, events in poller.poll(0):
        if events & (select.POLLIN | select.POLLHUP | select.POLLERR):
            ready |= READY_R if wait & WAIT_R else READY_W
        if events & select.POLLOUT:
            ready |= READY_W
    return ready


async def _either(fileno: int) -> int:
    """Readable or writable, whichever comes first (a flush of a statement larger than
    the socket's buffer, while the server may be writing to us)."""
    ready: int = READY_NONE

    async def until(wait: Callable[[int], Awaitable[None]], becomes: Ready) -> None:
        nonlocal ready
        await wait(fileno)
        ready |= becomes
        nursery.cancel_scope.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(until, trio.lowlevel.wait_readable, READY_R)
            nursery.start_soon(until, trio.lowlevel.wait_writable, READY_W)
    except BaseExceptionGroup as group:  # one error of a socket, not a group
        raise group.exceptions[0] from None
    return ready


def _cancel_request(pgconn: pq.abc.PGconn) -> Callable[[], Awaitable[None]]:
    """Prepare, from the live connection, a cancel request to send later (even once
    `pgconn` is closed): an async function sending it, within CANCEL_WITHIN."""
    if psycopg.capabilities.has_cancel_safe():  # libpq >= 17: non-blocking
        cancel_conn = pgconn.cancel_conn()

        async def send() -> None:
            try:
                cancel_conn.start()
                await wait_conn(internals.cancel_generator(cancel_conn))
            finally:
                cancel_conn.finish()

    else:
        cancel = pgconn.get_cancel()

        async def send() -> None:
            await trio.to_thread.run_sync(cancel.cancel, abandon_on_cancel=True)

    async def within_bound() -> None:
        with trio.move_on_after(CANCEL_WITHIN):
            try:
                await send()
            except (psycopg.Error, OSError) as exc:
                log.warning("could not cancel an abandoned statement: %s", exc)

    return within_bound


def _connection_failed(failures: list[tuple[psycopg.Error, str]]) -> psycopg.Error:
    """The last attempt's error, naming every attempt's when there were several."""
    last = failures[-1][0]
    if len(failures) == 1:
        return last.with_traceback(None)
    lines = [str(last), "Multiple connection attempts failed. All failures were:"]
    lines += [f"- {where}: {exc}" for exc, where in failures]
    return type(last)("\n".join(lines))


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
