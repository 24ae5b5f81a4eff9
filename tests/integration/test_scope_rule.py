"""The rule and its lines on PostgreSQL, with races forced by transactions held open.

The deterministic interleavings that wedged the scope-heads design (issue 9) are here,
with the deadlocks callers met and the isolation levels they use; the seeded
concurrent test is test_lines_concurrently.py.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import trio

from tests.support.lines import (
    backend_pid,
    doubled_heads,
    running_per_scope,
    wait_until_blocked,
    waits_on_a_lock,
    wedges,
)
from trioworker import PostgresStore, Status
from trioworker._postgres.connection import PROBE_CHANNEL, _probe_arrives
from trioworker._postgres.store import RUNNING_SCOPE_INDEX
from trioworker._postgres.trio_connection import TrioConnection

LEASE = 30.0
KINDS = ("A", "B", "C", "X", "K", "Crawl", "Purge")
Conn = psycopg.Connection[Any]


def session(dsn: str, isolation: str = "read committed") -> Conn:
    """A connection for a transaction held open across steps (not autocommit). A
    statement waits at most a minute on a lock: a test that fails while another of
    its sessions holds the lock then ends, instead of waiting on its thread forever."""
    conn = psycopg.connect(dsn)
    conn.execute(f"SET default_transaction_isolation = '{isolation}'")
    conn.execute("SET lock_timeout = '60s'")
    conn.commit()
    return conn


async def in_thread(fn: Callable[[], Any]) -> Any:
    """Run a blocking statement in a thread, so the test can act while it waits."""
    return await trio.to_thread.run_sync(fn)


async def test_a_second_running_item_of_a_scope_violates_the_index(
    store: PostgresStore, pg: Conn
) -> None:
    """Setting a second item of a scope Running by hand fails, naming the index."""
    await store.enqueue("Crawl", scope="C")
    second = await store.enqueue("Purge", scope="C")
    assert await store.claim("w", LEASE, kinds=KINDS)
    with pytest.raises(psycopg.errors.UniqueViolation) as raised:
        pg.execute(
            "UPDATE work_items SET status = 'Running', lease_expires_at = now() WHERE id = %s",
            (second.id,),
        )
    assert raised.value.diag.constraint_name == RUNNING_SCOPE_INDEX


async def test_a_claim_racing_a_running_item_set_by_hand_loses_on_the_index_alone(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """An operator sets C's second item Running by hand and holds the transaction open:
    the claim cannot see it, so only the unique index stands between them. The claim
    of C waits on the index, the operator commits, and the claim loses C by the
    index's name, yet still takes the batch's other item (scope D)."""
    await store.enqueue("A", scope="C")
    by_hand = await store.enqueue("B", scope="C")
    other = await store.enqueue("X", scope="D")
    with session(dsn) as operator:
        operator.execute(
            "UPDATE work_items SET status = 'Running', lease_expires_at = now() + interval '1h'"
            " WHERE id = %s",
            (by_hand.id,),
        )
        result: list[Any] = []
        async with trio.open_nursery() as nursery:

            async def claim() -> None:
                result.append(await store.claim_batch("w", LEASE, 4, kinds=KINDS))

            nursery.start_soon(claim)
            await wait_until_blocked(pg)
            operator.commit()
    [claimed] = result
    assert [item.id for item in claimed] == [other.id]
    assert running_per_scope(pg) == {"C": 1, "D": 1}
    assert store.statistics().race_losses == 1


async def test_claims_of_one_scope_take_turns_and_a_batch_keeps_its_other_items(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """Scope C has two lines (kinds A and B), so two heads. While one claim of C is
    uncommitted, a second claim passes over C at once (without waiting on it) and
    takes scope D's item; after the commit C stays busy with one item."""
    await store.enqueue("A", scope="C")
    await store.enqueue("B", scope="C")
    other = await store.enqueue("X", scope="D")
    with session(dsn) as first:
        held = first.execute(
            "SELECT id, scope FROM work_claim_v3('w1', 30, 1, ARRAY['A', 'B'])"
        ).fetchall()
        assert [scope for _, scope in held] == ["C"]
        with trio.fail_after(5):
            batch = await store.claim_batch("w2", LEASE, 4, kinds=KINDS)
        assert [item.id for item in batch] == [other.id]
        first.commit()
    assert await store.claim("w2", LEASE, kinds=KINDS) is None
    assert running_per_scope(pg) == {"C": 1, "D": 1}
    assert wedges(pg) == [] and doubled_heads(pg) == []


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE work_items SET status = 'Cancelled', finished_at = now() WHERE id = %s",
        "DELETE FROM work_items WHERE id = %s",
    ],
    ids=["cancelled-by-hand", "deleted-by-hand"],
)
async def test_the_next_item_changed_by_hand_while_the_head_completes_leaves_the_line_claimable(
    store: PostgresStore, pg: Conn, dsn: str, change: str
) -> None:
    """Issue 9's interleaving: scope S holds A, B, C with A claimed. An operator
    changes B in an open transaction, A completes (without waiting on the operator),
    the operator commits: C is claimable."""
    a = await store.enqueue("K", scope="S")
    b = await store.enqueue("K", scope="S")
    c = await store.enqueue("K", scope="S")
    item = await store.claim("w", LEASE, kinds=KINDS)
    assert item and item.id == a.id
    with session(dsn) as operator:
        operator.execute(change, (b.id,))  # type: ignore[arg-type]
        with trio.fail_after(5):
            assert await store.complete(a.id, item.attempt)
        operator.commit()
    assert wedges(pg) == []
    nxt = await store.claim("w", LEASE, kinds=KINDS)
    assert nxt and nxt.id == c.id


