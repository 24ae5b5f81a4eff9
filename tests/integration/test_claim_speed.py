"""The claim's cost does not grow with the work waiting behind busy scopes (a smoke test).

A claim that walks the backlog (a plain NOT EXISTS over every Queued item) is many
times slower behind 20,000 items of busy scopes than on a near-empty queue; the claim
over scope heads is not. The store's session runs with synchronous_commit off: the
claim's commit waits for a WAL flush, which on a busy machine costs more than the
statement itself and would hide what the statement costs. The full benchmark is
`python -m bench hol`; the bound here is generous, for a noisy machine.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg

from trioworker import PostgresStore, open_store

LEASE = 30.0
BUSY_SCOPES = 200
BEHIND_EACH = 100  # 20,000 Queued items behind busy scopes
WARM_UP = 5
SAMPLES = 40
BOUND = 5.0


async def median_claim_seconds(store: PostgresStore, pg: psycopg.Connection[Any]) -> float:
    """Median time of a claim of the free item, released again after each sample."""
    pg.execute("VACUUM work_items")
    samples = []
    for i in range(WARM_UP + SAMPLES):
        t0 = time.perf_counter()
        item = await store.claim("smoke", LEASE, kinds=["Free"])
        elapsed = time.perf_counter() - t0
        assert item is not None and item.scope == "free"
        assert await store.release(item.id, item.attempt)
        if i >= WARM_UP:  # the first few warm up the connection and the plan
            samples.append(elapsed)
    return statistics.median(samples)


def load_backlog(pg: psycopg.Connection[Any]) -> None:
    """Busy scopes, each with a Running item and a line of Queued items due earlier."""
    pg.execute(
        "INSERT INTO work_items (kind, scope, status, attempt, worker_id, lease_expires_at)"
        " SELECT 'Busy', 'busy-' || g, 'Running', 1, 'holder', now() + interval '1 hour'"
        " FROM generate_series(1, %s) AS g",
        [BUSY_SCOPES],
    )
    pg.execute(
        "INSERT INTO work_items (kind, scope, run_after)"
        " SELECT 'Behind', 'busy-' || (1 + g %% %s), now() - interval '1 hour'"
        " FROM generate_series(1, %s) AS g",
        [BUSY_SCOPES, BUSY_SCOPES * BEHIND_EACH],
    )
    pg.execute("ANALYZE work_items")


async def test_claim_time_does_not_grow_with_a_backlog_behind_busy_scopes(
    dsn: str, pg: psycopg.Connection[Any]
) -> None:
    """A claim behind 20,000 items of 200 busy scopes costs about what it does on a
    near-empty queue (the backlog is due earlier, so a scanning claim would walk it)."""
    pg.execute("INSERT INTO work_items (kind, scope) VALUES ('Free', 'free')")
    pg.execute("ANALYZE work_items")
    no_flush_wait = psycopg.conninfo.make_conninfo(dsn, options="-c synchronous_commit=off")
    async with open_store(no_flush_wait) as store:
        near_empty = await median_claim_seconds(store, pg)
        load_backlog(pg)
        behind = await median_claim_seconds(store, pg)

    assert behind < BOUND * near_empty, (
        f"a claim behind {BUSY_SCOPES * BEHIND_EACH:,} items of busy scopes took"
        f" {behind * 1000:.2f} ms (median), {behind / near_empty:.1f}x the"
        f" {near_empty * 1000:.2f} ms on a near-empty queue: does the claim walk the backlog?"
    )
