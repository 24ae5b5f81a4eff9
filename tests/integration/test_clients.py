"""`Client` and `AsyncClient` on real PostgreSQL: in and out of the caller's transaction,
at READ COMMITTED and SERIALIZABLE, with a Worker running what they enqueue; and Trio
staying the Worker's world (`open_store` under asyncio, psycopg imported first).

The asyncio client runs on a plain asyncio loop (`asyncio.Runner` with a selector
loop), as an asyncio application's would, not on trio-asyncio's.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
import trio

from tests.support.processes import wait_for
from trioworker import (
    AsyncClient,
    CancelOutcome,
    Client,
    InvalidWorkItem,
    NewItem,
    Registry,
    Settings,
    Status,
    StoreError,
    Worker,
    WorkItem,
    open_store,
)
from trioworker._postgres.queries import WRITTEN as QUERIES

T = TypeVar("T")
Conn = psycopg.Connection[Any]
ISOLATION = [psycopg.IsolationLevel.READ_COMMITTED, psycopg.IsolationLevel.SERIALIZABLE]
SUCCEEDED = "SELECT count(*) FROM work_items WHERE status = 'Succeeded'"
SHORT = Settings(lease=4, heartbeat=1, poll=0.5, stop_grace=1, recovery_every=0.5)


def run_asyncio(make: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on a plain asyncio loop, as an asyncio application would."""

    async def main() -> T:
        return await make()

    with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
        return runner.run(main())


@pytest.fixture
def client(dsn: str) -> Iterator[Client]:
    with Client(dsn) as client:
        yield client


def statuses(pg: Conn) -> dict[int, str]:
    return dict(pg.execute("SELECT id, status FROM work_items ORDER BY id").fetchall())  # type: ignore[arg-type]


def fail_one(pg: Conn, client: Client) -> int:
    """An item Failed by its only attempt (the transitions run as a Worker runs them)."""
    id = client.enqueue("A").id
    claim = {"worker_id": "w", "lease": 30, "limit": 1, "kinds": ["A"], "scopes": None}
    pg.execute(QUERIES["claim"], {**claim, "unscoped": True})
    finish = {"ids": [id], "attempts": [1], "status": "Failed", "reason": "boom"}
    pg.execute(QUERIES["finish"], {**finish, "error": "E", "wait": True, "traceback": None})
    assert statuses(pg)[id] == "Failed"
    return id


# -- the sync client -------------------------------------------------------------------


@pytest.mark.parametrize("isolation", ISOLATION, ids=["read-committed", "serializable"])
def test_client_writes_in_the_callers_transaction_only_if_it_commits(
    dsn: str, pg: Conn, client: Client, isolation: psycopg.IsolationLevel
) -> None:
    """enqueue (after another item too), enqueue_many, cancel, retry and pause in the
    caller's transaction: rolled back, none of it happened; committed, all of it did,
    and reads inside the transaction see its own writes."""
    failed = fail_one(pg, client)
    queued = client.enqueue("A", scope="s").id
    before = statuses(pg)
    with psycopg.connect(dsn) as conn:
        conn.isolation_level = isolation
        for outcome in ("rollback", "commit"):
            with conn.transaction(force_rollback=outcome == "rollback"):
                new = client.enqueue("B", scope="t", payload={"n": 1}, priority=5, conn=conn)
                many = client.enqueue_many([NewItem("B"), NewItem("B", scope="u")], conn=conn)
                child = client.enqueue("C", after=[new.id], conn=conn)
                [grandchild] = client.enqueue_many([NewItem("C", after=[child.id])], conn=conn)
                assert client.cancel(queued, conn=conn) is CancelOutcome.CANCELLED
                assert client.retry([failed], conn=conn) == [failed]
                assert client.pause(scope="t", conn=conn)
                shown = client.show(new.id, conn=conn)
                assert shown is not None and shown.item.payload == {"n": 1}
                assert client.get_item(queued, conn=conn).status is Status.CANCELLED  # type: ignore[union-attr]
                assert [p.scope for p in client.pauses(conn=conn)] == ["t"]
                assert client.status(conn=conn).counts.by_kind["B"]["Queued"] == 3
            if outcome == "rollback":
                assert statuses(pg) == before
                assert client.get_item(new.id) is None and client.pauses() == []
    after = statuses(pg)
    assert after[queued] == "Cancelled" and after[failed] == "Queued"
    assert [after[i] for i in (new.id, *(e.id for e in many))] == ["Queued"] * 3
    assert [after[child.id], after[grandchild.id]] == ["Waiting", "Waiting"]
    assert [p.scope for p in client.pauses()] == ["t"]
    assert client.resume(scope="t") and client.pauses() == []