@pytest.mark.parametrize("then", ["commit", "rollback", "update run_after"])
async def test_a_queued_item_held_for_update_while_its_head_completes_is_claimable_after(
    store: PostgresStore, pg: Conn, dsn: str, then: str
) -> None:
    """An operator holds S's only Queued item B FOR UPDATE while S's Running item
    completes: nothing errors or waits, the scope is noted for a later settle, and once
    the operator is done (commit, rollback, or an update of B's run_after first) and
    the noted scopes are settled, B is claimable."""
    a = await store.enqueue("K", scope="S")
    b = await store.enqueue("K", scope="S")
    item = await store.claim("w", LEASE, kinds=KINDS)
    assert item and item.id == a.id
    with session(dsn) as operator:
        operator.execute("SELECT 1 FROM work_items WHERE id = %s FOR UPDATE", (b.id,))
        with trio.fail_after(5):
            assert await store.complete(a.id, item.attempt)
        if then == "update run_after":
            operator.execute(
                "UPDATE work_items SET run_after = now() - interval '1 second' WHERE id = %s",
                (b.id,),
            )
        if then == "rollback":
            operator.rollback()
        else:
            operator.commit()
    assert wedges(pg) == []
    assert await store.settle_noted_scopes() == 1
    nxt = await store.claim("w", LEASE, kinds=KINDS)
    assert nxt and nxt.id == b.id
    assert store.statistics().conflict_retries == 0


