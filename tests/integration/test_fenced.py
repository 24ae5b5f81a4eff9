"""Handlers' fenced transactions (`ctx.transaction()`) on real PostgreSQL."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from tests.support.processes import ROOT, wait_for, worker_pids
from tests.support.stores import RecoveryPassStore, opened
from trioworker import (
    Context,
    DatabaseUnavailable,
    Lost,
    PostgresStore,
    Registry,
    SelfStopped,
    Settings,
    Status,
    Worker,
    WorkItem,
)
from trioworker._core.model import Heartbeat

Conn = psycopg.Connection[Any]
THUMBNAILS = "CREATE TABLE thumbnails (item_id bigint, attempt int)"


async def until(check: Any, what: str, seconds: float = 10) -> None:
    """Poll `check()` (sync or async) until true: the database has no event to wait on."""
    with trio.move_on_after(seconds):
        while True:
            result = check()
            if hasattr(result, "__await__"):
                result = await result
            if result:
                return
            await trio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def status_is(store: PostgresStore, id: int, *statuses: Status) -> bool:
    state = await store.get_item(id)
    return state is not None and state.status in statuses


def status(pg: Conn, id: int) -> str | None:
    row = pg.execute("SELECT status FROM work_items WHERE id = %s", [id]).fetchone()
    return None if row is None else str(row[0])


def thumbnails(pg: Conn) -> list[tuple[int, int]]:
    return [(r[0], r[1]) for r in pg.execute("SELECT * FROM thumbnails ORDER BY 1, 2")]


async def take_over(store: PostgresStore, pg: Conn, id: int) -> WorkItem:
    """Another attempt takes the item: its lease runs out, recovery requeues it, and
    a second Worker claims it."""
    pg.execute("UPDATE work_items SET lease_expires_at = now() - interval '1s' WHERE id = %s", [id])
    assert [r.id for r in await store.recover_expired_leases(max_stalls=3)] == [id]
    item = await store.claim("other", 60, kinds=["K"])
    assert item is not None and item.id == id
    return item


async def test_a_fenced_transaction_of_a_lost_attempt_writes_nothing_and_raises_lost(
    store: PostgresStore, pg: Conn
) -> None:
    """After another attempt took the item, the old attempt's transaction raises Lost
    as it begins: its writes never happen, and the item stays the new attempt's."""
    pg.execute(THUMBNAILS)
    await store.enqueue("K", scope="s")
    first = await store.claim("w", 60, kinds=["K"])
    assert first is not None
    second = await take_over(store, pg, first.id)
    with pytest.raises(Lost):
        async with store.fenced_transaction(first.id, first.attempt) as tx:
            await tx.execute("INSERT INTO thumbnails VALUES (%s, %s)", [first.id, 1])
    async with store.fenced_transaction(second.id, second.attempt) as tx:
        await tx.execute("INSERT INTO thumbnails VALUES (%s, %s)", [second.id, 2])
    assert thumbnails(pg) == [(first.id, 2)]
    state = await store.get_item(first.id)
    assert state and (state.status, state.worker_id) == (Status.RUNNING, "other")


async def test_a_fenced_transaction_holds_the_item_against_recovery(
    store: PostgresStore, pg: Conn
) -> None:
    """While the transaction is open, recovery cannot take the item even with its lease
    run out (the row is locked), so the writes commit under the attempt that owns it."""
    pg.execute(THUMBNAILS)
    await store.enqueue("K")
    item = await store.claim("w", 60, kinds=["K"])
    assert item is not None
    pg.execute("UPDATE work_items SET lease_expires_at = now() - interval '1s'")
    async with store.fenced_transaction(item.id, item.attempt) as tx:
        await tx.execute("INSERT INTO thumbnails VALUES (%s, %s)", [item.id, item.attempt])
        with trio.fail_after(5):
            assert await store.recover_expired_leases(max_stalls=3) == []
    assert thumbnails(pg) == [(item.id, 1)]


async def test_a_handler_that_lost_its_item_sees_lost_and_the_worker_writes_nothing(
    dsn: str, store: PostgresStore, pg: Conn
) -> None:
    """A handler's item is taken over while it runs; its fenced transaction raises Lost,
    and its Worker writes nothing for the attempt (no failure, no completion)."""
    pg.execute(THUMBNAILS)
    registry = Registry()
    running, taken = trio.Event(), trio.Event()
    seen: list[BaseException] = []

    @registry.handler("K")
    async def handler(item: WorkItem, ctx: Context) -> None:
        running.set()
        await taken.wait()
        try:
            async with ctx.transaction() as tx:
                await tx.execute("INSERT INTO thumbnails VALUES (%s, %s)", [item.id, 9])
        except Lost as exc:
            seen.append(exc)
            raise

    item = await store.enqueue("K", scope="s")
    settings = Settings(lease=60, heartbeat=20, poll=0.5, recovery_every=3600)
    async with opened(RecoveryPassStore(dsn)) as worker_store:
        worker = Worker(worker_store, registry, settings, worker_id="w", fail_stop=pytest.fail)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(10):
                await running.wait()
                await worker_store.first_pass.wait()
            await take_over(store, pg, item.id)
            taken.set()
            await until(lambda: not worker.statistics().running, "the attempt to end")
            worker.stop()
    assert len(seen) == 1 and thumbnails(pg) == []
    state = await store.get_item(item.id)
    assert state and (state.status, state.worker_id, state.failures) == (Status.RUNNING, "other", 0)


