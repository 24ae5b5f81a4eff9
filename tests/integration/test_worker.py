"""Workers on real PostgreSQL in real time, with short settings (lease 4 s, heartbeat 1 s)."""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
import trio_asyncio

from examples.media._observer import overlaps
from tests.integration.test_cli import trioworker
from tests.support.fault_proxy import FaultProxy
from tests.support.lines import running_per_scope
from tests.support.processes import attempt_spans, observed, wait_for, workers
from trioworker import (
    Context,
    PostgresStore,
    Registry,
    Settings,
    Status,
    StoreTimeout,
    Worker,
    WorkItem,
    open_store,
)
from trioworker._core.model import Heartbeat

SHORT = Settings(lease=4, heartbeat=1, poll=1, stop_grace=1, recovery_every=0.5)
#: psycopg's own cancel of a query on a dead link: cancel_safe(timeout=5) inside the
#: asyncio task, ~10.5 s (docs PITFALLS), which the store must not wait for.
PSYCOPG_CANCEL_PATH = 10.5
FAST = ["--lease", "4", "--heartbeat", "1", "--poll", "1", "--stop-grace", "1"]
Conn = psycopg.Connection[Any]


def target_of(dsn: str) -> tuple[str, int]:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    return str(params.get("host", "127.0.0.1")), int(params.get("port", 5432))


