"""Asking whether a scope is full reads that scope's Running items, not every busy
scope's (issue 32, "With 50 scopes"; the index of busy scopes, migrations/0001.queue.sql
section 2).

The statistics are taken while the queue is idle, as an end-to-end run's VACUUM ANALYZE
or a night's autovacuum takes them: no Running row is seen, and a planner free to read
every Running row (an index whose predicate is `status = 'Running'` alone) to answer one
scope's question finds that cheapest. Then a claim of one item, and the settle of
its scope, read every busy scope's Running row, and cost more the more scopes
are busy. Counted in shared buffers (exact, unlike time): with 300 busy scopes, at
most half as many again as with 10 (on the schema before, with every Running row in one
index, a claim: 60 against 344).
"""

from __future__ import annotations

import re
from typing import Any

import psycopg

BUSY = (10, 300)


def buffers(pg: psycopg.Connection[Any], statement: str, params: tuple[Any, ...]) -> int:
    """Shared buffers the statement touched, everything its functions ran included."""
    plan = "\n".join(
        r[0] for r in pg.execute(f"EXPLAIN (ANALYZE, BUFFERS) {statement}", params).fetchall()
    )
    found = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan)
    assert found, plan
    return int(found.group(1)) + int(found.group(2) or 0)


def claim_and_finish_with(pg: psycopg.Connection[Any], busy: int) -> tuple[int, int]:
    """Buffers of a claim of the one free item, then of a settle of its scope (what a
    finish does for each scope it ends an item in), with `busy` scopes each running one
    item (one ran before it, one waits behind it)."""
    pg.execute("DELETE FROM work_items")
    pg.execute(
        "INSERT INTO work_items (kind, scope) SELECT 'K', 'busy-' || g %% %s"
        " FROM generate_series(0, %s) AS g",
        (busy, 3 * busy - 1),
    )
    pg.execute("INSERT INTO work_items (kind, scope, run_after)"
               " VALUES ('K', 'free', now() + interval '1 hour')")  # fmt: skip
    pg.execute("VACUUM ANALYZE work_items")  # idle: nothing Running
    for keep_running in (False, True):  # a round run through, then a round left running
        started = pg.execute(
            "SELECT array_agg(id), array_agg(attempt) FROM work_claim_v3('w', 600, %s, '{K}')",
            (busy,),
        ).fetchone()
        assert started is not None and len(started[0]) == busy
        if not keep_running:
            pg.execute("SELECT work_finish_v1(%s, %s, 'Succeeded')", started)
    pg.execute("UPDATE work_items SET run_after = now() WHERE scope = 'free'")
    # Warm the session's plans: a claim that finds nothing, a finish of nothing.
    pg.execute("SELECT * FROM work_claim_v3('w', 600, 1, '{J}')")
    claim = buffers(pg, "SELECT * FROM work_claim_v3('w', 600, 1, '{K}')", ())
    row = pg.execute("SELECT id, attempt FROM work_items WHERE scope = 'free'").fetchone()
    assert row is not None
    pg.execute("SELECT * FROM work_finish_v1(%s, %s, 'Succeeded')", ([row[0]], [row[1]]))
    pg.execute("INSERT INTO work_items (kind, scope) VALUES ('K', 'free')")
    settle = buffers(pg, "SELECT work_settle_scopes(ARRAY['free'])", ())
    return claim, settle


def test_a_scope_is_asked_about_through_its_own_running_items(pg: Any) -> None:
    """A claim of one item and a settle of its scope touch about as many buffers behind
    300 busy scopes as behind 10: not one more for each busy scope."""
    few, many = (claim_and_finish_with(pg, busy) for busy in BUSY)
    for what, a, b in (("claim", few[0], many[0]), ("settle", few[1], many[1])):
        assert b <= a * 1.5 + 10, f"{what}: {a} buffers, {BUSY[0]} busy; {b}, {BUSY[1]} busy"