async def test_a_batch_over_many_scopes_settles_them_all_and_a_held_line_gets_a_stand_in(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """One completion ends the Running items of 20 scopes, settled together; in one of
    them an operator holds the next item FOR UPDATE. Nothing waits: every other scope's
    next item is a head at once, the held scope's line is taken by the item after
    (a stand-in) and the scope is noted; after the operator commits, a settle of the
    noted scopes puts the head back on the held item, and the stand-in steps down."""
    scopes = [f"s{n:02}" for n in range(20)]
    for _ in range(3):
        for scope in scopes:
            await store.enqueue("K", scope=scope)
    running = await store.claim_batch("w", LEASE, 20, kinds=KINDS)
    assert sorted(i.scope for i in running) == scopes  # type: ignore[type-var]
    held, stand_in = (
        row[0]
        for row in pg.execute(
            "SELECT id FROM work_items WHERE scope = 's07' AND status = 'Queued' ORDER BY id"
        ).fetchall()
    )
    with session(dsn) as operator:
        operator.execute("SELECT 1 FROM work_items WHERE id = %s FOR UPDATE", (held,))
        with trio.fail_after(5):
            done = await store.complete_batch([(i.id, i.attempt) for i in running])
        assert done == {i.id for i in running}
        heads = dict(
            pg.execute(
                "SELECT scope, array_agg(id) FROM work_items WHERE is_head GROUP BY scope"
            ).fetchall()
        )
        assert sorted(heads) == scopes and all(len(ids) == 1 for ids in heads.values())
        assert heads["s07"] == [stand_in]
        noted = pg.execute("SELECT DISTINCT scope FROM work_unsettled_scopes").fetchall()
        assert noted == [("s07",)]
        operator.commit()
    assert await store.settle_noted_scopes() == 1
    s07_heads = pg.execute("SELECT id FROM work_items WHERE scope = 's07' AND is_head")
    assert s07_heads.fetchall() == [(held,)]
    assert wedges(pg) == [] and doubled_heads(pg) == []
    batch = await store.claim_batch("w", LEASE, 20, kinds=KINDS)
    assert len(batch) == 20 and held in {i.id for i in batch}
    assert store.statistics().conflict_retries == 0


async def test_request_cancel_racing_the_heads_completion_never_wedges_the_scope(
    store: PostgresStore, pg: Conn
) -> None:
    """Through the public API alone, 60 rounds: complete(A) races request_cancel(B)
    with 0-3 ms of jitter; every round ends with C claimable (the scope-heads design
    wedged in 31 of 200 such rounds)."""
    for round_ in range(60):
        pg.execute("TRUNCATE work_items CASCADE")
        a = await store.enqueue("K", scope="S")
        b = await store.enqueue("K", scope="S")
        c = await store.enqueue("K", scope="S")
        item = await store.claim("w", LEASE, kinds=KINDS)
        assert item and item.id == a.id
        jitter = (round_ % 4) / 1000
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.complete, a.id, item.attempt)

            async def cancel_b(delay: float = jitter, id: int = b.id) -> None:
                await trio.sleep(delay)
                await store.cancel(id)

            nursery.start_soon(cancel_b)
        await store.settle_noted_scopes()
        assert wedges(pg) == [], f"round {round_}"
        nxt = await store.claim("w", LEASE, kinds=KINDS)
        assert nxt and nxt.id == c.id, f"round {round_}"


@pytest.mark.parametrize("busy", [False, True], ids=["free-scopes", "busy-scopes"])
async def test_enqueues_in_opposite_scope_orders_never_deadlock(
    store: PostgresStore, pg: Conn, dsn: str, busy: bool
) -> None:
    """Two callers' transactions enqueue into S then R, and R then S, statement by
    statement; then the same with one multi-row INSERT each, in both orders. Both
    commit every time (two inserts can never deadlock), and every line is claimable."""
    if busy:
        for scope in ("S", "R"):
            await store.enqueue("K", scope=scope)
        assert len(await store.claim_batch("w", LEASE, 2, kinds=KINDS)) == 2
    insert = "INSERT INTO work_items (kind, scope) VALUES ('K', %s)"
    with session(dsn) as one, session(dsn) as two:
        one.execute(insert, ("S",))
        two.execute(insert, ("R",))
        one.execute(insert, ("R",))
        two.execute(insert, ("S",))
        one.commit()
        two.commit()
        one.execute("INSERT INTO work_items (kind, scope) VALUES ('K', 'S'), ('K', 'R')")
        two.execute("INSERT INTO work_items (kind, scope) VALUES ('K', 'R'), ('K', 'S')")
        one.commit()
        two.commit()
    assert wedges(pg) == []
    row = pg.execute("SELECT count(*) FROM work_items WHERE status = 'Queued'").fetchone()
    assert row == (8,)


async def test_an_operator_holding_the_next_item_while_workers_complete_meets_no_deadlock(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """The deadlock that made completions victims: an operator holds B FOR UPDATE, the
    head A completes, then the operator updates B's run_after and commits. Neither side
    errors, and B runs next."""
    a = await store.enqueue("K", scope="S")
    b = await store.enqueue("K", scope="S")
    item = await store.claim("w", LEASE, kinds=KINDS)
    assert item
    with session(dsn) as operator:
        operator.execute("SELECT 1 FROM work_items WHERE id = %s FOR UPDATE", (b.id,))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.complete, a.id, item.attempt)
            await trio.sleep(0.2)
            operator.execute(
                "UPDATE work_items SET run_after = now() - interval '1 minute' WHERE id = %s",
                (b.id,),
            )
            operator.commit()
    await store.settle_noted_scopes()
    nxt = await store.claim("w", LEASE, kinds=KINDS)
    assert nxt and nxt.id == b.id
    assert store.statistics().conflict_retries == 0


