"""Retention: `prune` (delete_finished in batches) on 1 M finished rows, beside the
naive one-statement DELETE on an identical database, while a prober does a Worker's
round trip (enqueue, claim, complete) on each database.

A deleted row stays locked until its transaction ends, so "how long is any row held"
is each batch's duration for prune and the whole statement's for the naive DELETE.
The prober's rounds show whether live work is held up meanwhile.
"""

from __future__ import annotations

# trio_asyncio before psycopg, or psycopg's async calls find no running event loop.
import trio_asyncio  # isort: skip

import datetime as dt
import time
from pathlib import Path
from typing import Any

import trio

from bench.common import QUERIES, Server, connect, ratio, save, show, summary_ms
from trioworker import PostgresStore, open_store

KEEP_QUEUED = 10_000


def load(dsn: str, rows: int) -> None:
    with connect(dsn) as conn:
        conn.execute(QUERIES["insert_finished"], {"n": rows, "days": 30})
        conn.execute(
            QUERIES["insert_queued"],
            {"kind": "Keep", "prefix": "keep-", "scopes": 100, "n": KEEP_QUEUED, "age": 0},
        )
        conn.execute("VACUUM ANALYZE work_items")


async def probe_while(store: PostgresStore, job: Any, samples: list[float]) -> tuple[float, Any]:
    """Run `job()` while probing; (its seconds, its result)."""
    result: Any = None
    seconds = 0.0

    async def prober(done: trio.Event) -> None:
        while not done.is_set():
            began = time.perf_counter()
            item = await store.enqueue("Probe", scope="probe")
            claimed = await store.claim("prober", 60, kinds=["Probe"])
            assert claimed is not None and claimed.id == item.id
            await store.complete(claimed.id, claimed.attempt)
            samples.append(time.perf_counter() - began)

    done = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(prober, done)
        began = time.perf_counter()
        result = await job()
        seconds = time.perf_counter() - began
        done.set()
    return seconds, result


async def measure(batched_dsn: str, naive_dsn: str) -> dict[str, Any]:
    batches: list[float] = []
    probes: dict[str, list[float]] = {"idle": [], "prune": [], "naive DELETE": []}
    async with (
        open_store(batched_dsn, call_timeout=600) as batched,
        open_store(naive_dsn, call_timeout=600) as naive,
    ):

        async def idle() -> None:
            await trio.sleep(3)

        await probe_while(batched, idle, probes["idle"])
        prune_s, deleted = await probe_while(
            batched,
            lambda: batched.delete_finished(
                dt.timedelta(days=7), on_batch=lambda _, s: batches.append(s)
            ),
            probes["prune"],
        )

        async def at_once() -> int:
            async with naive.transaction() as tx:
                rows = await tx.execute(QUERIES["delete_finished_at_once"], {"days": 7})
                return int(rows[0][0])

        naive_s, _ = await probe_while(naive, at_once, probes["naive DELETE"])
    return {
        "deleted": deleted,
        "prune_seconds": prune_s,
        "batches": summary_ms(batches),
        "longest_batch_s": max(batches),
        "naive_seconds": naive_s,
        "probes": {
            name: {**summary_ms(values), "max_ms": max(values) * 1000}
            for name, values in probes.items()
        },
    }


def main(srv: Server, quick: bool, out: Path) -> dict[str, Any]:
    rows = 100_000 if quick else 1_000_000
    with srv.database("prune_batched") as batched, srv.database("prune_naive") as naive:
        load(batched, rows)
        load(naive, rows)
        result = trio_asyncio.run(measure, batched, naive)
        with connect(batched) as conn:
            left = conn.execute(
                "SELECT count(*) FROM work_items WHERE kind = 'Keep' AND status = 'Queued'"
            ).fetchone()
    assert left == (KEEP_QUEUED,), left
    assert result["deleted"] == rows, result["deleted"]
    longest = result["longest_batch_s"]
    show(
        f"Retention: {rows:,} finished rows (and {KEEP_QUEUED:,} Queued, untouched)",
        ["delete", "total s", "longest lock s", "prober p50 ms", "prober p99 ms",
         "prober max ms"],
        [["prune (batches of 1,000)", result["prune_seconds"], longest,
          result["probes"]["prune"]["median_ms"], result["probes"]["prune"]["p99_ms"],
          result["probes"]["prune"]["max_ms"]],
         ["one DELETE statement", result["naive_seconds"], result["naive_seconds"],
          result["probes"]["naive DELETE"]["median_ms"],
          result["probes"]["naive DELETE"]["p99_ms"],
          result["probes"]["naive DELETE"]["max_ms"]],
         ["(prober, nothing deleting)", "", "",
          result["probes"]["idle"]["median_ms"], result["probes"]["idle"]["p99_ms"],
          result["probes"]["idle"]["max_ms"]]],
    )  # fmt: skip
    slowdown = ratio(result["probes"]["prune"]["p99_ms"], result["probes"]["idle"]["p99_ms"])
    print(
        f"  longest row lock: prune {longest:.3f}s (target < 1 s:"
        f" {'met' if longest < 1.0 else 'MISSED'}) vs one statement"
        f" {result['naive_seconds']:.1f}s ({ratio(result['naive_seconds'], longest):.0f}x);"
        f" prober p99 during prune {slowdown:.2f}x idle"
    )
    path = save(out, "prune", srv, {"rows": rows}, result)
    print(f"  -> {path}")
    return {"prune": result}
