"""Bridge cost: what the store's trio-asyncio path adds to one trivial query.

Series, each timed call by call on one connection with the store's connection settings:

- psycopg's sync API;
- psycopg's async API under plain asyncio (what psycopg itself costs when async);
- that coroutine awaited from Trio through trio-asyncio (`aio_as_trio`, what the store's
  bridge builds on);
- the store's full path (pool checkout, call timeout, error translation): a named store
  query (`store.query`) against the same SQL sent sync.

Rounds alternate between asyncio and Trio, and the series within a Trio round are
interleaved call by call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import trio

# trio_asyncio before psycopg, or psycopg's async calls find no running event loop.
import trio_asyncio

from bench.common import QUERIES, Server, save, show, summary_ms
from trioworker import PostgresStore, open_store

TRIVIAL = "SELECT 1"
NAMED = "pauses"  # one store read, one statement: the pauses table, empty
BRIDGED = "trio -> trio-asyncio -> psycopg async: SELECT 1"


def kwargs(dsn: str) -> dict[str, Any]:
    return {"application_name": "trioworker-bench", "autocommit": True}


async def asyncio_round(dsn: str, calls: int) -> list[float]:
    conn = await psycopg.AsyncConnection.connect(dsn, **kwargs(dsn))
    try:
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            await (await conn.execute(TRIVIAL)).fetchall()
            samples.append(time.perf_counter() - t0)
        return samples
    finally:
        await conn.close()


async def trio_round(dsn: str, calls: int) -> dict[str, list[float]]:
    async with open_store(dsn, max_connections=1) as store:
        aconn = await trio_asyncio.aio_as_trio(psycopg.AsyncConnection.connect)(dsn, **kwargs(dsn))
        with psycopg.connect(dsn, **kwargs(dsn)) as sconn:
            series = _trio_series(store, aconn, sconn)
            samples: dict[str, list[float]] = {name: [] for name in series}
            for call in series.values():  # warm up
                for _ in range(20):
                    await call()
            for _ in range(calls):
                for name, call in series.items():
                    t0 = time.perf_counter()
                    await call()
                    samples[name].append(time.perf_counter() - t0)
        await trio_asyncio.aio_as_trio(aconn.close)()
        return samples


def _trio_series(
    store: PostgresStore,
    aconn: psycopg.AsyncConnection[Any],
    sconn: psycopg.Connection[Any],
) -> dict[str, Callable[[], Awaitable[Any]]]:
    named_sql = QUERIES[NAMED]

    async def sync_trivial() -> Any:
        return sconn.execute(TRIVIAL).fetchall()

    @trio_asyncio.aio_as_trio
    async def bridged() -> Any:
        return await (await aconn.execute(TRIVIAL)).fetchall()

    async def sync_named() -> Any:
        return sconn.execute(named_sql).fetchall()

    async def store_named() -> Any:
        return await store.pauses()

    return {
        "psycopg sync: SELECT 1": sync_trivial,
        BRIDGED: bridged,
        f"psycopg sync: {NAMED}": sync_named,
        "store.pauses()": store_named,
    }


def measure(dsn: str, rounds: int, calls: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"psycopg async (asyncio): SELECT 1": []}
    for _ in range(rounds):
        samples["psycopg async (asyncio): SELECT 1"] += asyncio.run(asyncio_round(dsn, calls))
        for name, values in trio.run(trio_round, dsn, calls).items():
            samples.setdefault(name, []).extend(values)
    return samples


def main(srv: Server, quick: bool, out: Path) -> dict[str, Any]:
    rounds, calls = (2, 300) if quick else (6, 2000)
    with srv.database("bridge") as dsn:
        samples = measure(dsn, rounds, calls)
    series = {name: summary_ms(values) for name, values in samples.items()}
    base = series["psycopg sync: SELECT 1"]["median_ms"]
    base_named = series[f"psycopg sync: {NAMED}"]["median_ms"]
    rows = []
    for name, s in series.items():
        reference = base_named if NAMED in name else base
        rows.append([name, s["median_ms"] * 1000, s["p99_ms"] * 1000,
                     (s["median_ms"] - reference) * 1000, s["median_ms"] / reference])  # fmt: skip
    show(
        "Bridge cost per call (us); overhead against psycopg sync on the same SQL",
        ["path", "median us", "p99 us", "overhead us (median)", "x sync"],
        rows,
    )
    results: dict[str, Any] = {
        "series": series,
        "overhead_us": {
            "bridge_vs_sync": (series[BRIDGED]["median_ms"] - base) * 1000,
            "bridge_vs_asyncio": (series[BRIDGED]["median_ms"]
                                  - series["psycopg async (asyncio): SELECT 1"]["median_ms"])
            * 1000,
            "store_path_vs_sync": (series["store.pauses()"]["median_ms"]
                                   - series[f"psycopg sync: {NAMED}"]["median_ms"]) * 1000,
        },
    }  # fmt: skip
    o = results["overhead_us"]
    print(
        f"  bridge adds {o['bridge_vs_sync']:.0f} us over sync ({o['bridge_vs_asyncio']:.0f} us"
        f" over plain asyncio); the store's whole path adds {o['store_path_vs_sync']:.0f} us"
    )
    print(f"  -> {save(out, 'bridge', srv, {'rounds': rounds, 'calls': calls}, results)}")
    return results
