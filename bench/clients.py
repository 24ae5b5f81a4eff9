"""Enqueue cost through each way in: the Trio store, `Client` and `AsyncClient`.

One enqueue (an item with a payload, its own statement, committed) timed call by call,
through each of the three, in rounds that alternate between them on one database: the
Trio store (`open_store`, from Trio), `Client` (psycopg's sync API, its own pool) and
`AsyncClient` (psycopg's asyncio API on a plain asyncio loop, its own pool). All three
send the same statement (`_postgres/operations.py`), so the differences are the paths:
the Trio store's trio-asyncio bridge and call bounds, psycopg's sync and asyncio APIs.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import trio

from bench.common import Server, save, show, summary_ms
from trioworker import AsyncClient, Client, open_store

PAYLOAD = {"path": "/media/2026/12/holiday.jpg", "size": 4_200_000}


async def trio_round(dsn: str, calls: int) -> list[float]:
    async with open_store(dsn, max_connections=1) as store:
        for _ in range(20):  # warm up
            await store.enqueue("Bench", payload=PAYLOAD)
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await store.enqueue("Bench", payload=PAYLOAD)
            samples.append(time.perf_counter() - t0)
        return samples


def sync_round(dsn: str, calls: int) -> list[float]:
    with Client(dsn, max_connections=1) as client:
        for _ in range(20):
            client.enqueue("Bench", payload=PAYLOAD)
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            client.enqueue("Bench", payload=PAYLOAD)
            samples.append(time.perf_counter() - t0)
        return samples


async def asyncio_round(dsn: str, calls: int) -> list[float]:
    async with AsyncClient(dsn, max_connections=1) as client:
        for _ in range(20):
            await client.enqueue("Bench", payload=PAYLOAD)
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await client.enqueue("Bench", payload=PAYLOAD)
            samples.append(time.perf_counter() - t0)
        return samples


def measure(dsn: str, rounds: int, calls: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"Client": [], "AsyncClient": [], "Trio store": []}
    for _ in range(rounds):
        samples["Client"] += sync_round(dsn, calls)
        # A plain asyncio loop: bench imports trio-asyncio, which replaces asyncio's own.
        with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
            samples["AsyncClient"] += runner.run(asyncio_round(dsn, calls))
        samples["Trio store"] += trio.run(trio_round, dsn, calls)
    return samples


def main(srv: Server, quick: bool, out: Path) -> dict[str, Any]:
    rounds, calls = (2, 200) if quick else (5, 1000)
    with srv.database("clients") as dsn:
        samples = measure(dsn, rounds, calls)
    series = {name: summary_ms(values) for name, values in samples.items()}
    base = series["Client"]["median_ms"]
    rows = [
        [name, s["median_ms"] * 1000, s["p99_ms"] * 1000, s["median_ms"] / base]
        for name, s in series.items()
    ]
    show("One enqueue (us), side by side", ["way in", "median us", "p99 us", "x Client"], rows)
    print(f"  -> {save(out, 'clients', srv, {'rounds': rounds, 'calls': calls}, series)}")
    return series
