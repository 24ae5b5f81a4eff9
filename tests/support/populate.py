"""Finished rows in bulk, for retention tests and the prune benchmark."""

from __future__ import annotations

from typing import Any

import psycopg


def insert_finished(
    conn: psycopg.Connection[Any],
    count: int,
    *,
    status: str,
    days_ago: float,
    kind: str = "Old",
    scopes: int = 100,
) -> None:
    """`count` items of `kind` that finished with `status` `days_ago` days ago (spread
    over an hour), in `scopes` scopes, one attempt each (a failure, if Failed)."""
    conn.execute(
        """
        INSERT INTO work_items (kind, scope, status, attempt, failures, requested_at,
                                run_after, started_at, finished_at, reason, error)
        SELECT %(kind)s, 's' || (n %% %(scopes)s), %(status)s, 1,
               CASE WHEN %(status)s = 'Failed' THEN 1 ELSE 0 END, t, t, t, t,
               CASE WHEN %(status)s = 'Failed' THEN 'failed 1 of 1 attempts' END,
               CASE WHEN %(status)s = 'Failed' THEN 'KeyError: ''path''' END
        FROM generate_series(1, %(count)s) AS n,
             LATERAL (SELECT now() - make_interval(days => 0, secs => %(days)s * 86400)
                          + make_interval(secs => (n %% 3600)::float8)) AS at(t)
        """,
        {"kind": kind, "scopes": scopes, "status": status, "count": count, "days": days_ago},
    )