class TimedStore(PostgresStore):
    """Records every heartbeat's duration, and every write after a claim."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, call_timeout=10.0)
        self.heartbeat_spans: list[float] = []
        self.writes: list[str] = []

    async def heartbeat_many(
        self, attempts: Sequence[tuple[int, int]], lease: float
    ) -> dict[tuple[int, int], Heartbeat]:
        begun = trio.current_time()
        try:
            return await super().heartbeat_many(attempts, lease)
        finally:
            self.heartbeat_spans.append(trio.current_time() - begun)

    async def complete_batch(self, attempts: Sequence[tuple[int, int]]) -> set[int]:
        self.writes.append("complete")
        return await super().complete_batch(attempts)

    async def fail(self, id: int, attempt: int, reason: str, error: str | None = None) -> bool:
        self.writes.append("fail")
        return await super().fail(id, attempt, reason, error)


@pytest.mark.alone
async def test_a_blackholed_worker_stops_itself_and_another_worker_finishes_the_item(
    dsn: str, pg: Conn
) -> None:
    """Cut one Worker's link mid-handler (no socket closed): its handler is cancelled
    within lease/2 + 0.5 s, every heartbeat call returns within one interval, a second
    Worker reclaims the item after the lease expires and completes it: Succeeded,
    stalls = 1, never Failed. The self-stop's deadline and the heartbeat's interval
    are its property, bounds in seconds from SHORT: it runs alone
    (tests/support/alone.py), no other test competing for the cores.
    """
    registry = Registry()
    events: list[tuple[str, str, float]] = []
    running, finished = trio.Event(), trio.Event()

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        events.append(("start", ctx.worker_id, trio.current_time()))
        if ctx.worker_id == "cut-off":
            running.set()
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                events.append(("cancelled", ctx.worker_id, trio.current_time()))
                raise
        await trio.sleep(0.2)
        events.append(("end", ctx.worker_id, trio.current_time()))
        finished.set()

    proxy = FaultProxy(*target_of(dsn))
    async with trio_asyncio.open_loop(), open_store(dsn) as healthy_store:
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.run)
            cut_store = TimedStore(proxy.dsn(dsn))
            await cut_store.open()
            cut_off = Worker(cut_store, registry, SHORT, worker_id="cut-off", fail_stop=pytest.fail)
            await nursery.start(cut_off.run)
            item = await healthy_store.enqueue("Crawl", scope="7")
            with trio.fail_after(10):
                await running.wait()
            await trio.sleep(1.5)  # a heartbeat or two succeed first
            cut_at = trio.current_time()
            proxy.blackhole()
            rescuer = Worker(
                healthy_store, registry, SHORT, worker_id="rescuer", fail_stop=pytest.fail
            )
            await nursery.start(rescuer.run)
            with trio.fail_after(20):
                await finished.wait()
            proxy.heal()
            await trio.sleep(2)  # the cut-off Worker is back: it must still write nothing
            state = await healthy_store.get_item(item.id)
            nursery.cancel_scope.cancel()
        await cut_store.close()

    cancelled = [t for kind, who, t in events if kind == "cancelled"]
    assert len(cancelled) == 1
    assert cancelled[0] - cut_at <= SHORT.self_stop_after + 0.5
    assert max(cut_store.heartbeat_spans) <= SHORT.heartbeat + 0.25
    assert [who for kind, who, _ in events if kind == "start"] == ["cut-off", "rescuer"]
    assert state is not None
    assert (state.status, state.stalls, state.attempt, state.failures) == (
        Status.SUCCEEDED,
        1,
        2,
        0,
    )
    assert state.reason is None and state.worker_id == "rescuer"
    assert cut_store.writes == []


async def test_a_store_call_on_a_dead_link_gives_control_back_at_once(dsn: str) -> None:
    """Cancelling a query on a blackholed link returns in well under psycopg's own
    ~10.5 s cancel path, and the call as a whole ends with StoreTimeout (its call
    timeout's error), not after that path. (The bounds are half that path, what a
    loaded machine cannot come near: the cancel returns in about 0.3 s, the call in its
    1.5 s; the test runs beside others, so it does not hold the call to 1.5 s.)"""
    proxy = FaultProxy(*target_of(dsn))
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        async with open_store(proxy.dsn(dsn), call_timeout=1.5) as store:
            await store.enqueue("A")
            proxy.blackhole()
            begun = trio.current_time()
            with trio.move_on_after(0.3):
                await store.enqueue("A")
            assert trio.current_time() - begun < PSYCOPG_CANCEL_PATH / 2
            begun = trio.current_time()
            with pytest.raises(StoreTimeout):
                await store.enqueue("A")
            assert trio.current_time() - begun < PSYCOPG_CANCEL_PATH / 2
            proxy.heal()
            assert (await store.enqueue("B")).id > 0  # the store recovers
        nursery.cancel_scope.cancel()


def test_two_worker_processes_never_overlap_a_scope(dsn: str, pg: Conn, tmp_path: Path) -> None:
    """Two `python -m trioworker run` processes: items of one scope never overlap, while
    items of other scopes and unscoped items run meanwhile."""
    for i in range(24):
        scope = None if i % 4 == 3 else f"s{i % 3}"
        pg.execute(
            "INSERT INTO work_items (kind, scope, payload) VALUES ('Record', %s, %s)",
            (scope, '{"seconds": 0.3}'),
        )
    with workers(tmp_path) as start:
        procs = [start(dsn, *FAST, "--concurrency", "3", name=f"w{n}") for n in range(2)]
        wait_for(
            lambda: (
                pg.execute("SELECT count(*) FROM work_items WHERE status = 'Succeeded'").fetchone()
                == (24,)
            ),
            timeout=60,
            what="all items to succeed",
        )
        for p in procs:
            p.signal(signal.SIGTERM)
        assert [p.wait(timeout=30) for p in procs] == [0, 0], [p.output() for p in procs]
    spans = attempt_spans(tmp_path)
    assert len(spans) == 24 and all(s.end is not None for s in spans)
    assert overlaps(spans) == []
    assert {s.worker for s in spans} == {"w0", "w1"}  # both Workers took work
    # Other scopes and unscoped items ran while a scope's item ran.
    concurrent = [
        (a, b) for a in spans for b in spans
        if a.scope != b.scope and a.end is not None and a.start < b.start < a.end
    ]  # fmt: skip
    assert any(b.scope is None for _, b in concurrent)
    assert any(a.scope is not None and b.scope is not None for a, b in concurrent)


def test_workers_claim_only_their_own_kinds_and_status_names_the_unserved_ones(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """Two Worker processes with different registries over one database (a rolling
    deploy, say): each kind runs only where it has a handler, nothing fails as an
    unknown kind, an item of a kind nobody serves stays Queued, and `status` lists that
    kind and both Workers."""
    for i in range(12):
        kind = "Crawl" if i % 2 else "Purge"
        scope = None if i % 3 == 0 else f"s{i % 2}"  # scopes shared by both kinds
        pg.execute("INSERT INTO work_items (kind, scope) VALUES (%s, %s)", (kind, scope))
    pg.execute("INSERT INTO work_items (kind, scope) VALUES ('Orphan', 's0'), ('Orphan', NULL)")
    with workers(tmp_path) as start:
        crawler = start(dsn, *FAST, name="crawler", app="tests.apps.routing:crawls")
        purger = start(dsn, *FAST, name="purger", app="tests.apps.routing:purges")
        wait_for(
            lambda: (
                pg.execute("SELECT count(*) FROM work_items WHERE status = 'Succeeded'").fetchone()
                == (12,)
            ),
            timeout=60,
            what="every Crawl and Purge to succeed",
        )
        status = trioworker("status", "--json", dsn=dsn)
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)
        for p in (crawler, purger):
            p.signal(signal.SIGTERM)
        assert [p.wait(timeout=30) for p in (crawler, purger)] == [0, 0]
    ran = {(s.kind, s.worker) for s in attempt_spans(tmp_path)}
    assert ran == {("Crawl", "crawler"), ("Purge", "purger")}
    rows = pg.execute(
        "SELECT kind, status, attempt FROM work_items WHERE kind = 'Orphan' ORDER BY id"
    ).fetchall()
    assert rows == [("Orphan", "Queued", 0), ("Orphan", "Queued", 0)]
    assert pg.execute("SELECT count(*) FROM work_items WHERE status = 'Failed'").fetchone() == (0,)
    assert shown["unserved_kinds"] == {"Orphan": 2}
    alive = {w["id"]: w["kinds"] for w in shown["workers"] if w["alive"]}
    assert alive == {"crawler": ["Crawl"], "purger": ["Purge"]}
    stopped = pg.execute("SELECT id FROM work_workers WHERE stopped_at IS NOT NULL ORDER BY id")
    assert stopped.fetchall() == [("crawler",), ("purger",)]


def test_notify_wakes_an_idle_worker_process_well_before_its_poll(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """An idle Worker polling once an hour starts an enqueued item long before: the
    NOTIFY wakes it."""
    insert = "INSERT INTO work_items (kind, payload) VALUES ('Record', '{\"seconds\": 0}')"

    def started() -> int:
        return len([e for e in observed(tmp_path) if e["event"] == "start"])

    with workers(tmp_path) as start:
        worker = start(dsn, "--poll", "3600", name="idle")
        wait_for(lambda: "ready" in worker.output(), timeout=30, what="the worker to be ready")
        # Idle for certain: its first item is Succeeded, so the claim sent along with
        # that completion (one call) came back empty, and the next waits for the poll.
        pg.execute(insert)
        wait_for(lambda: pg.execute("SELECT status FROM work_items").fetchone() == ("Succeeded",),
                 30, "the first item to be Succeeded")  # fmt: skip
        pg.execute(insert)
        wait_for(lambda: started() == 2, 60, "the second item to start, an hour before the poll")
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0


def test_sigterm_drains_then_releases(dsn: str, pg: Conn, tmp_path: Path) -> None:
    """SIGTERM: a short item finishes, a long one is released after the grace period
    (Queued again, no stall), and the process exits 0."""
    with workers(tmp_path) as start:
        worker = start(dsn, *FAST, "--concurrency", "2", "--shutdown-grace", "1.5", name="w")
        pg.execute(
            "INSERT INTO work_items (kind, scope, payload) VALUES"
            " ('Record', 'a', '{\"seconds\": 0.5}'), ('Record', 'b', '{\"seconds\": 120}')"
        )
        wait_for(
            lambda: len([e for e in observed(tmp_path) if e["event"] == "start"]) == 2,
            timeout=20,
            what="both items to start",
        )
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=20) == 0, worker.output()
    rows = pg.execute(
        "SELECT scope, status, stalls, attempt FROM work_items ORDER BY scope"
    ).fetchall()
    assert rows == [("a", "Succeeded", 0, 1), ("b", "Queued", 0, 1)]
    assert "cancelling and releasing 1 item" in worker.output()


def test_a_second_sigint_exits_at_once(dsn: str, pg: Conn, tmp_path: Path) -> None:
    """SIGINT twice: the Worker exits at once with 130, leaving the item to recovery."""
    with workers(tmp_path) as start:
        worker = start(dsn, *FAST, "--shutdown-grace", "600", name="w")
        pg.execute("INSERT INTO work_items (kind, payload) VALUES ('Record', '{\"seconds\": 900}')")
        wait_for(lambda: observed(tmp_path), timeout=20, what="the item to start")
        worker.signal(signal.SIGINT)
        wait_for(lambda: "stopping: no new claims" in worker.output(), 20, "the first SIGINT")
        worker.signal(signal.SIGINT)
        # At once, not after its shutdown grace (600 s): exit 130 (a drain would be 0),
        # and the item still Running (a drain would have released it, Queued).
        assert worker.wait(timeout=60) == 130, worker.output()
    assert pg.execute("SELECT status FROM work_items").fetchone() == ("Running",)


@pytest.mark.alone  # dead before the lease ends: a bound in seconds from SHORT
@pytest.mark.parametrize("kind", ["BlockLoop", "IgnoreCancel"])
def test_a_handler_that_will_not_stop_makes_the_worker_fail_stop(
    dsn: str, pg: Conn, tmp_path: Path, kind: str
) -> None:
    """A handler that blocks the event loop, or swallows its cancel, past the self-stop
    and the stop grace: the process logs why and exits 70 before the item's lease runs
    out, so the OS has ended its writes before another Worker may take the item."""
    with workers(tmp_path) as start:
        # A blocked loop cannot heartbeat at all; IgnoreCancel gets a cancel request. Lease
        # 16 s: the process is dead by half of it + the stop grace + 1 s (10 s after the
        # last heartbeat), 6 s before the lease ends: room for this test to look.
        lease = ["--lease", "16", "--heartbeat", "1", "--poll", "1", "--stop-grace", "1"]
        worker = start(dsn, *lease, name="w")
        pg.execute("INSERT INTO work_items (kind, scope) VALUES (%s, 'x')", (kind,))
        wait_for(lambda: observed(tmp_path), timeout=20, what="the item to start")
        if kind == "IgnoreCancel":
            pg.execute("UPDATE work_items SET cancel_requested = true")
        code = worker.wait(timeout=60)
        leased = pg.execute("SELECT lease_expires_at > now() FROM work_items").fetchone()
        assert code == 70, worker.output()
        assert "fail-stop" in worker.output()
        assert leased == (True,)  # dead while the item was still its own
    assert running_per_scope(pg) == {"x": 1}  # left for lease recovery; never Failed


@pytest.mark.alone  # within its stop grace: a bound in seconds from SHORT
async def test_a_handler_cut_off_inside_its_transaction_stops_within_its_grace(
    dsn: str, pg: Conn
) -> None:
    """The link dies while a handler's fenced transaction is open: the self-stop cancels
    the handler, and leaving the transaction does not wait on the dead link for its
    ROLLBACK (that would outlast the stop grace and fail-stop the Worker)."""
    pg.execute("CREATE TABLE notes (item_id bigint)")
    registry = Registry()
    inside, returned = trio.Event(), trio.Event()
    cancelled_at: list[float] = []
    returned_at: list[float] = []
    failstops: list[str] = []

    @registry.handler("K")
    async def handler(item: WorkItem, ctx: Context) -> None:
        try:
            async with ctx.transaction() as tx:
                await tx.execute("INSERT INTO notes VALUES (%s)", [item.id])
                inside.set()
                try:
                    await trio.sleep_forever()
                except trio.Cancelled:
                    cancelled_at.append(trio.current_time())
                    raise
        finally:
            returned_at.append(trio.current_time())
            returned.set()

    proxy = FaultProxy(*target_of(dsn))
    async with trio_asyncio.open_loop(), open_store(dsn) as healthy_store:
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.run)
            cut_store = PostgresStore(proxy.dsn(dsn), call_timeout=10.0)
            await cut_store.open()
            worker = Worker(cut_store, registry, SHORT, worker_id="w", fail_stop=failstops.append)
            await nursery.start(worker.run)
            await healthy_store.enqueue("K", scope="s")
            with trio.fail_after(10):
                await inside.wait()
            proxy.blackhole()
            with trio.fail_after(10):
                await returned.wait()
            await trio.sleep(SHORT.stop_grace + 0.5)  # a fail-stop would have come by now
            proxy.heal()
            nursery.cancel_scope.cancel()
        # Closed before the loop: its pool's connections to the cut link end here, not
        # as errors of asyncio tasks the closing loop would still be running.
        await cut_store.close()
    assert failstops == []
    assert returned_at[0] - cancelled_at[0] < SHORT.stop_grace / 2
    assert pg.execute("SELECT count(*) FROM notes").fetchone() == (0,)
