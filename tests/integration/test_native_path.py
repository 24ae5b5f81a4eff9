"""The Trio store's own path to PostgreSQL (trio_connection.py, pool.py): psycopg's
protocol generators waited on by Trio, with no asyncio loop and no trio-asyncio on the
way, and a Trio cancel that returns at once while the server cancels the statement."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.connection_async
import psycopg.waiting
import pytest
import trio

from trioworker import StoreTimeout, open_store
from trioworker._postgres.trio_connection import TrioConnection

Conn = psycopg.Connection[Any]

#: psycopg's asyncio entry points, each reached from a method TrioConnection overrides.
ASYNCIO_PATHS = [
    (psycopg.waiting, "wait_async", "AsyncConnection.wait"),
    (psycopg.waiting, "wait_conn_async", "AsyncConnection.connect or cancel_safe"),
    (psycopg.connection_async, "conninfo_attempts_async", "AsyncConnection.connect"),
]


@pytest.fixture
def no_asyncio(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """psycopg's asyncio waits raise, naming the method that must be overridden."""
    for module, name, owner in ASYNCIO_PATHS:

        def refuse(*args: Any, _name: str = name, _owner: str = owner, **kwargs: Any) -> Any:
            raise AssertionError(
                f"psycopg called {_name}: psycopg has changed how {_owner} waits, and"
                " TrioConnection must override what reached it (psycopg_internals.py)"
            )

        monkeypatch.setattr(module, name, refuse)
    yield


async def test_every_statement_shape_runs_with_no_asyncio(dsn: str, no_asyncio: None) -> None:
    """Connect, rows back, a transaction, a statement larger than the socket's buffer,
    two tasks sharing one connection (its lock), LISTEN/NOTIFY with psycopg's own
    notifies(), and cancel_safe: each waits on Trio alone."""
    conn = await TrioConnection.connect(dsn, autocommit=True)
    try:
        cur = await conn.execute("SELECT generate_series(1, 40)")
        assert [row[0] for row in await cur.fetchall()] == list(range(1, 41))
        async with conn.transaction():
            await conn.execute("CREATE TEMP TABLE t (x text)")
            big = "x" * 8_000_000  # flushed in many writes, waiting on R or W
            await conn.execute("INSERT INTO t VALUES (%s)", [big])
        cur = await conn.execute("SELECT length(x) FROM t")
        assert await cur.fetchone() == (8_000_000,)

        results: list[int] = []

        async def sleep_then(n: int) -> None:
            cur = await conn.execute("SELECT %s FROM pg_sleep(0.05)", [n])
            row = await cur.fetchone()
            assert row is not None
            results.append(row[0])

        async with trio.open_nursery() as nursery:
            for n in range(3):
                nursery.start_soon(sleep_then, n)
        assert sorted(results) == [0, 1, 2]

        await conn.execute("LISTEN native_test")
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("NOTIFY native_test, 'hello'")
        got = [n.payload async for n in conn.notifies(timeout=2.0, stop_after=1)]
        assert got == ["hello"]
        # Nothing comes: it returns empty once its timeout has passed, not at once, and
        # does return (a wait for ever would fail here rather than hang the test).
        began = trio.current_time()
        with trio.fail_after(60):
            assert [n async for n in conn.notifies(timeout=0.2)] == []
        assert trio.current_time() - began > 0.15

        await conn.cancel_safe(timeout=5)  # nothing running: a no-op on the server
    finally:
        await conn.close()
    assert conn.closed


async def test_a_cancelled_statement_returns_at_once_and_is_cancelled_on_the_server(
    dsn: str, pg: Conn, no_asyncio: None
) -> None:
    """A Trio cancel mid-statement returns at once; the server cancels the statement
    (its backend ends) without the caller waiting, and the store carries on with
    other connections."""
    async with open_store(dsn, call_timeout=10.0) as store:
        began = trio.current_time()
        with trio.move_on_after(0.3):
            async with store.transaction() as tx:
                await tx.execute("SELECT pg_sleep(60) /* abandoned */")
        # At once: not after psycopg's ~10.5 s cancel path, nor the 60 s sleep (a
        # bound a loaded machine cannot come near; it returns in about 0.3 s).
        assert trio.current_time() - began < 5
        for _ in range(50):
            left = pg.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s"
                " AND pid <> pg_backend_pid()",
                ["%abandoned */"],
            ).fetchone()
            if left == (0,):
                break
            await trio.sleep(0.1)
        assert left == (0,)
        assert (await store.enqueue("After")).id > 0


