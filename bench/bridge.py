"""Per-statement cost: the Trio store's own path beside the trio-asyncio bridge it
replaced and psycopg's sync API, in client CPU time.

Three statements, each sent on one connection of each path, with the store's
connection settings (autocommit, no prepared statements):

- `SELECT $1` (one parameter, one row);
- the heartbeat UPDATE of a Running item (`bridge_heartbeat`, the store's statement);
- 40 whole rows of work_items back (`bridge_forty_rows`).

Paths, all in one Trio run:

- psycopg's sync API (`psycopg.Connection`, blocking the Trio task);
- psycopg's asyncio API awaited through trio-asyncio (`aio_as_trio`): what every store
  call paid before issue 33, less the pool and the time bound;
- psycopg's async API waited on by Trio directly (trioworker's `TrioConnection`: the
  one private name this bench imports, by leave of the import contract);
- for the heartbeat, the store's whole path too (`store.heartbeat`: pool checkout,
  time bound, error translation).

A round runs each series for `calls` calls in a row, timing the batch's process CPU
time (and wall time); series take turns within a round, their order rotating from
round to round. The figure is the median over rounds of the CPU time a call.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import trio
import trio_asyncio

from bench.common import QUERIES, Server, save, show
from trioworker import PostgresStore, open_store
from trioworker._postgres.trio_connection import TrioConnection

STATEMENTS = {
    "SELECT $1": ("SELECT %s::int", [1]),
    "heartbeat UPDATE": (QUERIES["bridge_heartbeat"], {"id": 0, "attempt": 1, "lease": 60}),
    "40 rows back": (QUERIES["bridge_forty_rows"], None),
}
PATHS = ["psycopg sync", "trio-asyncio bridge", "Trio native", "store (native)"]
Call = Callable[[], Awaitable[Any]]


def settings() -> dict[str, Any]:
    """As the store connects: autocommit, no server-side prepared statements."""
    return {"application_name": "trioworker-bench", "autocommit": True, "prepare_threshold": None}


def series(
    store: PostgresStore,
    sync: psycopg.Connection[Any],
    bridged: psycopg.AsyncConnection[Any],
    native: TrioConnection[Any],
    item: int,
) -> dict[tuple[str, str], Call]:
    calls: dict[tuple[str, str], Call] = {}
    for name, (query, given) in STATEMENTS.items():
        params = {**given, "id": item} if isinstance(given, dict) else given

        async def on_sync(q: Any = query, p: Any = params) -> Any:
            return sync.execute(q, p).fetchall()

        @trio_asyncio.aio_as_trio
        async def on_bridge(q: Any = query, p: Any = params) -> Any:
            return await (await bridged.execute(q, p)).fetchall()

        async def on_native(q: Any = query, p: Any = params) -> Any:
            return await (await native.execute(q, p)).fetchall()

        calls[(name, "psycopg sync")] = on_sync
        calls[(name, "trio-asyncio bridge")] = on_bridge
        calls[(name, "Trio native")] = on_native

    async def on_store() -> Any:
        return await store.heartbeat(item, 1, 60)

    calls[("heartbeat UPDATE", "store (native)")] = on_store
    return calls


async def measure(
    dsn: str, rounds: int, calls: int
) -> dict[tuple[str, str], dict[str, list[float]]]:
    samples: dict[tuple[str, str], dict[str, list[float]]] = {}
    async with trio_asyncio.open_loop(), open_store(dsn, max_connections=1) as store:
        open_async = trio_asyncio.aio_as_trio(psycopg.AsyncConnection.connect)
        bridged = await open_async(dsn, **settings())
        native = await TrioConnection.connect(dsn, **settings())
        with psycopg.connect(dsn, **settings()) as sync:
            sync.execute(QUERIES["insert_running"], {"prefix": "bench-", "scopes": 40})
            row = sync.execute("SELECT min(id) FROM work_items").fetchone()
            assert row is not None
            each = series(store, sync, bridged, native, int(row[0]))
            for call in each.values():  # warm up
                for _ in range(50):
                    await call()
            order = list(each.items())
            for round_ in range(rounds):
                shift = round_ % len(order)
                for key, call in order[shift:] + order[:shift]:
                    cpu, wall = time.process_time(), time.perf_counter()
                    for _ in range(calls):
                        await call()
                    taken = samples.setdefault(key, {"cpu": [], "wall": []})
                    taken["cpu"].append((time.process_time() - cpu) / calls)
                    taken["wall"].append((time.perf_counter() - wall) / calls)
        await native.close()
        await trio_asyncio.aio_as_trio(bridged.close)()
    return samples


def main(srv: Server, quick: bool, out: Path) -> dict[str, Any]:
    rounds, calls = (3, 100) if quick else (7, 400)
    with srv.database("bridge") as dsn:
        samples = trio.run(measure, dsn, rounds, calls)
    us = {
        key: {kind: statistics.median(v) * 1e6 for kind, v in taken.items()}
        for key, taken in samples.items()
    }
    rows = []
    for name in STATEMENTS:
        got = {path: us[(name, path)] for path in PATHS if (name, path) in us}
        native, sync = got["Trio native"]["cpu"], got["psycopg sync"]["cpu"]
        for path, v in got.items():
            rows.append([f"{name}: {path}", v["cpu"], v["wall"], v["cpu"] / native,
                         v["cpu"] / sync])  # fmt: skip
    show(
        f"CPU time a call (µs), medians of {rounds} rounds x {calls} calls",
        ["statement: path", "CPU µs", "wall µs", "x native", "x sync"],
        rows,
    )
    results = {f"{name} | {path}": v for (name, path), v in us.items()}
    print(f"  -> {save(out, 'bridge', srv, {'rounds': rounds, 'calls': calls}, results)}")
    return results