async def test_a_long_caller_transaction_in_one_scope_delays_nothing_elsewhere(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """A caller's transaction enqueues into busy scopes S and T and stays open (also
    with its deferred checks run early, SET CONSTRAINTS ALL IMMEDIATE, so it holds S's
    and T's settle locks shared). Meanwhile every item of 20 other scopes is claimed
    and completed, a completion batch of [S head, V head] comes back, and an expired
    lease in scope W is recovered: each returns while the caller's transaction is still
    open, so none waited on it (a call that did would never return: each is guarded by
    a fail_after(60), so the test fails instead of hanging)."""
    for scope in ("S", "T", "V", "W"):
        await store.enqueue("K", scope=scope)
    heads = {i.scope: i for i in await store.claim_batch("w", LEASE, 4, kinds=KINDS)}
    for n in range(20):
        await store.enqueue("K", scope=f"other-{n}")
    with session(dsn) as caller:
        caller.execute("INSERT INTO work_items (kind, scope) VALUES ('K', 'S'), ('K', 'T')")
        caller.execute("SET CONSTRAINTS ALL IMMEDIATE")
        others = set()
        for _ in range(20):
            with trio.fail_after(60):
                item = await store.claim("w2", LEASE, kinds=KINDS)
                assert item is not None and item.scope is not None
                assert item.scope.startswith("other-")
                assert await store.complete(item.id, item.attempt)
            others.add(item.scope)
        assert len(others) == 20
        pg.execute(
            "UPDATE work_items SET lease_expires_at = now() - interval '1s' WHERE scope = 'W'"
        )
        with trio.fail_after(60):
            done = await store.complete_batch(
                [(heads["S"].id, heads["S"].attempt), (heads["V"].id, heads["V"].attempt)]
            )
            recovered = await store.recover_expired_leases(max_stalls=3)
        assert done == {heads["S"].id, heads["V"].id}
        assert [r.scope for r in recovered] == ["W"]
        assert not waits_on_a_lock(pg)
        caller.commit()
    await store.settle_noted_scopes()
    assert wedges(pg) == []
    # S's new item runs (its head completed); T's waits behind T's Running head.
    assert {i.scope for i in await store.claim_batch("w", LEASE, 10, kinds=KINDS)} == {"S", "W"}


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
async def test_two_transactions_at_a_strict_isolation_enqueue_into_one_empty_scope(
    store: PostgresStore, pg: Conn, dsn: str, isolation: str
) -> None:
    """Both REPEATABLE READ (or SERIALIZABLE) transactions enqueue into empty scope S
    before either commits; both commit, and their items run one after the other."""
    with session(dsn, isolation) as one, session(dsn, isolation) as two:
        one.execute("SELECT 1")  # both snapshots taken before either inserts
        two.execute("SELECT 1")
        one.execute("INSERT INTO work_items (kind, scope) VALUES ('K', 'S') RETURNING id")
        two.execute("INSERT INTO work_items (kind, scope) VALUES ('K', 'S'), ('K', 'S')")
        one.commit()
        two.commit()
    batch = await store.claim_batch("w", LEASE, 4, kinds=KINDS)
    assert len(batch) == 1
    ran = []
    for _ in range(3):
        item = batch[0] if batch else await store.claim("w", LEASE, kinds=KINDS)
        batch = []
        assert item is not None and await store.claim("w", LEASE, kinds=KINDS) is None
        assert await store.complete(item.id, item.attempt)
        ran.append(item.id)
    assert sorted(ran) == [1, 2, 3] and wedges(pg) == []


async def test_a_repeatable_read_default_does_not_reach_the_queues_own_calls(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """With the database's default set to REPEATABLE READ, enqueue, plain INSERT,
    claim, complete, retry and recovery all work and raise nothing."""
    pg.execute("ALTER DATABASE " + pg.info.dbname + " SET default_transaction_isolation"
               " = 'repeatable read'")  # fmt: skip
    from trioworker import open_store

    async with open_store(dsn) as strict:
        with psycopg.connect(dsn, autocommit=True) as plain:
            assert plain.execute("SHOW transaction_isolation").fetchone() == ("repeatable read",)
            plain.execute("INSERT INTO work_items (kind, scope) VALUES ('K', 'S'), ('K', 'S')")
        await strict.enqueue("K", scope="S")
        first = await strict.claim("w", LEASE, kinds=KINDS)
        assert first is not None
        assert await strict.retry_later(first.id, first.attempt, 0.0, "E")
        second = await strict.claim("w", LEASE, kinds=KINDS)
        assert second is not None and await strict.complete(second.id, second.attempt)
        third = await strict.claim("w", LEASE, kinds=KINDS)
        assert third is not None
        pg.execute("UPDATE work_items SET lease_expires_at = now() - interval '1s'"
                   " WHERE status = 'Running'")  # fmt: skip
        assert len(await strict.recover_expired_leases(max_stalls=3)) == 1
        assert strict.statistics().conflict_retries == 0
    assert wedges(pg) == []


async def test_lines_follow_every_transition(store: PostgresStore, pg: Conn) -> None:
    """After each of the queue's own operations, one at a time, no line is wedged and
    none has two heads."""

    def check() -> None:
        assert wedges(pg) == [] and doubled_heads(pg) == []

    ids = [(await store.enqueue(k, scope=s)).id for k, s in [
        ("K", "a"), ("K", "a"), ("K", "b"), ("X", "a"), ("K", "b")]]  # fmt: skip
    check()
    first = await store.claim("w", LEASE, kinds=KINDS)
    assert first and first.id == ids[0]
    check()
    assert await store.retry_later(first.id, first.attempt, 60.0, "E")  # to the back
    check()
    second = await store.claim("w", LEASE, kinds=KINDS)
    assert second and second.id == ids[1]
    assert await store.release(second.id, second.attempt)
    check()
    assert await store.cancel(ids[1]) is not None
    check()
    pg.execute("DELETE FROM work_items WHERE id = %s", (ids[3],))  # a head, deleted by hand
    assert await store.settle_noted_scopes() == 1
    check()
    pg.execute("UPDATE work_items SET scope = 'b' WHERE id = %s", (ids[0],))  # moved by hand
    await store.settle_noted_scopes()
    check()
    assert await store.repair_heads() == []


async def test_a_backdated_item_runs_first_in_its_line(store: PostgresStore, pg: Conn) -> None:
    """An item due earlier than the line's head is claimed first."""
    await store.enqueue("K", scope="a")
    early = await store.enqueue("K", scope="a", run_after=-dt.timedelta(hours=1))
    assert wedges(pg) == []
    item = await store.claim("w", LEASE, kinds=KINDS)
    assert item and item.id == early.id


class Heard:
    """A listener callback that records the scopes it hears, and can be waited on."""

    def __init__(self) -> None:
        self.scopes: list[str | None] = []
        self._changed = trio.Event()

    def __call__(self, scope: str | None) -> None:
        self.scopes.append(scope)
        self._changed.set()
        self._changed = trio.Event()

    async def until(self, count: int) -> None:
        # A bound for a notification that never comes, generous for a loaded machine
        # (CI runs a worker a core beside other test runs): heard, it returns at once.
        with trio.fail_after(30):
            while len(self.scopes) < count:
                await self._changed.wait()


async def test_plain_sql_insert_enqueues_and_notifies(store: PostgresStore, pg: Conn) -> None:
    """`INSERT INTO work_items (kind, scope, payload)` queues an item and wakes listeners."""
    heard = Heard()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.listen, heard)
        pg.execute(
            """INSERT INTO work_items (kind, scope, payload) VALUES ('Crawl', '7', '{"a": 1}')"""
        )
        pg.execute("INSERT INTO work_items (kind) VALUES ('TokenCleanup')")
        await heard.until(2)
        nursery.cancel_scope.cancel()
    assert heard.scopes == ["7", ""]
    item = await store.claim("w", LEASE, kinds=KINDS)
    assert item and (item.kind, item.scope, item.payload, item.attempt) == (
        "Crawl",
        "7",
        {"a": 1},
        1,
    )


async def test_a_change_by_hand_is_announced_and_settled(store: PostgresStore, pg: Conn) -> None:
    """A head deleted by hand leaves its scope noted and announced on the settle
    channel; settling it makes the next item the head."""
    await store.enqueue("K", scope="7")
    nxt = await store.enqueue("K", scope="7")
    heard, settle = Heard(), Heard()
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(store.listen, heard, on_settle=settle))
        pg.execute("DELETE FROM work_items WHERE id = 1")
        await settle.until(1)
        nursery.cancel_scope.cancel()
    assert settle.scopes == ["7"]
    assert wedges(pg) == []  # noted, so not a wedge; settled next
    assert await store.settle_noted_scopes() == 1
    item = await store.claim("w", LEASE, kinds=KINDS)
    assert item and item.id == nxt.id


