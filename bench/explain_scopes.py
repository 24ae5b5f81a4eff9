"""EXPLAIN (ANALYZE, BUFFERS) of the claim and the finish with 50 scopes (issue 32), every
statement the functions run included (auto_explain, `log_nested_statements`, sent to this
session as notices), in a scratch database holding the e2e run's shape: 10,000 items
round robin over 50 scopes, 32 of them claimed (their scopes busy).

    python -m bench.explain_scopes [--dsn DSN]

Run it with another tree's trioworker first on PYTHONPATH for that tree's plans.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from bench.common import DEFAULT_DSN, QUERIES, connect, server

CLAIM = ("SELECT id FROM work_claim_v3('explain', 60, %(limit)s, '{Noop}',"
         " CASE WHEN work_failover_hold_v1(60) THEN '{}'::text[] ELSE NULL END, true)")  # fmt: skip
FINISH = ("SELECT id FROM work_finish_v1(%(ids)s, %(attempts)s, 'Succeeded', NULL, NULL,"
          " true, NULL) AS id")  # fmt: skip


def explained(conn: Any, query: str, params: dict[str, Any]) -> tuple[list[Any], list[str]]:
    notices: list[str] = []

    def note(d: Any) -> None:
        notices.append(d.message_primary or "")

    conn.add_notice_handler(note)
    rows = conn.execute(query, params).fetchall()
    conn.remove_notice_handler(note)
    return rows, notices


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.explain_scopes")
    parser.add_argument("--dsn", default=os.environ.get("TRIOWORKER_DSN") or DEFAULT_DSN)
    args = parser.parse_args()
    with server(args.dsn) as srv, srv.database("explain") as dsn, connect(dsn) as conn:
        shape = {"kind": "Noop", "prefix": "s-", "n": 10_000, "age": 0, "scopes": 50}
        conn.execute(QUERIES["insert_queued"], shape)
        conn.execute("VACUUM ANALYZE")
        for statement in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                          "SET auto_explain.log_nested_statements = on",
                          "SET auto_explain.log_analyze = on",
                          "SET auto_explain.log_buffers = on",
                          "SET auto_explain.log_level = notice"):  # fmt: skip
            conn.execute(statement)
        # Warm the session's plans, then the e2e steady state: 32 scopes busy.
        warm = conn.execute(CLAIM, {"limit": 4}).fetchall()
        rows = conn.execute("SELECT id, attempt FROM work_items WHERE id = ANY(%s)",
                            [[r[0] for r in warm]]).fetchall()  # fmt: skip
        conn.execute(FINISH, {"ids": [r[0] for r in rows], "attempts": [r[1] for r in rows]})
        conn.execute(CLAIM, {"limit": 28}).fetchall()
        claimed, claim_plans = explained(conn, CLAIM, {"limit": 1})
        rows = conn.execute("SELECT id, attempt FROM work_items WHERE id = ANY(%s)",
                            [[r[0] for r in claimed]]).fetchall()  # fmt: skip
        _, finish_plans = explained(
            conn, FINISH, {"ids": [r[0] for r in rows], "attempts": [r[1] for r in rows]}
        )
        for title, plans in (("claim of 1 (32 scopes busy)", claim_plans),
                             ("finish of 1, Succeeded", finish_plans)):  # fmt: skip
            print(f"==== {title}: {len(plans)} statements")
            for plan in plans:
                print(re.sub(r"\n\s*\n", "\n", plan))
                print("----")


if __name__ == "__main__":
    main()
