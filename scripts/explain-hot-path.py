"""The plans of a claim and a finish, nested statements and triggers included, as
`EXPLAIN (ANALYZE, BUFFERS)` gives them (auto_explain: log_analyze, log_buffers,
log_triggers, log_nested_statements), in a scratch database migrated by the trioworker
on the path: 20,000 Queued no-op items, 256 of them claimed (`bench e2e`'s 2 Workers x
32, claims of up to 128), then a claim of 64 and a finish of 100 of the Running ones.

    PYTHONPATH=TREE .venv/bin/python scripts/explain-hot-path.py [ADMIN_DSN] [--json]

Run it from two trees (this one and a `git worktree` of the revision before) to compare
(docs/benchmarks.md, "Issue 32: the server's cost an item").
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

import psycopg

from tests.support.database import with_dbname
from trioworker._postgres.migrate import migrate

SETUP = [
    "INSERT INTO work_items (kind, payload) SELECT 'Noop', '{}' FROM generate_series(1, 20000)",
    "ANALYZE work_items",
    "SELECT count(*) FROM work_claim_v3('w0', 60, 128, ARRAY['Noop'])",
    "SELECT count(*) FROM work_claim_v3('w0', 60, 128, ARRAY['Noop'])",
]
CLAIM = "SELECT count(*) FROM work_claim_v3('w1', 60, 64, ARRAY['Noop'])"
FINISH = "SELECT count(*) FROM work_finish_v1(%s, %s, 'Succeeded', NULL, NULL, false, NULL)"


def explained(conn: psycopg.Connection[Any], fmt: str, query: str, params: Any = None) -> None:
    notices: list[str] = []

    def note(diagnostic: psycopg.errors.Diagnostic) -> None:
        notices.append(diagnostic.message_primary or "")

    conn.add_notice_handler(note)
    with conn.transaction(force_rollback=True):
        conn.execute("LOAD 'auto_explain'")
        for name, value in [
            ("log_min_duration", "0"), ("log_nested_statements", "on"),
            ("log_analyze", "on"), ("log_buffers", "on"), ("log_triggers", "on"),
            ("log_format", fmt), ("log_level", "notice"),
        ]:  # fmt: skip
            conn.execute("SELECT set_config(%s, %s, true)", (f"auto_explain.{name}", value))
        conn.execute(query, params).fetchall()
    conn.remove_notice_handler(note)
    for message in notices:
        # The statements that read or write work_items; not the set_config calls.
        if any(name in message for name in ("work_items", "work_claim_v", "work_finish_v1")):
            print(message.replace("duration:", "\n-- duration:", 1))


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    fmt = "json" if "--json" in sys.argv else "text"
    admin = args[0] if args else "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
    name = f"trioworker_explain_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        dsn = with_dbname(admin, name)
        migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in SETUP:
                conn.execute(statement)
            for _ in range(3):  # the session's plans made and cached, as a Worker's are
                with conn.transaction(force_rollback=True):
                    conn.execute(CLAIM)
            rows = conn.execute(
                "SELECT id, attempt FROM work_items WHERE status = 'Running' ORDER BY id"
            ).fetchall()
            batch = rows[::2][:100]
            ids, attempts = [r[0] for r in batch], [r[1] for r in batch]
            for _ in range(3):
                with conn.transaction(force_rollback=True):
                    conn.execute(FINISH, (ids, attempts))
            print(f"-- the claim of 64, beside {len(rows)} Running")
            explained(conn, fmt, CLAIM)
            print(f"\n-- the finish of 100, beside {len(rows)} Running")
            explained(conn, fmt, FINISH, (ids, attempts))
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
