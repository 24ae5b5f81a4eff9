#!/usr/bin/env python
"""What work_items' user triggers cost the server an item of unscoped work: the lean
claim of `bench floor` (one statement over the unscoped items) and `work_finish_v1`,
in batches, with the table's user triggers enabled and disabled (`ALTER TABLE
work_items DISABLE TRIGGER USER`), rounds alternating, in a throwaway database of the
bench server. Server CPU ms an item of the server's processes (`bench.cpu`), each
round's.

Usage:
    .venv/bin/python scripts/measure-trigger-cost.py [DSN] [ITEMS] [BATCH]
"""

from __future__ import annotations

import sys
import time
from typing import Any

import psycopg

from bench.common import QUERIES, Server, connect
from bench.cpu import ms_per_item, server_pids, snapshot

DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
ROUNDS = 3
CLAIM = {"worker_id": "triggers", "lease": 300.0, "kinds": ["Noop"]}


def server_ms(conn: psycopg.Connection[Any], items: int, batch: int, *, triggers: bool) -> float:
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
        conn.execute(QUERIES["floor_finish"], {"ids": list(ids), "attempts": list(attempts)})
        done += len(rows)
    assert done == items, (done, items)
    spent = ms_per_item(before, snapshot((), server_pids(conn.info.backend_pid)), items)
    ms = spent["server_cpu_ms_per_item"]
    assert ms is not None, "the server is not on this machine"
    return float(ms)


def main(dsn: str, items: int, batch: int) -> None:
    rounds: dict[bool, list[float]] = {True: [], False: []}
    with Server(dsn).database("triggers") as db, connect(db) as conn:
        for _ in range(ROUNDS):
            for triggers in (True, False):
                rounds[triggers].append(server_ms(conn, items, batch, triggers=triggers))
    for triggers, values in rounds.items():
        shown = ", ".join(f"{v:.4f}" for v in sorted(values))
        print(f"triggers {'enabled' if triggers else 'disabled'}: {shown} ms an item")


if __name__ == "__main__":
    args = sys.argv[1:]  # [DSN [ITEMS [BATCH]]]
    main(
        args[0] if args else DEFAULT_DSN,
        int(args[1]) if args[1:] else 20_000,
        int(args[2]) if args[2:] else 100,
    )