def test_client_outside_a_transaction_commits_each_call(pg: Conn, client: Client) -> None:
    """Without conn=, each call commits on the client's own connections, and reads see it."""
    item = client.enqueue("A", dedup_key="k", run_after=dt.timedelta(hours=1))
    assert client.enqueue("A", dedup_key="k").deduplicated
    assert statuses(pg) == {item.id: "Queued"}
    assert client.pause(kind="A") and not client.pause(kind="A")
    assert client.resume(kind="A") and not client.resume(kind="A")
    assert client.cancel(item.id) is CancelOutcome.CANCELLED
    assert client.cancel(item.id) is CancelOutcome.ALREADY_FINISHED
    assert client.cancel(10**9) is CancelOutcome.NOT_FOUND
    assert client.retry([item.id]) == [item.id]
    assert client.failed_items() == [] and client.schedules() == []
    shown = client.show(item.id)
    assert shown is not None and shown.item.status is Status.QUEUED
    assert client.queue_counts().by_kind["A"]["Queued"] == 1


def test_client_checks_input_as_the_trio_store_does_and_raises_its_errors(
    client: Client, pg: Conn
) -> None:
    """Bad input is InvalidWorkItem before anything is sent; a database refusal is a
    StoreError; a missing schema is SchemaNotReady. Nothing is written."""
    with pytest.raises(InvalidWorkItem, match="scope must not be empty"):
        client.enqueue("A", scope="")
    with pytest.raises(InvalidWorkItem, match="give exactly one"):
        client.pause(kind="A", scope="s")
    with pytest.raises(InvalidWorkItem, match="item 1: priority 5000 is outside"):
        client.enqueue_many([NewItem("A"), NewItem("A", priority=5000)])
    client.known_kinds = frozenset({"A"})
    with pytest.raises(InvalidWorkItem, match="unknown kind 'B'"):
        client.enqueue("B")
    assert statuses(pg) == {}


def test_a_conflict_in_the_callers_serializable_transaction_says_it_is_theirs_to_retry(
    dsn: str, client: Client
) -> None:
    """Two SERIALIZABLE transactions that each read what the other writes: the loser's
    call raises a StoreError saying to retry the transaction, its cause psycopg's
    SerializationFailure."""
    with psycopg.connect(dsn) as one, psycopg.connect(dsn) as two:
        for conn in (one, two):
            conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
            conn.execute("SELECT count(*) FROM work_items WHERE kind = 'A'").fetchone()
        client.enqueue("A", conn=one)
        client.enqueue("A", conn=two)
        one.commit()
        with pytest.raises(StoreError, match=r"retry it\)$") as caught:
            client.enqueue("A", conn=two)
            two.commit()
        assert isinstance(caught.value.__cause__, psycopg.errors.SerializationFailure)


# -- the asyncio client ----------------------------------------------------------------


@pytest.mark.parametrize("isolation", ISOLATION, ids=["read-committed", "serializable"])
def test_async_client_writes_in_the_callers_transaction_only_if_it_commits(
    dsn: str, pg: Conn, isolation: psycopg.IsolationLevel
) -> None:
    """As the sync client does, on psycopg's asyncio API."""
    with Client(dsn) as sync:
        failed = fail_one(pg, sync)
        queued = sync.enqueue("A", scope="s").id
    before = statuses(pg)

    async def main() -> list[int]:
        async with AsyncClient(dsn) as client:
            conn = await psycopg.AsyncConnection.connect(dsn)
            await conn.set_isolation_level(isolation)
            async with conn:
                made: list[int] = []
                for outcome in ("rollback", "commit"):
                    async with conn.transaction(force_rollback=outcome == "rollback"):
                        new = await client.enqueue("B", scope="t", payload=[1], conn=conn)
                        many = await client.enqueue_many([NewItem("B")], conn=conn)
                        child = await client.enqueue("C", after=[new.id], conn=conn)
                        assert await client.cancel(queued, conn=conn) is CancelOutcome.CANCELLED
                        assert await client.retry([failed], conn=conn) == [failed]
                        assert await client.pause(kind="B", conn=conn)
                        shown = await client.show(new.id, conn=conn)
                        assert shown is not None and shown.item.payload == [1]
                        assert len(await client.pauses(conn=conn)) == 1
                        counts = (await client.status(conn=conn)).counts
                        assert counts.by_kind["B"]["Queued"] == 2
                    if outcome == "rollback":
                        assert statuses(pg) == before
                        assert await client.get_item(new.id) is None
                        assert await client.pauses() == []
                    made = [new.id, many[0].id, child.id]
                assert await client.resume(kind="B")
                return made

    made = run_asyncio(main)
    after = statuses(pg)
    assert after[queued] == "Cancelled" and after[failed] == "Queued"
    assert [after[i] for i in made] == ["Queued", "Queued", "Waiting"]


def test_async_client_outside_a_transaction_and_on_the_applications_pool(
    dsn: str, pg: Conn
) -> None:
    """Without conn=, on its own pool, or on the application's pool given as pool=."""
    from psycopg_pool import AsyncConnectionPool

    async def main() -> None:
        async with AsyncClient(dsn) as client:
            item = await client.enqueue("A", dedup_key="k")
            assert (await client.enqueue("A", dedup_key="k")).deduplicated
            assert await client.cancel(item.id) is CancelOutcome.CANCELLED
            assert await client.retry([item.id]) == [item.id]
            assert await client.failed_items() == []
        async with AsyncConnectionPool(dsn, open=False) as pool:
            client = AsyncClient(pool=pool)
            await client.enqueue("B")
            assert (await client.queue_counts()).by_kind["B"]["Queued"] == 1
            await client.close()  # leaves the application's pool open
            assert not pool.closed

    run_asyncio(main)
    assert sorted(statuses(pg).values()) == ["Queued", "Queued"]


