"""What a schema of its own costs per call (docs/design/schema.md).

Migration 0004 pins every function of the queue to its schema (`SET search_path` on
the function), so each call of a function and each firing of a trigger sets and
restores one setting. Three near-empty databases side by side, one free item each:
the queue pinned in public (as shipped), the same with the pinning undone (as before
0004: the functions resolve names by the caller's search_path), and the queue in a
schema of its own (`schema=`, statements schema-qualified, functions pinned). Every
sample claims through the store and releases the item again; enqueues are timed too
(a scoped enqueue fires the arrive trigger). The claim SQL is also timed on a plain
connection, unpinned, pinned, and with the alternative to pinning, a `SET LOCAL
search_path` as the transaction's first statement. Samples are interleaved.
"""

from __future__ import annotations

# trio_asyncio before psycopg, or psycopg's async calls find no running event loop.
import trio_asyncio  # noqa: F401  isort: skip

import contextlib
import itertools
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import trio

from bench.common import QUERIES, Server, connect, ratio, save, show, summary_ms
from bench.hol import CLAIM, CLAIM_PARAMS, store_sample
from trioworker import PostgresStore, migrate, open_store

TENANT = "bench_tenant"
Sampler = Callable[[], Awaitable[float]]
_enqueued = itertools.count()


def load(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        QUERIES["insert_queued"],
        {"kind": "Free", "prefix": "free-", "scopes": 1, "n": 1, "age": 0},
    )


async def enqueue_sample(store: PostgresStore) -> float:
    """One scoped enqueue of an item no claim takes (the arrive trigger fires)."""
    n = next(_enqueued)
    t0 = time.perf_counter()
    await store.enqueue("Filler", scope=f"filler-{n % 50}")
    return time.perf_counter() - t0


def sql_sample(conn: psycopg.Connection[Any], *, set_local: bool) -> float:
    """The claim statement in a transaction rolled back after; with `set_local`, a
    SET LOCAL search_path first, timed with it."""
    conn.execute("BEGIN")
    try:
        t0 = time.perf_counter()
        if set_local:
            conn.execute(QUERIES["set_local_search_path"])
        row = conn.execute(CLAIM, CLAIM_PARAMS).fetchone()
        elapsed = time.perf_counter() - t0
    finally:
        conn.execute("ROLLBACK")
    if row is None:
        raise AssertionError("the claim SQL found nothing to claim")
    return elapsed


def server_sample(conn: psycopg.Connection[Any], what: str, n: int) -> float:
    """Seconds per claim of `n` claims, or per row of an `n`-row insert, timed inside
    PostgreSQL."""
    if what == "claim":
        row = conn.execute(QUERIES["server_claims"], {"n": n}).fetchone()
        assert row is not None
        return float(row[0])
    conn.execute("BEGIN")
    try:
        plan = "\n".join(r[0] for r in conn.execute(QUERIES["server_insert"], {"n": n}))
    finally:
        conn.execute("ROLLBACK")
    found = re.search(r"Execution Time: ([\d.]+) ms", plan)
    assert found is not None, plan
    return float(found[1]) / 1000 / n


def server_side(pinned: str, unpinned: str, rounds: int, n: int) -> dict[str, list[float]]:
    """Interleaved server-side series, pinned against unpinned, on warm sessions."""
    samples: dict[str, list[float]] = {}
    with connect(pinned) as p, connect(unpinned) as u:
        for conn in (p, u):
            conn.autocommit = True
            conn.execute(QUERIES["server_loop_function"])
            for what in ("claim", "insert"):  # warm up
                server_sample(conn, what, 20)
        for _ in range(rounds):
            for what in ("claim", "insert"):
                for label, conn in (("pinned", p), ("unpinned", u)):
                    key = f"server {what} {label}"
                    samples.setdefault(key, []).append(server_sample(conn, what, n))
    return samples


