#!/usr/bin/env python
"""The failover guard's cost: the claim statement with work_failover_hold_v1 as shipped
against the same statement with the guard answering false, side by side in one fresh
database, rounds alternating. Prints ms a claim (median of the rounds) and the ratio.

Usage: .venv/bin/python scripts/measure-failover-guard.py [ADMIN_DSN]
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from tests.support.database import with_dbname
from trioworker._postgres.migrate import migrate
from trioworker._postgres.queries import WRITTEN as QUERIES

ROUNDS, CLAIMS = 8, 300
GUARD_OFF = """CREATE OR REPLACE FUNCTION work_failover_hold_v1(p_lease double precision)
RETURNS boolean LANGUAGE sql AS 'SELECT false'"""


def main(admin: str) -> None:
    migration = Path("migrations/0001.queue.sql").read_text()
    guard_on = migration[migration.index("CREATE FUNCTION work_failover_hold_v1") :]
    guard_on = guard_on[: guard_on.index("\n$$;") + 4]
    guard_on = guard_on.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    name = f"trioworker_guard_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        dsn = with_dbname(admin, name)
        migrate(dsn)
        params = {"worker_id": "w", "lease": 60.0, "limit": 1, "kinds": ["K"],
                  "scopes": None, "unscoped": True}  # fmt: skip
        times: dict[str, list[float]] = {"on": [], "off": []}
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
            conn.execute(
                "INSERT INTO work_items (kind, scope)"
                " SELECT 'K', 's' || (i %% 50) FROM generate_series(1, %s) AS i",
                [ROUNDS * 2 * CLAIMS],
            )
            conn.execute("VACUUM ANALYZE work_items")
            for round in range(ROUNDS):
                for mode in ("on", "off") if round % 2 == 0 else ("off", "on"):
                    conn.execute(guard_on if mode == "on" else GUARD_OFF)  # type: ignore[call-overload]
                    began = time.perf_counter()
                    for _ in range(CLAIMS):
                        conn.execute(QUERIES["claim"], params).fetchall()
                    times[mode].append((time.perf_counter() - began) / CLAIMS * 1000)
        on, off = (statistics.median(times[m]) for m in ("on", "off"))
        for mode in ("on", "off"):
            print(mode, "ms a claim:", " ".join(f"{t:.3f}" for t in times[mode]))
        print(f"median: guard {on:.3f} ms, without {off:.3f} ms, ratio {on / off:.3f}")
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


if __name__ == "__main__":
    main(
        sys.argv[1]
        if len(sys.argv) > 1
        else "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
    )