async def test_a_pooled_connection_whose_backend_died_is_not_handed_out(dsn: str, pg: Conn) -> None:
    """Every pooled backend terminated while idle: the next call gets a new
    connection instead of failing on a dead one."""
    async with open_store(dsn, max_connections=3) as store:
        async with trio.open_nursery() as nursery:  # three connections in the pool
            for _ in range(3):
                nursery.start_soon(store.enqueue, "Before")
        pg.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        await trio.sleep(0.2)
        assert (await store.enqueue("After")).id > 0


async def test_the_pool_waits_for_a_connection_within_the_call_bound(dsn: str) -> None:
    """With max_connections=1 held by a transaction, another call waits for it and
    ends with StoreTimeout at its call_timeout."""
    store: Any
    async with open_store(dsn, max_connections=1, call_timeout=0.5) as store, store.transaction():
        began = trio.current_time()
        with pytest.raises(StoreTimeout):
            await store.enqueue("Waits")
        # At its call_timeout (0.5 s), not later: the transaction it waits for is this
        # task's own, so without the bound it would wait for ever (5: far from both).
        assert 0.45 < trio.current_time() - began < 5


HOT_PATH = """
import asyncio, sys
import trio
import trioworker
from trioworker import Registry, Settings, Worker, open_store

policy, new_loop = asyncio.get_event_loop_policy(), asyncio.new_event_loop
seen = []
registry = Registry()

@registry.handler("Beat")
async def beat(item, ctx):
    await trio.sleep(0.8)  # a heartbeat or two

class Counting(trioworker.PostgresStore):
    async def heartbeat_many(self, *args):
        seen.append("heartbeat")
        return await super().heartbeat_many(*args)

async def main():
    settings = Settings(lease=2, heartbeat=0.3, poll=0.2, stop_grace=0.5)
    async with open_store(sys.argv[1]) as client:
        item = await client.enqueue("Beat")
    store = Counting(sys.argv[1])
    await store.open()
    try:
        async with trio.open_nursery() as nursery:
            worker = Worker(store, registry, settings, worker_id="hot", fail_stop=print)
            await nursery.start(worker.run)
            with trio.fail_after(20):
                while (await store.get_item(item.id)).status.value != "Succeeded":
                    await trio.sleep(0.1)
            worker.stop()
    finally:
        await store.close()

trio.run(main)
print("heartbeats", len(seen))
print("trio_asyncio imported", "trio_asyncio" in sys.modules)
print("asyncio untouched", asyncio.get_event_loop_policy() is policy
      and asyncio.new_event_loop is new_loop)

async def asyncio_application():
    async with trioworker.AsyncClient(sys.argv[1]) as client:
        await client.enqueue("FromAsyncio")
    return type(asyncio.get_running_loop()).__module__

print("asyncio application on", asyncio.run(asyncio_application()))
"""


def test_a_worker_claims_heartbeats_and_finishes_without_trio_asyncio(dsn: str) -> None:
    """In a fresh interpreter, a Worker over the PostgreSQL store claims an item,
    heartbeats and finishes it: trio-asyncio is never imported, asyncio's policy is
    left alone, and an asyncio application using AsyncClient in the same process
    afterwards runs on asyncio's own loop."""
    done = subprocess.run(
        [sys.executable, "-c", HOT_PATH, dsn], capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert int(lines[0].split()[-1]) >= 1, done.stdout  # at least one heartbeat
    assert lines[1:] == [
        "trio_asyncio imported False",
        "asyncio untouched True",
        "asyncio application on asyncio.unix_events",
    ], done.stdout


ASYNCIO_IN_A_HANDLER = """
import psycopg  # first, as an application may: its waits bind asyncio's get_running_loop
import sys
import trio
from trioworker import AsyncClient
from trioworker._worker.asyncio_loop import AsyncioLoop

async def enqueue_from_asyncio(dsn):
    async with AsyncClient(dsn) as client:
        return (await client.enqueue("FromAsyncio")).id

async def main():
    async with trio.open_nursery() as nursery:
        aio = AsyncioLoop(nursery)
        with trio.fail_after(10):
            print(await aio.run(enqueue_from_asyncio, sys.argv[1]) > 0)
        aio.close()

trio.run(main)
"""


def test_an_asyncio_library_runs_through_the_asyncio_loop(dsn: str, pg: Conn) -> None:
    """AsyncClient (psycopg's asyncio API, an asyncio-only library as far as Trio is
    concerned) called through AsyncioLoop.run from Trio, psycopg imported first."""
    done = subprocess.run(
        [sys.executable, "-c", ASYNCIO_IN_A_HANDLER, dsn],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]
    assert pg.execute("SELECT kind FROM work_items").fetchall() == [("FromAsyncio",)]