async def test_a_handler_that_completes_in_its_transaction_is_succeeded_with_its_rows(
    store: PostgresStore, pg: Conn
) -> None:
    """tx.complete(): the item is Succeeded in the same commit as the handler's rows, and
    the Worker writes nothing more (its own complete would be the second write)."""
    pg.execute(THUMBNAILS)
    registry = Registry()
    from tests.apps.fenced import thumbnail

    registry.handler("Thumbnail")(thumbnail)
    item = await store.enqueue("Thumbnail", payload={})
    worker = Worker(store, registry, Settings(poll=0.5), worker_id="w", fail_stop=pytest.fail)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await until(lambda: status_is(store, item.id, Status.SUCCEEDED), "Succeeded")
        worker.stop()
    assert thumbnails(pg) == [(item.id, 1)]
    assert worker.statistics().events.get("complete", 0) == 0  # no second write


def test_a_worker_killed_right_after_the_commit_leaves_the_item_succeeded_once(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """A Worker process whose handler completes in its transaction and is SIGKILLed
    right after the commit: its success is durable. A Worker started afterwards runs
    nothing again: once the lease runs out, its lease recovery finishes the item
    Succeeded (no stall), with the handler's row written once."""
    pg.execute(THUMBNAILS)
    item = pg.execute(
        "INSERT INTO work_items (kind, payload)"
        " VALUES ('Thumbnail', '{\"die_after_commit\": true}') RETURNING id"
    ).fetchone()
    assert item is not None
    app = "tests.apps.fenced:registry"
    run = [sys.executable, "-m", "trioworker", "--dsn", dsn, "run", "--app", app,
           "--lease", "4", "--heartbeat", "1", "--poll", "0.5"]  # fmt: skip
    killed = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert killed.returncode == -9, killed.stderr
    with subprocess.Popen(run, cwd=ROOT, stderr=subprocess.PIPE, text=True) as again:
        try:
            wait_for(
                lambda: (
                    pg.execute(
                        "SELECT count(*) FROM work_workers"
                        " WHERE stopped_at IS NULL AND pid = ANY(%s)",
                        [worker_pids(again.pid)],
                    ).fetchone()
                    == (1,)
                ),
                30,
                "the second Worker to start",
            )
            # The lease (4 s) runs out; its recovery (every second) finishes the item.
            wait_for(
                lambda: status(pg, item[0]) == "Succeeded", 30, "lease recovery to finish the item"
            )
            # The Worker claims after that: a later item runs. Item 1, first in claim
            # order, would have been claimed first had it been claimable again.
            later = pg.execute(
                "INSERT INTO work_items (kind, payload) VALUES ('Thumbnail', '{}') RETURNING id"
            ).fetchone()
            assert later is not None
            wait_for(lambda: status(pg, later[0]) == "Succeeded", 30, "a later item to run")
        finally:
            again.terminate()
    row = pg.execute(
        "SELECT status, attempt, stalls, completed_at IS NOT NULL FROM work_items WHERE id = %s",
        item,
    ).fetchone()
    assert row == ("Succeeded", 1, 0, True)
    assert thumbnails(pg) == [(item[0], 1), (later[0], 1)]


class CutStore(PostgresStore):
    """Heartbeats fail once `cut` is set, as on a link that went dead; everything else
    (the fenced transaction too) still reaches PostgreSQL."""

    cut = False

    async def heartbeat_many(
        self, attempts: Sequence[tuple[int, int]], lease: float
    ) -> dict[tuple[int, int], Heartbeat]:
        if self.cut:
            raise DatabaseUnavailable("heartbeat: the link is cut (simulated)")
        return await super().heartbeat_many(attempts, lease)


@asynccontextmanager
async def cut_off(
    dsn: str, store: PostgresStore, registry: Registry, fail_stop: Callable[[str], Any]
) -> AsyncIterator[tuple[Worker, int]]:
    """A Worker (lease 4 s) over a CutStore running `registry`'s K item, enqueued in
    scope s, whose heartbeats are cut once it has claimed it; the Worker and the item's
    id. At the block's end, once the attempt has ended, the Worker is cancelled."""
    async with opened(CutStore(dsn)) as cut_store:
        item = await store.enqueue("K", scope="s")
        settings = Settings(lease=4, heartbeat=1, poll=0.5, stop_grace=0.9)
        worker = Worker(cut_store, registry, settings, worker_id="w", fail_stop=fail_stop)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await until(lambda: status_is(store, item.id, Status.RUNNING), "the claim")
            cut_store.cut = True
            yield worker, item.id
            await until(lambda: not worker.statistics().running, "the attempt to end")
            nursery.cancel_scope.cancel()


async def test_a_self_stopped_attempt_writes_nothing_through_its_transaction(
    dsn: str, store: PostgresStore, pg: Conn
) -> None:
    """The heartbeats stop getting through: the attempt self-stops at lease/2. Its
    handler ignores the cancel for a moment, the item is taken over meanwhile, and the
    handler's fenced write after the cut raises Lost and writes nothing."""
    pg.execute(THUMBNAILS)
    registry = Registry()
    stopped, taken = trio.Event(), trio.Event()
    seen: list[BaseException] = []
    failstops: list[str] = []

    @registry.handler("K")
    async def handler(item: WorkItem, ctx: Context) -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            stopped.set()
            with trio.CancelScope(shield=True), trio.fail_after(60):
                await taken.wait()
                try:
                    async with ctx.transaction() as tx:
                        await tx.execute("INSERT INTO thumbnails VALUES (%s, %s)", [item.id, 1])
                except Lost as exc:
                    seen.append(exc)
            raise

    async with cut_off(dsn, store, registry, failstops.append) as (worker, item_id):
        with trio.fail_after(10):
            await stopped.wait()
        await take_over(store, pg, item_id)
        taken.set()
    assert len(seen) == 1 and thumbnails(pg) == []
    assert worker.statistics().events.get("self_stopped") == 1
    state = await store.get_item(item_id)
    assert state and (state.status, state.worker_id, state.failures) == (Status.RUNNING, "other", 0)
    logging.getLogger(__name__).info("fail-stops while the handler held on: %s", failstops)


async def test_a_fenced_transaction_opens_and_commits_only_before_its_deadline(
    store: PostgresStore, pg: Conn
) -> None:
    """`until` passed: SelfStopped (a Lost) before anything is opened. Passing while
    the transaction is open: SelfStopped at its end, and the handler's own rows and the
    completion are rolled back. Moved on meanwhile (a heartbeat succeeded): the same
    transaction commits."""
    pg.execute(THUMBNAILS)
    await store.enqueue("K", scope="s")
    item = await store.claim("w", 60, kinds=["K"])
    assert item is not None
    with pytest.raises(SelfStopped):
        async with store.fenced_transaction(
            item.id, item.attempt, until=lambda: trio.current_time() - 1.0
        ):
            raise AssertionError("opened past the deadline")  # pragma: no cover
    deadline = [trio.current_time() + 0.5]
    with pytest.raises(SelfStopped):
        async with store.fenced_transaction(item.id, item.attempt, until=lambda: deadline[0]) as tx:
            await tx.execute("INSERT INTO thumbnails VALUES (%s, %s)", [item.id, 1])
            tx.complete()
            await trio.sleep(0.6)
    assert thumbnails(pg) == []
    state = await store.get_item(item.id)
    assert state and (state.status, state.completed_at) == (Status.RUNNING, None)
    deadline = [trio.current_time() + 0.5]
    async with store.fenced_transaction(item.id, item.attempt, until=lambda: deadline[0]) as tx:
        await tx.execute("INSERT INTO thumbnails VALUES (%s, %s)", [item.id, 2])
        tx.complete()
        deadline[0] += 60
        await trio.sleep(0.6)
    assert thumbnails(pg) == [(item.id, 2)]
    state = await store.get_item(item.id)
    assert state and state.status is Status.RUNNING and state.completed_at is not None


async def test_a_shielded_handler_past_its_self_stop_commits_nothing(
    dsn: str, store: PostgresStore, pg: Conn
) -> None:
    """Issue 31, defect 8: the heartbeats stop getting through and the attempt
    self-stops at lease/2; its handler, shielded, then runs a completing transaction
    while the item is still its own (no one has taken it over). The transaction is
    refused with SelfStopped: no row, no success, and the Worker writes nothing, as it
    logs; lease recovery requeues the item as a stall."""
    pg.execute(THUMBNAILS)
    registry = Registry()
    seen: list[BaseException] = []

    @registry.handler("K")
    async def handler(item: WorkItem, ctx: Context) -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                try:
                    async with ctx.transaction() as tx:
                        await tx.execute("INSERT INTO thumbnails VALUES (%s, %s)", [item.id, 1])
                        tx.complete()
                except SelfStopped as exc:
                    seen.append(exc)

    async with cut_off(dsn, store, registry, pytest.fail) as (worker, item_id):
        await until(lambda: seen, "the handler's transaction after the self-stop")
    assert len(seen) == 1 and thumbnails(pg) == []
    assert worker.statistics().events.get("self_stopped") == 1
    state = await store.get_item(item_id)
    assert state and (state.status, state.attempt, state.completed_at) == (Status.RUNNING, 1, None)
    pg.execute("UPDATE work_items SET lease_expires_at = now() - interval '1s'")
    [recovered] = await store.recover_expired_leases(max_stalls=3)
    assert (recovered.status, recovered.stalls) == (Status.QUEUED, 1)