async def test_a_notification_in_the_probes_batch_is_relayed(dsn: str, pg: Conn) -> None:
    """The listener's delivery probe reads notifications a batch at a time: a settle
    notification that arrives in one read with the probe, after it, is relayed (it was
    dropped when the probe's reader stopped at the probe, and a scope changed by hand
    right after a Worker started waited for the next sweep)."""
    conn = await TrioConnection.connect(dsn, autocommit=True)
    try:
        await conn.execute(f"LISTEN {PROBE_CHANNEL}")
        await conn.execute("LISTEN new_work")
        await conn.execute("LISTEN settle")
        with pg.transaction():  # delivered together at commit, in this order
            pg.execute(f"NOTIFY {PROBE_CHANNEL}")
            pg.execute("NOTIFY settle, '7'")
            pg.execute("NOTIFY new_work, '8'")
        await trio.sleep(0.2)  # all three in the socket's buffer: one read takes them
        heard, settle = Heard(), Heard()
        channels = ("new_work", "settle")
        assert await _probe_arrives(conn, channels, heard, settle, 3.0)
        assert (settle.scopes, heard.scopes) == (["7"], ["8"])
    finally:
        await conn.close()


async def test_enqueue_in_the_callers_transaction(store: PostgresStore, pg: Conn) -> None:
    """An item enqueued in a transaction exists only if that transaction commits,
    and listeners hear of it at commit, not before.
    """
    pg.execute("CREATE TABLE assets (id int PRIMARY KEY)")
    heard = Heard()
    async with trio.open_nursery() as nursery:
        await nursery.start(store.listen, heard)
        with pytest.raises(RuntimeError, match="business write failed"):
            async with store.transaction() as tx:
                await tx.execute("INSERT INTO assets VALUES (1)")
                await store.enqueue("Purge", scope="7", tx=tx)
                raise RuntimeError("business write failed")
        assert pg.execute("SELECT count(*) FROM work_items").fetchone() == (0,)
        async with store.transaction() as tx:
            await tx.execute("INSERT INTO assets VALUES (2)")
            enqueued = await store.enqueue("Purge", scope="7", tx=tx)
            await trio.sleep(0.2)
            assert heard.scopes == []  # not before the commit
        await heard.until(1)
        nursery.cancel_scope.cancel()
    assert heard.scopes == ["7"]
    assert pg.execute("SELECT id FROM assets").fetchall() == [(2,)]
    item = await store.get_item(enqueued.id)
    assert item and item.status is Status.QUEUED


async def test_a_pid_is_reported_blocked_only_while_it_waits(pg: Conn, dsn: str) -> None:
    """The helper the forced races rely on: a backend waiting on a row lock is seen
    waiting, and not once the lock is gone."""
    pg.execute("INSERT INTO work_items (kind) VALUES ('K')")
    with session(dsn) as holder, session(dsn) as waiter:
        holder.execute("SELECT 1 FROM work_items FOR UPDATE")
        pid = backend_pid(waiter)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(in_thread, lambda: waiter.execute("DELETE FROM work_items"))
            await wait_until_blocked(pg, pid)
            holder.commit()
        waiter.commit()
        assert not waits_on_a_lock(pg, pid)