# -- a Worker runs what they enqueue ---------------------------------------------------


async def test_a_worker_runs_what_both_clients_enqueue(dsn: str, pg: Conn) -> None:
    """Items from Client and AsyncClient (each from its own thread, as the programs that
    produce work run), one in a committed transaction, run on a Trio Worker and
    succeed; the one in a rolled-back transaction never existed."""
    registry = Registry()
    ran: list[tuple[str | None, Any]] = []
    done = trio.Event()

    @registry.handler("Make")
    async def make(item: WorkItem, ctx: object) -> None:
        ran.append((item.scope, item.payload))
        if len(ran) == 3:
            done.set()

    def produce() -> None:
        with Client(dsn) as client:
            client.enqueue("Make", scope="sync", payload={"from": "Client"})
            with psycopg.connect(dsn) as conn:
                client.enqueue("Make", scope="tx", payload={"from": "Client in tx"}, conn=conn)
            with psycopg.connect(dsn) as conn:
                client.enqueue("Make", scope="gone", conn=conn)
                conn.rollback()

        async def produce_async() -> None:
            async with AsyncClient(dsn) as client:
                await client.enqueue("Make", scope="async", payload={"from": "AsyncClient"})

        run_asyncio(produce_async)

    async with open_store(dsn) as store, trio.open_nursery() as nursery:
        worker = Worker(store, registry, SHORT, worker_id="w", fail_stop=lambda: None)
        await nursery.start(worker.run)
        await trio.to_thread.run_sync(produce)
        with trio.fail_after(20):
            await done.wait()

        def all_succeeded() -> bool:
            return pg.execute(SUCCEEDED).fetchone() == (3,)

        await trio.to_thread.run_sync(wait_for, all_succeeded, 20, "all three to succeed")
        nursery.cancel_scope.cancel()
    assert sorted(ran) == [
        ("async", {"from": "AsyncClient"}),
        ("sync", {"from": "Client"}),
        ("tx", {"from": "Client in tx"}),
    ]
    rows = pg.execute("SELECT scope, status FROM work_items ORDER BY scope").fetchall()
    assert rows == [("async", "Succeeded"), ("sync", "Succeeded"), ("tx", "Succeeded")]


# -- Trio stays the Worker's world -----------------------------------------------------

ASYNCIO_OPEN_STORE = """
import asyncio, sys, trioworker

async def main():
    async with trioworker.open_store(sys.argv[1]) as store:
        await store.enqueue("Cleanup")

try:
    asyncio.run(main())
except trioworker.ConfigurationError as exc:
    print(exc)
"""

PSYCOPG_FIRST = """
import psycopg  # before trioworker, as web applications do
import sys, trio
import trioworker

async def main():
    async with trioworker.open_store(sys.argv[1], call_timeout=5) as store:
        item = await store.enqueue("Cleanup")
        print((await store.get_item(item.id)).status.value)

trio.run(main)
"""


def python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh interpreter (nothing imported before it)."""
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=60
    )


def test_open_store_under_asyncio_raises_a_clear_error_naming_the_clients(dsn: str) -> None:
    """`asyncio.run` of a program opening the Trio store: a ConfigurationError that
    names AsyncClient (and Client), at once, not a TrioInternalError. At once: before
    any connection, so a DSN nothing answers at gives the same error, not a
    connection's failure or a timeout."""
    for target in (dsn, "postgresql://postgres@127.0.0.1:1/nothing?connect_timeout=60"):
        done = python(ASYNCIO_OPEN_STORE, target)
        assert done.returncode == 0, done.stderr
        assert "open_store runs under Trio" in done.stdout, (target, done.stdout, done.stderr)
        assert "use trioworker.AsyncClient" in done.stdout and "trioworker.Client" in done.stdout
        assert "TrioInternalError" not in done.stderr


def test_importing_psycopg_before_trioworker_works(dsn: str) -> None:
    """psycopg imported first binds asyncio's get_running_loop before trio-asyncio patches
    it (psycopg/waiting.py); the store still answers, well within its 5 s call bound."""
    done = python(PSYCOPG_FIRST, dsn)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Queued"]
    assert "StoreTimeout" not in done.stderr and "no running event loop" not in done.stderr


def test_importing_trioworker_leaves_asyncio_applications_on_asyncio_s_own_loop() -> None:
    """trio-asyncio, which replaces asyncio's loop policy, is imported only when the Trio
    store is opened: an asyncio application importing trioworker keeps its own loop."""
    done = python(
        "import asyncio, trioworker\n"
        "async def main(): print(type(asyncio.get_running_loop()).__module__)\n"
        "asyncio.run(main())\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["asyncio.unix_events"]
