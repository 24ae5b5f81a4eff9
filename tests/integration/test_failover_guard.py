"""The failover guard (migrations/0003.failover.sql) on one real server: a guard row
noted on another timeline is what a promoted standby finds after a failover."""

from __future__ import annotations

from typing import Any

import psycopg
import trio

from trioworker import PostgresStore

Conn = psycopg.Connection[Any]
KINDS = ["K"]


def after_a_failover(pg: Conn) -> None:
    """The guard row as the promoted standby has it: written on the old timeline."""
    pg.execute("UPDATE work_failover_guard SET timeline = timeline - 1")


def guard(pg: Conn) -> tuple[Any, ...]:
    row = pg.execute(
        "SELECT timeline = work_timeline(), lease,"
        " CASE WHEN held_until > now() THEN EXTRACT(EPOCH FROM held_until - now())::float8"
        " END FROM work_failover_guard"
    ).fetchone()
    assert row is not None
    return tuple(row)


async def test_claims_on_one_timeline_are_never_held_and_note_the_longest_lease(
    store: PostgresStore, pg: Conn
) -> None:
    """On the timeline the guard noted, scoped and unscoped items are claimed alike;
    the guard keeps the longest lease a claim took (written only when it grows)."""
    await store.enqueue("K", scope="s1")
    await store.enqueue("K", scope="s2")
    assert [i.scope for i in await store.claim_batch("w", 7, 1, kinds=KINDS)] == ["s1"]
    assert [i.scope for i in await store.claim_batch("w", 3, 1, kinds=KINDS)] == ["s2"]
    same, lease, held = guard(pg)
    assert (same, lease, held) == (True, 7.0, None)


async def test_a_new_timeline_holds_scoped_claims_for_a_lease_and_unscoped_ones_go_on(
    store: PostgresStore, pg: Conn
) -> None:
    """The first claim on a new timeline starts the hold (one lease, the longest
    noted): scoped items wait, even for a Worker serving a list of scopes; unscoped
    items are claimed at once; after the lease, scoped items are claimed again."""
    assert await store.claim_batch("w", 2.0, 1, kinds=KINDS) == []  # notes lease 2 s
    after_a_failover(pg)
    scoped = await store.enqueue("K", scope="s1")
    unscoped = await store.enqueue("K")
    claimed = await store.claim_batch("w", 1.0, 10, kinds=KINDS)
    assert [i.id for i in claimed] == [unscoped.id]
    same, lease, held = guard(pg)
    assert (same, lease) == (True, 2.0) and 1.0 < held <= 2.0
    assert await store.claim_batch("w", 1.0, 10, ["s1"], unscoped=False, kinds=KINDS) == []
    await trio.sleep(held + 0.1)
    claimed = await store.claim_batch("w", 1.0, 10, ["s1"], unscoped=False, kinds=KINDS)
    assert [i.id for i in claimed] == [scoped.id]


async def test_a_guard_row_deleted_by_hand_holds_as_after_a_failover(
    store: PostgresStore, pg: Conn
) -> None:
    """Without its row the guard cannot know what ran before: it holds scoped claims
    for the claimer's lease, and notes the timeline again."""
    pg.execute("DELETE FROM work_failover_guard")
    await store.enqueue("K", scope="s1")
    assert await store.claim_batch("w", 1.5, 1, kinds=KINDS) == []
    same, lease, held = guard(pg)
    assert (same, lease) == (True, 1.5) and 1.0 < held <= 1.5