async def measure(
    pinned: str, unpinned: str, tenant: str, rounds: int, per_round: int
) -> dict[str, list[float]]:
    async with contextlib.AsyncExitStack() as stack:
        series: dict[str, Sampler] = {}
        conns = []
        for label, dsn, schema in (
            ("pinned", pinned, None), ("unpinned", unpinned, None), ("own schema", tenant, TENANT),
        ):  # fmt: skip
            # No wait for the commit's WAL flush: it costs more than the statement.
            no_flush = psycopg.conninfo.make_conninfo(dsn, options="-c synchronous_commit=off")
            store = await stack.enter_async_context(
                open_store(no_flush, max_connections=1, schema=schema)
            )
            series[f"store.claim {label}"] = lambda s=store: store_sample(s)
            series[f"store.enqueue {label}"] = lambda s=store: enqueue_sample(s)
        for label, dsn, set_local in (
            ("pinned", pinned, False), ("unpinned", unpinned, False),
            ("unpinned + SET LOCAL", unpinned, True),
        ):  # fmt: skip
            conn = stack.enter_context(connect(dsn))
            conns.append(conn)

            async def sample(c: psycopg.Connection[Any] = conn, s: bool = set_local) -> float:
                return sql_sample(c, set_local=s)

            series[f"claim SQL {label}"] = sample
        samples: dict[str, list[float]] = {name: [] for name in series}
        for sampler in series.values():  # warm up: connections, plans, caches
            for _ in range(5):
                await sampler()
        for _ in range(rounds):
            for conn in conns[:2]:
                conn.execute(QUERIES["vacuum"])
            for _ in range(per_round):
                for name, sampler in series.items():
                    samples[name].append(await sampler())
        return samples


def run(srv: Server, rounds: int, per_round: int) -> dict[str, Any]:
    with (
        srv.database("schema_pinned") as pinned,
        srv.database("schema_unpinned") as unpinned,
        srv.database("schema_tenant", migrated=False) as tenant,
    ):
        migrate(tenant, schema=TENANT)
        for dsn in (pinned, unpinned):
            with connect(dsn) as conn:
                load(conn)
        with connect(unpinned) as conn:
            conn.execute(QUERIES["unpin_functions"])
        in_tenant = psycopg.conninfo.make_conninfo(tenant, options=f"-csearch_path={TENANT}")
        with connect(in_tenant) as conn:
            load(conn)
        samples = trio.run(measure, pinned, unpinned, tenant, rounds, per_round)
        samples.update(server_side(pinned, unpinned, rounds * 4, 200))
    series = {name: summary_ms(values) for name, values in samples.items()}

    def median(name: str) -> float:
        return float(series[name]["median_ms"])

    def vs(a: str, b: str) -> float:
        return ratio(series[a]["median_ms"], series[b]["median_ms"])

    return {
        "series": series,
        "ratios": {
            "store_claim_pinned_vs_unpinned": vs("store.claim pinned", "store.claim unpinned"),
            "store_claim_own_schema_vs_unpinned": vs(
                "store.claim own schema", "store.claim unpinned"
            ),
            "store_enqueue_pinned_vs_unpinned": vs(
                "store.enqueue pinned", "store.enqueue unpinned"
            ),
            "store_enqueue_own_schema_vs_unpinned": vs(
                "store.enqueue own schema", "store.enqueue unpinned"
            ),
            "claim_sql_pinned_vs_unpinned": vs("claim SQL pinned", "claim SQL unpinned"),
            "claim_sql_set_local_vs_unpinned": vs(
                "claim SQL unpinned + SET LOCAL", "claim SQL unpinned"
            ),
            "server_claim_pinned_vs_unpinned": vs("server claim pinned", "server claim unpinned"),
            "server_insert_pinned_vs_unpinned": vs(
                "server insert pinned", "server insert unpinned"
            ),
        },
        "pin_cost_us": {
            what: 1000 * (median(f"server {what} pinned") - median(f"server {what} unpinned"))
            for what in ("claim", "insert")
        },
    }


def report(result: dict[str, Any]) -> None:
    s = result["series"]
    show(
        "A schema of its own: per-call cost (near-empty queue)",
        ["series", "median ms", "p99 ms", "min ms", "n"],
        [[name, v["median_ms"], v["p99_ms"], v["min_ms"], v["n"]] for name, v in s.items()],
    )
    for name, value in result["ratios"].items():
        print(f"  {name}: {value:.3f}")
    for what, us in result["pin_cost_us"].items():
        print(f"  the pinned search_path adds {us:.1f} us to each {what}, inside PostgreSQL")


def main(srv: Server, quick: bool, out: Any) -> dict[str, Any]:
    rounds, per_round = (3, 20) if quick else (10, 60)
    result = run(srv, rounds, per_round)
    report(result)
    path = save(out, "schema", srv, {"rounds": rounds, "per_round": per_round}, result)
    print(f"  -> {path}")
    return {"schema": result}
