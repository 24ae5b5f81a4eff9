"""The claim's cost does not grow with the work waiting behind busy or rate-spent scopes
(a smoke test).

A claim that walks the backlog (a plain NOT EXISTS over every Queued item) reads many
times the pages behind 20,000 items of busy scopes that it reads on a near-empty
queue; the claim over scope heads does not. Its cost here is the work EXPLAIN
(ANALYZE, BUFFERS) shows for the store's own claim statement (the buffers it touched,
work_claim_v3's body and _v2's included), not its time: the count is the same on an
idle machine and a loaded one, where a time is not (the machine is shared, and the suite runs a
pytest worker a core). Each claim is rolled back, so every sample claims the same
item. The timed benchmark is `python -m bench hol`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from trioworker._postgres.queries import WRITTEN

BUSY_SCOPES = 200
BEHIND_EACH = 100  # 20,000 Queued items behind busy scopes
WARM_UP = 2  # the first plans the claim functions' statements (the catalog's pages)
SAMPLES = 5
#: Behind the backlog the claim touches 57 buffers, on a near-empty queue 53 (a
#: deeper index); one that walks the backlog, about 900.
BOUND = 2
CLAIM = dict(worker_id="smoke", lease=30.0, limit=1, kinds=["Free"], scopes=None, unscoped=True)


def claim_buffers(conn: psycopg.Connection[Any]) -> int:
    """The buffers (shared, hit or read) the store's claim of the free item touches,
    as EXPLAIN ANALYZE counts them, in a transaction rolled back."""
    with conn.transaction(force_rollback=True):
        row = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + WRITTEN["claim"], CLAIM
        ).fetchone()
    assert row is not None
    [explained] = row[0]
    plan = explained["Plan"]
    assert plan["Actual Rows"] == 1  # it claimed the free item
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def median_claim_buffers(dsn: str) -> float:
    """The median buffers of a claim, on a connection of its own, after a warm-up."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        samples = [claim_buffers(conn) for _ in range(WARM_UP + SAMPLES)]
    return statistics.median(samples[WARM_UP:])


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


def load_spent_backlog(pg: psycopg.Connection[Any]) -> None:
    """Scopes whose rate (one start an hour) is spent, each with a line of Queued items
    of the served kind due earlier: spent as a Worker spends it, each scope's first item
    claimed and finished (whose finish settles the scope), then one more enqueued."""
    scopes = [f"spent-{n}" for n in range(BUSY_SCOPES)]
    pg.execute(
        "SELECT count(*) FROM unnest(%s::text[]) AS s,"
        " LATERAL work_set_limit_v1(NULL, s, NULL, 1, 3600.0) AS l",
        [scopes],
    )
    pg.execute(
        "INSERT INTO work_items (kind, scope, run_after)"
        " SELECT 'Free', (%s::text[])[1 + g %% %s], now() - interval '1 hour'"
        " FROM generate_series(1, %s) AS g",
        [scopes, BUSY_SCOPES, BUSY_SCOPES * BEHIND_EACH],
    )
    row = pg.execute(
        "SELECT array_agg(id), array_agg(attempt)"
        " FROM work_claim_v3('setup', 30, %s, '{Free}', %s, false)",
        [BUSY_SCOPES, scopes],
    ).fetchone()
    assert row is not None and len(row[0]) == BUSY_SCOPES
    pg.execute("SELECT work_finish_v1(%s, %s, 'Succeeded', NULL, NULL, false, NULL)", row)
    # Then an item arrives in each, a line of its own (another priority): placed behind.
    pg.execute(
        "INSERT INTO work_items (kind, scope, priority, run_after)"
        " SELECT 'Free', s, 1, now() - interval '1 hour' FROM unnest(%s::text[]) AS s",
        [scopes],
    )
    pg.execute("ANALYZE work_items")


@pytest.mark.parametrize(
    ("scopes", "load"), [("busy", load_backlog), ("rate-spent", load_spent_backlog)]
)
def test_claim_work_does_not_grow_with_a_backlog_behind_busy_or_spent_scopes(
    dsn: str, pg: psycopg.Connection[Any], scopes: str, load: Callable[..., None]
) -> None:
    """A claim behind 20,000 items of 200 busy scopes, or of 200 scopes whose rate is
    spent, touches about the buffers it does on a near-empty queue (the backlog is due
    earlier, so a scanning claim would walk it; a claim that read the spent scopes'
    heads asked each one's rate)."""
    pg.execute("INSERT INTO work_items (kind, scope) VALUES ('Free', 'free')")
    pg.execute("ANALYZE work_items")
    near_empty = median_claim_buffers(dsn)
    load(pg)
    pg.execute("VACUUM work_items")
    behind = median_claim_buffers(dsn)
    print(f"\nclaim: {near_empty:g} buffers on a near-empty queue, {behind:g} behind the backlog")
    assert behind <= BOUND * near_empty, (
        f"a claim behind {BUSY_SCOPES * BEHIND_EACH:,} items of {scopes} scopes touched"
        f" {behind:g} buffers, {behind / near_empty:.1f}x the {near_empty:g} on a"
        " near-empty queue: does the claim walk the backlog?"
    )
