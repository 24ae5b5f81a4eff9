"""The Trio store's pool (trioworker/_postgres/pool.py) over fake connections: what it
hands out, what it takes back, how many it keeps, on virtual time."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from psycopg import pq

from trioworker._postgres.pool import Background, Pool


class FakePGconn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.transaction_status = pq.TransactionStatus.IDLE

    @property
    def socket(self) -> int:
        return self.sock.fileno()


class FakeConn:
    """What the pool looks at: closed, the transaction status, the socket."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ours, self.server = socket.socketpair()
        self.pgconn = FakePGconn(self.ours)
        self.closed = False
        self.configured = False

    def close_now(self) -> None:
        self.closed = True

    async def close(self) -> None:
        self.closed = True


class Connector:
    def __init__(self) -> None:
        self.made: list[FakeConn] = []
        self.failures = 0

    async def __call__(self) -> Any:
        await trio.sleep(0.01)
        if self.failures:
            self.failures -= 1
            raise psycopg.OperationalError("refused")
        self.made.append(FakeConn(len(self.made)))
        return self.made[-1]


async def configure(conn: Any) -> None:
    conn.configured = True


@pytest.fixture
def pool() -> Iterator[tuple[Pool, Connector]]:
    connector = Connector()
    pool = Pool(connector, min_size=1, max_size=2, configure=configure, background=Background())
    yield pool, connector
    for conn in connector.made:
        conn.ours.close()
        conn.server.close()


async def test_min_size_is_made_at_open_and_configured(
    pool: tuple[Pool, Connector], autojump_clock: trio.testing.MockClock
) -> None:
    p, made = pool
    p.open()
    await trio.sleep(1)
    assert [c.configured for c in made.made] == [True] and p.size == 1
    await p.close()


async def test_at_most_max_size_are_lent_and_a_third_caller_waits(
    pool: tuple[Pool, Connector], autojump_clock: trio.testing.MockClock
) -> None:
    p, made = pool
    p.open()
    a, b = await p.getconn(), await p.getconn()
    assert a is not b and p.size == 2
    with trio.move_on_after(5) as waited:
        await p.getconn()
    assert waited.cancelled_caught and len(made.made) == 2
    async with trio.open_nursery() as nursery:

        async def third() -> None:
            assert await p.getconn() is a

        nursery.start_soon(third)
        await trio.sleep(1)
        p.putconn(a)
    await p.close()


async def test_a_broken_or_busy_connection_never_goes_back(
    pool: tuple[Pool, Connector], autojump_clock: trio.testing.MockClock
) -> None:
    p, _ = pool
    p.open()
    a = await p.getconn()
    a.close_now()
    p.putconn(a)
    b = await p.getconn()
    assert b is not a
    b.pgconn.transaction_status = pq.TransactionStatus.INTRANS
    p.putconn(b)
    assert b.closed
    c = await p.getconn()
    assert c not in (a, b) and p.size == 1
    await p.close()


async def test_an_idle_connection_whose_backend_spoke_is_not_handed_out(
    pool: tuple[Pool, Connector], autojump_clock: trio.testing.MockClock
) -> None:
    """A terminated backend's FATAL (then EOF) makes the idle socket readable."""
    p, _ = pool
    p.open()
    a = await p.getconn()
    p.putconn(a)
    a.server.send(b"E")  # the backend's last words
    b = await p.getconn()
    assert b is not a and a.closed
    await p.close()


async def test_failed_connects_are_tried_again_in_the_background(
    pool: tuple[Pool, Connector], autojump_clock: trio.testing.MockClock
) -> None:
    p, made = pool
    made.failures = 3
    p.open()
    conn = await p.getconn()
    assert conn is made.made[0] and p.size == 1
    await p.close()


async def test_a_connection_older_than_max_lifetime_is_replaced(
    pool: tuple[Pool, Connector], autojump_clock: trio.testing.MockClock
) -> None:
    p, _ = pool
    p.max_lifetime = 100
    p.open()
    a = await p.getconn()
    await trio.sleep(101)
    p.putconn(a)
    assert a.closed
    assert await p.getconn() is not a
    await p.close()


async def test_closing_closes_the_idle_and_refuses_callers(
    pool: tuple[Pool, Connector], autojump_clock: trio.testing.MockClock
) -> None:
    p, _ = pool
    p.open()
    a, b = await p.getconn(), await p.getconn()
    p.putconn(a)
    await p.close()
    assert a.closed and not b.closed
    p.putconn(b)  # lent when the pool closed: closed as it comes back
    assert b.closed and p.size == 0
    with pytest.raises(psycopg.OperationalError, match="closed"):
        await p.getconn()
