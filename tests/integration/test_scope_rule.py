"""The rule on PostgreSQL: at most one Running item per scope, with races forced."""

from __future__ import annotations

import functools
from typing import Any

import psycopg
import pytest
import trio

from trioworker import PostgresStore, Status
from trioworker._postgres import RUNNING_SCOPE_INDEX, claim_statement
from trioworker._queries import QUERIES

LEASE = 30.0
Conn = psycopg.Connection[Any]


def head_violations(pg: Conn) -> list[str]:
    """Scopes whose head is not their Running item, or else their first Queued item."""
    rows = pg.execute(
        """
        SELECT s.scope,
               (SELECT array_agg(id ORDER BY id) FROM work_items h
                 WHERE h.scope = s.scope AND h.is_head) AS heads,
               COALESCE(
                 (SELECT id FROM work_items r WHERE r.scope = s.scope AND r.status = 'Running'),
                 (SELECT id FROM work_items q WHERE q.scope = s.scope AND q.status = 'Queued'
                   ORDER BY run_after, id LIMIT 1)) AS expected
        FROM (SELECT DISTINCT scope FROM work_items WHERE scope IS NOT NULL) s
        """
    ).fetchall()
    wrong = []
    for scope, heads, expected in rows:
        want = [expected] if expected is not None else None
        if heads != want:
            wrong.append(f"scope {scope}: heads {heads}, expected {want}")
    return wrong


def running_per_scope(pg: Conn) -> dict[str, int]:
    rows = pg.execute(
        "SELECT scope, count(*) FROM work_items WHERE status = 'Running' AND scope IS NOT NULL"
        " GROUP BY scope"
    ).fetchall()
    return {scope: n for scope, n in rows}


async def wait_until_blocked_on_lock(pg: Conn) -> None:
    """Return once some other backend waits on a lock (the index's uniqueness check)."""
    with trio.move_on_after(10):
        while True:
            row = pg.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                " AND pid <> pg_backend_pid()"
            ).fetchone()
            if row and row[0]:
                return
            await trio.sleep(0.01)
    raise AssertionError("the second claim never blocked")


