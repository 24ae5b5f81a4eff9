#!/usr/bin/env python
"""What a completion in the handler's own transaction costs the server (issue 31), side
by side in one fresh database, rounds alternating, 50 scoped items a round (one per
scope): the server CPU (the backend's /proc/PID/schedstat) and the wall time an item.

- before: the fenced transaction finishes the item itself (BEGIN, lock_attempt,
  work_finish_v1 Succeeded, COMMIT), as the store did up to migration 0006;
- noted+batch: it notes the success instead (lock_attempt, complete_in_transaction),
  and the Worker finishes the round's items in one batched `finish` (work_finish_v1,
  as complete_batch sends it);
- noted+one: the same, each item finished by a `finish` of its own (a Worker whose
  completions never share a batch: the most it can cost).

The claims are not counted. Usage:
    .venv/bin/python scripts/measure-completion-cost.py [ADMIN_DSN]
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from tests.support.database import with_dbname
from trioworker._postgres.migrate import migrate
from trioworker._postgres.queries import WRITTEN

ROUNDS, SCOPES = 12, 50
MODES = ("before", "noted+batch", "noted+one")
FINISH_V1 = "SELECT work_finish_v1(%(ids)s, %(attempts)s, 'Succeeded')"


def cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def finish(conn: psycopg.Connection[Any], attempts: list[tuple[int, int]]) -> None:
    params = {"ids": [i for i, _ in attempts], "attempts": [a for _, a in attempts],
              "status": "Succeeded", "reason": None, "error": None, "wait": False,
              "traceback": None}  # fmt: skip
    assert len(conn.execute(WRITTEN["finish"], params).fetchall()) == len(attempts)


def complete(conn: psycopg.Connection[Any], mode: str, items: list[tuple[int, int]]) -> None:
    for id, attempt in items:
        params = {"id": id, "attempt": attempt, "ids": [id], "attempts": [attempt]}
        with conn.transaction():
            assert conn.execute(WRITTEN["lock_attempt"], params).fetchall()
            if mode == "before":
                assert conn.execute(FINISH_V1, params).fetchall() == [(id,)]
            else:
                assert conn.execute(WRITTEN["complete_in_transaction"], params).fetchall()
        if mode == "noted+one":
            finish(conn, [(id, attempt)])
    if mode == "noted+batch":
        finish(conn, items)


def main(admin: str) -> None:
    name = f"trioworker_completion_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        dsn = with_dbname(admin, name)
        migrate(dsn)
        cpu: dict[str, list[float]] = {m: [] for m in MODES}
        wall: dict[str, list[float]] = {m: [] for m in MODES}
        claim = {"worker_id": "w", "lease": 60.0, "limit": SCOPES, "kinds": ["K"],
                 "scopes": None, "unscoped": True}  # fmt: skip
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
            conn.execute(
                "INSERT INTO work_items (kind, scope)"
                " SELECT 'K', 's' || (i %% %s) FROM generate_series(1, %s) AS i",
                [SCOPES, ((ROUNDS + 1) * len(MODES) + 1) * SCOPES],
            )
            conn.execute("VACUUM ANALYZE work_items")
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            pid = int(row[0])
            for round in range(ROUNDS + 1):
                order = MODES[round % len(MODES) :] + MODES[: round % len(MODES)]
                for mode in order:
                    items = [(r[0], r[1]) for r in conn.execute(
                        "SELECT id, attempt FROM work_claim_v3(%(worker_id)s, %(lease)s,"
                        " %(limit)s, %(kinds)s, %(scopes)s, %(unscoped)s)", claim)]  # fmt: skip
                    assert len(items) == SCOPES, len(items)
                    began, began_cpu = time.perf_counter(), cpu_ns(pid)
                    complete(conn, mode, items)
                    if round > 0:  # the first round warms the plans up
                        cpu[mode].append((cpu_ns(pid) - began_cpu) / 1e6 / SCOPES)
                        wall[mode].append((time.perf_counter() - began) * 1000 / SCOPES)
        base_cpu, base_wall = statistics.median(cpu["before"]), statistics.median(wall["before"])
        for mode in MODES:
            c, w = statistics.median(cpu[mode]), statistics.median(wall[mode])
            print(f"{mode:12} server CPU {c:.3f} ms an item (x{c / base_cpu:.2f}),"
                  f" wall {w:.3f} ms an item (x{w / base_wall:.2f})")  # fmt: skip
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


if __name__ == "__main__":
    main(
        sys.argv[1]
        if len(sys.argv) > 1
        else "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
    )
