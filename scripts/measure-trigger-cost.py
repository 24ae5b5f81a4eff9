#!/usr/bin/env python
"""What work_items' user triggers cost the server an item of unscoped work: the lean
claim of `bench floor` (one statement over the unscoped items) and `work_finish_v1`,
in batches, with the table's user triggers enabled and disabled (`ALTER TABLE
work_items DISABLE TRIGGER USER`), rounds alternating, in a throwaway database of the
bench server. Server CPU ms an item of the server's processes (`bench.cpu`), each
round's. Then, in the same database, one after another with the triggers off: its
CHECK constraints dropped, then `work_items_running_unslotted_kind` and
`work_items_finished` dropped (median of 3 each); and, triggers on again in a fresh
database, `work_finish_v1` against a plain fenced UPDATE for the finish, rounds
alternating.

Usage:
    .venv/bin/python scripts/measure-trigger-cost.py [DSN] [ITEMS] [BATCH]
"""

from __future__ import annotations

import sys
import time
from typing import Any

import psycopg
from psycopg import sql

from bench.common import QUERIES, Server, connect
from bench.cpu import ms_per_item, server_pids, snapshot

DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
ROUNDS = 3
CLAIM = {"worker_id": "triggers", "lease": 300.0, "kinds": ["Noop"]}


#: The finish as one plain UPDATE, fenced by attempt, beside work_finish_v1.
PLAIN_FINISH = """
UPDATE work_items AS w SET status = 'Succeeded', finished_at = now(), lease_expires_at = NULL
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS d (id, attempt)
WHERE w.id = d.id AND w.attempt = d.attempt AND w.status = 'Running'
"""


def server_ms(
    conn: psycopg.Connection[Any],
    items: int,
    batch: int,
    *,
    triggers: bool,
    finish: str = QUERIES["floor_finish"],
) -> float:
    conn.execute("TRUNCATE work_items CASCADE")
    conn.execute(
        QUERIES["insert_queued"], {"kind": "Noop", "prefix": "", "n": items, "age": 0, "scopes": 0}
    )
    conn.execute(QUERIES["vacuum_analyze"])
    conn.execute(f"ALTER TABLE work_items {'ENABLE' if triggers else 'DISABLE'} TRIGGER USER")
    time.sleep(0.5)  # the VACUUM's own background writes settle outside the window
    before = snapshot((), server_pids(conn.info.backend_pid))
    done = 0
    while True:
        with conn.transaction():
            conn.execute("SET LOCAL enable_seqscan = off")
            rows = conn.execute(QUERIES["floor_lean_claim"], {**CLAIM, "limit": batch}).fetchall()
        if not rows:
            break
        ids, attempts = zip(*rows, strict=True)
        conn.execute(finish, {"ids": list(ids), "attempts": list(attempts)})
        done += len(rows)
    assert done == items, (done, items)
    spent = ms_per_item(before, snapshot((), server_pids(conn.info.backend_pid)), items)
    ms = spent["server_cpu_ms_per_item"]
    assert ms is not None, "the server is not on this machine"
    return float(ms)


def main(dsn: str, items: int, batch: int) -> None:
    server = Server(dsn)
    rounds: dict[bool, list[float]] = {True: [], False: []}
    with server.database("triggers") as db, connect(db) as conn:
        for _ in range(ROUNDS):
            for triggers in (True, False):
                rounds[triggers].append(server_ms(conn, items, batch, triggers=triggers))
        for triggers, values in rounds.items():
            show(f"triggers {'enabled' if triggers else 'disabled'}", values)
        checks = conn.execute(
            "SELECT conname FROM pg_constraint"
            " WHERE conrelid = 'work_items'::regclass AND contype = 'c'"
        ).fetchall()
        for (name,) in checks:
            conn.execute(
                sql.SQL("ALTER TABLE work_items DROP CONSTRAINT {}").format(sql.Identifier(name))
            )
        show(f"triggers disabled, {len(checks)} CHECKs dropped", _rounds(conn, items, batch))
        conn.execute("DROP INDEX work_items_running_unslotted_kind, work_items_finished")
        show("and two indexes dropped", _rounds(conn, items, batch))
    finishes: dict[str, list[float]] = {"work_finish_v1": [], "a plain UPDATE": []}
    with server.database("finishes") as db, connect(db) as conn:
        for _ in range(ROUNDS):
            for name, finish in zip(finishes, (QUERIES["floor_finish"], PLAIN_FINISH), strict=True):
                finishes[name].append(server_ms(conn, items, batch, triggers=True, finish=finish))
    for name, values in finishes.items():
        show(f"triggers enabled, the finish by {name}", values)


def _rounds(conn: psycopg.Connection[Any], items: int, batch: int) -> list[float]:
    return [server_ms(conn, items, batch, triggers=False) for _ in range(ROUNDS)]


def show(label: str, values: list[float]) -> None:
    print(f"{label}: {', '.join(f'{v:.4f}' for v in sorted(values))} ms an item")


if __name__ == "__main__":
    args = sys.argv[1:]  # [DSN [ITEMS [BATCH]]]
    main(
        args[0] if args else DEFAULT_DSN,
        int(args[1]) if args[1:] else 20_000,
        int(args[2]) if args[2:] else 100,
    )
