#!/usr/bin/env python
"""What migration 0008's bounds cost the server an item (issue 32), side by side: two
fresh databases on one server, one migrated with every queue migration but 0008
(before) and one to the head (after), rounds alternating between them. A round is 100
no-op items through the Worker's own statements (queries.sql): enqueue_many (one INSERT
of 100 rows), claim (a batch of 100), a heartbeat_many of the batch (the UPDATE a long
item repeats; a no-op item has none, so it is counted apart) and finish (Succeeded, one
batch). The figure is the server CPU of each database's own backend
(/proc/PID/schedstat), an item, median over the rounds (the first one warms the plans
up and is not counted).

Usage:
    .venv/bin/python scripts/measure-bounds-cost.py [ADMIN_DSN] [ROUNDS]
"""

from __future__ import annotations

import os
import statistics
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from yoyo import get_backend, read_migrations

from tests.support.database import with_dbname
from trioworker._postgres.migrate import migrate, migrations_dir, yoyo_uri
from trioworker._postgres.queries import WRITTEN

BATCH = int(os.environ.get("BATCH", "100"))
DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
# Since the squash into 0001.queue (issue 32) no migration of this tree leaves the bounds
# out: run this script from a checkout before it (c5e857b) to repeat the figures in
# docs/design/schema.md.
#: Each side's migration left out (None: every one). 0008 depends on 0007 only, as 0010
#: does, so the head without it is the same schema less the bounds.
SIDES = {"before": "0008.bounds", "after": None}


def cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


@contextmanager
def database(admin: str, left_out: str | None) -> Iterator[str]:
    name = f"trioworker_bounds_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        dsn = with_dbname(admin, name)
        if left_out is None:
            migrate(dsn)
        else:
            migrate_without(dsn, left_out)
        yield dsn
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def migrate_without(dsn: str, left_out: str) -> None:
    """Apply every queue migration but `left_out`."""
    backend = get_backend(yoyo_uri(dsn))
    try:
        wanted = read_migrations(str(migrations_dir())).filter(lambda m: m.id != left_out)
        with backend.lock():
            backend.apply_migrations(backend.to_apply(wanted))
    finally:
        backend.connection.close()


def one_round(conn: psycopg.Connection[Any], measure: Callable[[str], Any]) -> None:
    """100 items enqueued, claimed, heartbeaten once and finished; `measure(step)`
    wraps each step."""
    n = BATCH
    with measure("enqueue"):
        conn.execute(WRITTEN["enqueue_many"], {
            "kinds": ["Noop"] * n, "scopes": [None] * n, "payloads": ["{}"] * n,
            "priorities": [0] * n, "dedup_keys": [None] * n, "run_ats": [None] * n,
            "delays": [0.0] * n, "trace_contexts": [None] * n,
        })  # fmt: skip
    with measure("claim"):
        claimed = conn.execute(WRITTEN["claim"], {
            "worker_id": "w", "lease": 60.0, "limit": n, "kinds": ["Noop"], "scopes": None,
            "unscoped": True,
        }).fetchall()  # fmt: skip
    assert len(claimed) == n, len(claimed)
    ids, attempts = [r[0] for r in claimed], [r[5] for r in claimed]
    with measure("heartbeat"):
        conn.execute(WRITTEN["heartbeat_many"], {"ids": ids, "attempts": attempts, "lease": 60.0})
    with measure("finish"):
        done = conn.execute(WRITTEN["finish"], {
            "ids": ids, "attempts": attempts, "status": "Succeeded", "reason": None,
            "error": None, "wait": False, "traceback": None,
        }).fetchall()  # fmt: skip
    assert len(done) == n


def main(admin: str, rounds: int) -> None:
    steps = ("enqueue", "claim", "heartbeat", "finish")
    cpu: dict[str, dict[str, list[float]]] = {s: {k: [] for k in steps} for s in SIDES}
    with ExitStack() as stack:
        conns, pids = {}, {}
        for side, left_out in SIDES.items():
            dsn = stack.enter_context(database(admin, left_out))
            conn = stack.enter_context(psycopg.connect(dsn, autocommit=True))
            conns[side] = conn
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            pids[side] = int(row[0])
        for round in range(rounds + 1):
            order = list(SIDES) if round % 2 == 0 else list(reversed(SIDES))
            for side in order:

                @contextmanager
                def measure(step: str, side: str = side, round: int = round) -> Iterator[None]:
                    began = cpu_ns(pids[side])
                    yield
                    if round > 0:
                        cpu[side][step].append((cpu_ns(pids[side]) - began) / 1000 / BATCH)

                one_round(conns[side], measure)
    print(f"server CPU an item, µs (median of {rounds} rounds of {BATCH} items)")
    print(f"{'':8}" + "".join(f"{s:>10}" for s in steps) + f"{'no-op item':>12}")
    totals = {}
    for side in SIDES:
        medians = {s: statistics.median(cpu[side][s]) for s in steps}
        per_round = [
            sum(cpu[side][s][i] for s in ("enqueue", "claim", "finish")) for i in range(rounds)
        ]
        totals[side] = statistics.median(per_round)
        print(f"{side:8}" + "".join(f"{medians[s]:10.2f}" for s in steps)
              + f"{totals[side]:12.2f}")  # fmt: skip
    delta = totals["after"] - totals["before"]
    print(f"no-op item (enqueue + claim + finish): after - before = {delta:+.2f} µs"
          f" ({delta / totals['before']:+.1%})")  # fmt: skip


if __name__ == "__main__":
    args = sys.argv[1:]  # [DSN [ROUNDS]]
    main(args[0] if args else DEFAULT_DSN, int(args[1]) if args[1:] else 200)
