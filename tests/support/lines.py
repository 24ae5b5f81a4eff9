"""Checks on scope lines, written apart from the product's own SQL (docs/design/claim.md).

A line is the Queued items of one (scope, kind, priority) in (run_after, id) order. A
wedge is a free scope (fewer Running than its limit, 1 unless work_limits says more;
not paused, not waiting in
work_unsettled_scopes to be settled, not spent in work_spent_scopes until a claim
settles it) with a line whose first item is not a head: due work there could never be
claimed.
"""

from __future__ import annotations

from typing import Any

import psycopg
import trio

Conn = psycopg.Connection[Any]

WEDGES = """
SELECT DISTINCT q.scope
FROM work_items AS q
WHERE q.status = 'Queued' AND q.scope IS NOT NULL AND NOT q.is_head
  AND (SELECT count(*) FROM work_items AS r WHERE r.scope = q.scope AND r.status = 'Running')
      < COALESCE((SELECT l.running FROM work_limits AS l WHERE l.scope = q.scope),
                 (SELECT l.running FROM work_limits AS l WHERE l.kind IS NULL AND l.scope IS NULL),
                 1)
  AND NOT EXISTS (SELECT 1 FROM work_pauses AS p WHERE p.scope = q.scope)
  AND NOT EXISTS (SELECT 1 FROM work_unsettled_scopes AS u WHERE u.scope = q.scope)
  AND NOT EXISTS (  -- its rate spent and noted, or its note due: the next claim settles it
        SELECT 1 FROM work_spent_scopes AS s
        WHERE s.scope = q.scope
          AND (s.reopens_at <= now()
               OR EXISTS (SELECT 1 FROM work_limits AS l
                          WHERE l.scope = q.scope AND l.rate IS NOT NULL
                            AND NOT EXISTS (SELECT 1 FROM work_rate_slots AS o
                                            WHERE o.limit_id = l.id
                                              AND o.started_at <= now() - l.per))))
  AND NOT EXISTS (
        SELECT 1 FROM work_items AS e
        WHERE e.scope = q.scope AND e.kind = q.kind AND e.priority = q.priority
          AND e.status = 'Queued' AND (e.run_after, e.id) < (q.run_after, q.id))
ORDER BY 1
"""


def wedges(pg: Conn) -> list[str]:
    """Scopes holding a line no claim could ever take from (there must be none)."""
    return [row[0] for row in pg.execute(WEDGES).fetchall()]


def doubled_heads(pg: Conn) -> list[tuple[str, str, int]]:
    """Lines with two heads: harmless, and the queue's own operations one at a time
    leave none, except that an item arriving due earlier than its line's head (a
    retried head waiting out its backoff, say) becomes a head beside it until the scope
    is next settled."""
    rows = pg.execute(
        "SELECT scope, kind, priority FROM work_items WHERE status = 'Queued' AND is_head"
        " GROUP BY scope, kind, priority HAVING count(*) > 1 ORDER BY 1, 2, 3"
    ).fetchall()
    return [(scope, kind, priority) for scope, kind, priority in rows]


def running_per_scope(pg: Conn) -> dict[str, int]:
    rows = pg.execute(
        "SELECT scope, count(*) FROM work_items WHERE status = 'Running' AND scope IS NOT NULL"
        " GROUP BY scope"
    ).fetchall()
    return {scope: n for scope, n in rows}


def backend_pid(conn: Conn) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def waits_on_a_lock(pg: Conn, pid: int | None = None) -> bool:
    """Whether backend `pid` (any other backend of this database if None) waits on a lock."""
    row = pg.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        " AND pid <> pg_backend_pid() AND (%(pid)s::int IS NULL OR pid = %(pid)s)",
        {"pid": pid},
    ).fetchone()
    return bool(row and row[0])


async def wait_until_blocked(pg: Conn, pid: int | None = None) -> None:
    """Return once the backend waits on a lock; fail after 10 s. (PostgreSQL has no
    event for this to wait on, so it polls pg_stat_activity.)"""
    with trio.move_on_after(10):
        while True:
            if waits_on_a_lock(pg, pid):
                return
            await trio.sleep(0.01)
    raise AssertionError("the statement never blocked")