async def test_concurrent_claims_collide_on_the_index_and_the_loser_gets_nothing(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """Two claimers, two queued items of one scope: exactly one Running; the loser gets None.

    The store's own writes never give a scope two heads (heads move under a per-scope
    lock), so the test makes both items heads by hand: the state in which NOT EXISTS
    cannot see the other claim's uncommitted Running row, and only the unique index
    stands between the two claims. The first claim is held open in a transaction, the
    second blocks on the index, the first commits, the second must come back empty.
    """
    pg.execute("INSERT INTO work_items (kind, scope) VALUES ('Crawl', 'C'), ('Purge', 'C')")
    pg.execute("UPDATE work_items SET is_head = true")
    with psycopg.connect(dsn) as first:  # not autocommit: an explicit transaction
        held = first.execute(
            claim_statement(1), {"worker_id": "w1", "lease": LEASE, "scopes": []}
        ).fetchone()
        assert held is not None
        result: list[object] = []
        async with trio.open_nursery() as nursery:

            async def second_claim() -> None:
                result.append(await store.claim("w2", LEASE))

            nursery.start_soon(second_claim)
            await wait_until_blocked_on_lock(pg)
            first.commit()
    assert result == [None]
    assert running_per_scope(pg) == {"C": 1}
    assert store.statistics().race_losses == 1


async def test_a_second_running_item_of_a_scope_violates_the_index(
    store: PostgresStore, pg: Conn
) -> None:
    """Setting a second item of a scope Running by hand fails, naming the index."""
    await store.enqueue("Crawl", scope="C")
    second = await store.enqueue("Purge", scope="C")
    assert await store.claim("w", LEASE)
    with pytest.raises(psycopg.errors.UniqueViolation) as raised:
        pg.execute(
            "UPDATE work_items SET status = 'Running', lease_expires_at = now() WHERE id = %s",
            (second.id,),
        )
    assert raised.value.diag.constraint_name == RUNNING_SCOPE_INDEX


async def test_a_claim_held_open_leaves_its_scope_to_nobody_else(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """Heads design: while one claim of scope C is uncommitted, another claim skips C
    at once (without waiting) and takes scope D's item; after the commit, C stays busy.
    """
    pg.execute("INSERT INTO work_items (kind, scope) VALUES ('A', 'C'), ('B', 'C'), ('X', 'D')")
    with psycopg.connect(dsn) as first:
        held = first.execute(
            claim_statement(1), {"worker_id": "w1", "lease": LEASE, "scopes": []}
        ).fetchone()
        assert held is not None and held[2] == "C"
        with trio.fail_after(5):  # SKIP LOCKED: no waiting on the held row
            other = await store.claim("w2", LEASE)
            assert other is not None and other.scope == "D"
            assert await store.claim("w2", LEASE) is None
        first.commit()
    assert await store.claim("w2", LEASE) is None
    assert running_per_scope(pg) == {"C": 1, "D": 1}
    assert head_violations(pg) == []


async def test_an_enqueue_racing_a_completion_waits_and_sees_the_new_head(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """Heads design: a completion held open holds its scope's lock; an enqueue into the
    scope waits for it, then sees the promoted head, so the scope ends with one head.
    """
    await store.enqueue("A", scope="C")
    second = await store.enqueue("B", scope="C")
    item = await store.claim("w", LEASE)
    assert item
    with psycopg.connect(dsn) as first:
        first.execute(QUERIES["complete"], {"id": item.id, "attempt": item.attempt})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(store.enqueue, "Purge", scope="C"))
            await wait_until_blocked_on_lock(pg)
            first.commit()
    assert head_violations(pg) == []
    nxt = await store.claim("w", LEASE)
    assert nxt and nxt.id == second.id


async def test_a_cancel_racing_a_promotion_moves_the_head_on(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """Heads design: cancelling the item a held-open completion is promoting to head
    waits for it, then passes the head on to the next item.
    """
    await store.enqueue("A", scope="C")
    promoted = await store.enqueue("B", scope="C")
    last = await store.enqueue("C", scope="C")
    item = await store.claim("w", LEASE)
    assert item
    with psycopg.connect(dsn) as first:
        first.execute(QUERIES["complete"], {"id": item.id, "attempt": item.attempt})
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.request_cancel, promoted.id)
            await wait_until_blocked_on_lock(pg)
            first.commit()
    assert head_violations(pg) == []
    nxt = await store.claim("w", LEASE)
    assert nxt and nxt.id == last.id


async def test_heads_follow_every_transition(store: PostgresStore, pg: Conn) -> None:
    """Each scope's head is its Running item, or else its first Queued item, throughout."""
    ids = [(await store.enqueue("K", scope=s)).id for s in ("a", "a", "b", "a", "b")]
    assert head_violations(pg) == []
    first = await store.claim("w", LEASE)
    assert first and first.id == ids[0]
    assert head_violations(pg) == []
    assert await store.retry_later(first.id, first.attempt, 60.0, "E")  # to the back
    assert head_violations(pg) == []
    second = await store.claim("w", LEASE)
    assert second and second.id == ids[1]
    assert await store.release(second.id, second.attempt)
    assert head_violations(pg) == []
    assert await store.request_cancel(ids[1]) is not None
    assert head_violations(pg) == []
    pg.execute("DELETE FROM work_items WHERE id = %s", (ids[3],))  # a head, deleted by hand
    assert head_violations(pg) == []
    pg.execute("UPDATE work_items SET scope = 'b' WHERE id = %s", (ids[0],))  # moved by hand
    assert head_violations(pg) == []


async def test_a_backdated_item_becomes_its_scopes_head(store: PostgresStore, pg: Conn) -> None:
    """An item due earlier than the current head takes its place in line."""
    import datetime as dt

    await store.enqueue("K", scope="a")
    early = await store.enqueue("K", scope="a", run_after=-dt.timedelta(hours=1))
    assert head_violations(pg) == []
    item = await store.claim("w", LEASE)
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
        with trio.fail_after(5):
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
    item = await store.claim("w", LEASE)
    assert item and (item.kind, item.scope, item.payload, item.attempt) == (
        "Crawl",
        "7",
        {"a": 1},
        1,
    )


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
