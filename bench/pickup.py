"""Pickup latency: how soon an idle Worker starts an item after it is enqueued.

One Worker process (`python -m trioworker run`, concurrency 1, default poll interval)
waits with nothing to do; the benchmark enqueues one item with the store's own enqueue
statement and waits for the handler's start stamp (`time.monotonic()`, one clock for
every process on Linux). Between items it waits until the item has finished and then a
random 20-60 ms more, so the Worker is idle again, waiting on NOTIFY, at each enqueue.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from bench.apps import PICKUP_LOG_ENV
from bench.common import QUERIES, Server, connect, save, show, summary_ms
from bench.procs import processes, trioworker_command, wait_until

POLL = 5.0
ENQUEUE = {"kind": "Pickup", "scope": None, "payload": "{}", "dedup_key": None,
           "run_at": None, "delay": 0.0}  # fmt: skip


def read_stamps(path: Path) -> dict[int, float]:
    if not path.exists():
        return {}
    stamps = {}
    for line in path.read_text().splitlines():
        item_id, _, t = line.partition(" ")
        stamps[int(item_id)] = float(t)
    return stamps


def idle(conn: Any) -> bool:
    return bool(conn.execute(QUERIES["unfinished"]).fetchone() == (0,))


def measure(dsn: str, items: int, log_dir: Path) -> dict[str, list[float]]:
    stamps_path = log_dir / "pickup-stamps.txt"
    stamps_path.unlink(missing_ok=True)
    rng = random.Random(4)
    from_call: list[float] = []
    from_commit: list[float] = []
    with processes(log_dir) as procs, connect(dsn) as conn:
        command = trioworker_command(dsn, "bench-pickup", "--poll", str(POLL))
        procs.start(command, "worker", env={PICKUP_LOG_ENV: str(stamps_path)})
        wait_until(lambda: "ready" in (log_dir / "worker.log").read_text(), 60, "the Worker")
        for _ in range(items):
            time.sleep(rng.uniform(0.02, 0.06))
            sent = time.monotonic()
            row = conn.execute(QUERIES["enqueue"], ENQUEUE).fetchone()
            committed = time.monotonic()
            item_id = row[0] if row else None

            def started(item_id: Any = item_id) -> float | None:
                procs.check_alive()
                return read_stamps(stamps_path).get(item_id)

            began = wait_until(started, 2 * POLL + 10, f"item {item_id} to start", every=0.0005)
            from_call.append(began - sent)
            from_commit.append(began - committed)
            wait_until(lambda: idle(conn), 30, "the Worker to finish the item", every=0.002)
    return {"from enqueue call": from_call, "from enqueue commit": from_commit}


def main(srv: Server, quick: bool, out: Path) -> dict[str, Any]:
    items = 50 if quick else 400
    with srv.database("pickup") as dsn:
        samples = measure(dsn, items, out / "logs" / "pickup")
    series = {name: summary_ms(values) for name, values in samples.items()}
    main_series = series["from enqueue call"]
    targets = {
        "p50_within_20ms": main_series["median_ms"] <= 20.0,
        "p99_within_poll_interval": main_series["p99_ms"] <= POLL * 1000,
    }
    show(
        f"Pickup latency: idle Worker, NOTIFY, poll {POLL:g} s ({items} items)",
        ["measured", "p50 ms", "p99 ms", "mean ms", "min ms", "n"],
        [[name, s["median_ms"], s["p99_ms"], s["mean_ms"], s["min_ms"], s["n"]]
         for name, s in series.items()],
    )  # fmt: skip
    print(
        f"  p50 {main_series['median_ms']:.1f} ms (target <= 20 ms:"
        f" {'met' if targets['p50_within_20ms'] else 'MISSED'}); p99"
        f" {main_series['p99_ms']:.1f} ms (target <= poll {POLL * 1000:.0f} ms:"
        f" {'met' if targets['p99_within_poll_interval'] else 'MISSED'})"
    )
    results = {"series": series, "targets": targets}
    print(f"  -> {save(out, 'pickup', srv, {'items': items, 'poll': POLL}, results)}")
    return results
