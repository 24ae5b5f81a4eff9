"""Head-of-line claim: what a claim costs when work piles up behind busy scopes.

Two databases side by side: one holding the backlog, one empty but for one free item.
Every sample claims through the store and releases the item again (so each sample sees
the same backlog); the same claim SQL (also with its plan cached, as a diagnostic), and
the baseline plain NOT EXISTS claim (no scope-heads filter), are also timed on a plain
psycopg connection, inside a transaction that is rolled back. Samples of every series
are interleaved, and both databases are vacuumed between rounds, so the series differ
only in the backlog.
"""

from __future__ import annotations

# trio_asyncio before psycopg, or psycopg's async calls find no running event loop.
import trio_asyncio  # noqa: F401  isort: skip

import contextlib
import functools
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import psycopg
import trio

from bench.common import QUERIES, Server, connect, ratio, save, show, summary_ms
from trioworker import PostgresStore, open_store

LEASE = 60.0
#: The kinds the benchmark's Worker serves: the free item's only.
KINDS = ["Free"]
CLAIM_PARAMS = {"worker_id": "bench", "lease": LEASE, "kinds": KINDS}
CLAIM = QUERIES["claim"]


@attrs.frozen
class Shape:
    key: str
    title: str
    busy_scopes: int  # each with one Running item
    behind: int  # Queued items behind the busy scopes, older than any free item
    free_scopes: int
    free_items: int
    #: Due items of a kind the Worker does not serve, older than any free item, half
    #: unscoped and half over free scopes of their own.
    other_kinds: int = 0
    #: Paused scopes, each with `behind // paused_scopes` due items of the served kind,
    #: older than any free item (`python -m trioworker pause --scope`).
    paused_scopes: int = 0
    #: Scopes whose rate window is spent (10 starts a day, all used just now), each with
    #: `behind // spent_scopes` due items of the served kind, older than any free item:
    #: their heads stay heads, so each claim reads past them.
    spent_scopes: int = 0
    #: Due items of a served kind held back by a limit (docs/design/limits.md), older
    #: than any free item, half unscoped and half over 1,000 scopes: "limit" (the kind at
    #: its global running limit of 8, all 8 slots busy) or "rate" (its rate window spent).
    held: int = 0
    held_by: str = ""
    #: Due items of the served kind Waiting for parents that run (`after=`, issue 34),
    #: older than any free item, each after one of `busy_scopes` Running items.
    waiting: int = 0

    @property
    def kinds(self) -> list[str]:
        return [*KINDS, "Held"] if self.held else KINDS

    @property
    def plain(self) -> bool:
        """Whether the plain baseline is measured: it knows no limits, so it would take
        a held or rate-spent item."""
        return not (self.held or self.spent_scopes)

    @property
    def rows(self) -> int:
        return (self.busy_scopes + self.behind + self.free_items + self.other_kinds + self.held
                + self.waiting)  # fmt: skip


SHAPES = {
    "full": [
        Shape("a", "1,000 busy scopes x 100 queued, 1 free item", 1000, 100_000, 1, 1),
        Shape("b", "1 M queued: 99% behind 1 busy scope, 1% over 1,000 free",
              1, 990_000, 1000, 10_000),
        Shape("c", "100,000 due items of kinds this Worker does not serve, 1 free item",
              0, 0, 1, 1, other_kinds=100_000),
        Shape("d", "1,000 paused scopes x 100 queued of the served kind, 1 free item",
              0, 100_000, 1, 1, paused_scopes=1000),
        Shape("e", "100,000 due items of a served kind at its global limit (8 of 8"
              " Running), 1 free item", 0, 0, 1, 1, held=100_000, held_by="limit"),
        Shape("f", "100,000 due items of a served kind whose rate window is spent,"
              " 1 free item", 0, 0, 1, 1, held=100_000, held_by="rate"),
        Shape("g", "100,000 due items of the served kind Waiting for 1,000 Running"
              " parents (after=), 1 free item", 1000, 0, 1, 1, waiting=100_000),
        Shape("h", "1,000 scopes whose rate window is spent x 100 queued of the served"
              " kind, 1 free item", 0, 100_000, 1, 1, spent_scopes=1000),
    ],
    "quick": [
        Shape("a", "100 busy scopes x 100 queued, 1 free item", 100, 10_000, 1, 1),
        Shape("b", "100 k queued: 99% behind 1 busy scope, 1% over 100 free",
              1, 99_000, 100, 1_000),
        Shape("c", "10,000 due items of kinds this Worker does not serve, 1 free item",
              0, 0, 1, 1, other_kinds=10_000),
        Shape("d", "100 paused scopes x 100 queued of the served kind, 1 free item",
              0, 10_000, 1, 1, paused_scopes=100),
        Shape("e", "10,000 due items of a served kind at its global limit (8 of 8"
              " Running), 1 free item", 0, 0, 1, 1, held=10_000, held_by="limit"),
        Shape("f", "10,000 due items of a served kind whose rate window is spent,"
              " 1 free item", 0, 0, 1, 1, held=10_000, held_by="rate"),
        Shape("g", "10,000 due items of the served kind Waiting for 100 Running"
              " parents (after=), 1 free item", 100, 0, 1, 1, waiting=10_000),
        Shape("h", "100 scopes whose rate window is spent x 100 queued of the served"
              " kind, 1 free item", 0, 10_000, 1, 1, spent_scopes=100),
    ],
}  # fmt: skip


def hold(conn: psycopg.Connection[Any], held_by: str) -> None:
    """Kind Held at its limit: 8 of 8 Running, or its rate window (10 a day) spent."""
    if held_by == "limit":
        conn.execute(
            QUERIES["set_limit"], {"kind": "Held", "running": 8, "rate": None, "per": None}
        )
        conn.execute(QUERIES["insert_running_of_kind"], {"kind": "Held", "n": 8})
    else:
        conn.execute(
            QUERIES["set_limit"], {"kind": "Held", "running": None, "rate": 10, "per": 86400.0}
        )
        conn.execute(QUERIES["spend_rate"], {"kind": "Held"})


def load(conn: psycopg.Connection[Any], shape: Shape | None, held_by: str = "") -> None:
    """The backlog of `shape` (None: just one free item, and the limit `held_by` with
    nothing behind it), analysed and vacuumed."""
    if held_by:
        hold(conn, held_by)
    if shape is not None and shape.held:
        for prefix, scopes in (("held-", 1000), ("", 0)):
            conn.execute(
                QUERIES["insert_queued"],
                {"kind": "Held", "prefix": prefix, "scopes": scopes, "n": shape.held // 2,
                 "age": 3600},
            )  # fmt: skip
    elif shape is not None and shape.paused_scopes:
        conn.execute(
            QUERIES["insert_queued"],
            {"kind": "Free", "prefix": "paused-", "scopes": shape.paused_scopes,
             "n": shape.behind, "age": 3600},
        )  # fmt: skip
        conn.execute(QUERIES["pause_scopes"], {"prefix": "paused-", "scopes": shape.paused_scopes})
    elif shape is not None and shape.spent_scopes:
        spent = {"prefix": "spent-", "scopes": shape.spent_scopes}
        conn.execute(
            QUERIES["insert_queued"],
            {"kind": "Free", **spent, "n": shape.behind, "age": 3600},
        )
        conn.execute(QUERIES["limit_scope_rates"], spent)
        conn.execute(QUERIES["spend_scope_rates"], spent)
        conn.execute(QUERIES["settle_scopes"], spent)
    elif shape is not None and shape.waiting:
        conn.execute(QUERIES["insert_running"], {"prefix": "busy-", "scopes": shape.busy_scopes})
        conn.execute(QUERIES["insert_waiting"], {"kind": "Free", "n": shape.waiting})
    elif shape is not None:
        conn.execute(QUERIES["insert_running"], {"prefix": "busy-", "scopes": shape.busy_scopes})
        conn.execute(
            QUERIES["insert_queued"],
            {"kind": "Behind", "prefix": "busy-", "scopes": shape.busy_scopes,
             "n": shape.behind, "age": 3600},
        )  # fmt: skip
        for prefix, scopes in (("other-", 1000), ("", 0)):
            conn.execute(
                QUERIES["insert_queued"],
                {"kind": "Other", "prefix": prefix, "scopes": scopes,
                 "n": shape.other_kinds // 2, "age": 3600},
            )  # fmt: skip
    free_scopes, free_items = (shape.free_scopes, shape.free_items) if shape else (1, 1)
    conn.execute(
        QUERIES["insert_queued"],
        {"kind": "Free", "prefix": "free-", "scopes": free_scopes, "n": free_items, "age": 0},
    )
    conn.execute(QUERIES["plain_index"])
    conn.execute("VACUUM ANALYZE work_items")


def _check(row: Any) -> None:
    scope = row["scope"] if isinstance(row, dict) else row[2]
    if not (isinstance(scope, str) and scope.startswith("free-")):
        raise AssertionError(f"the claim took {scope!r}, not an item of a free scope")


async def store_sample(store: PostgresStore, kinds: list[str]) -> float:
    """One claim through the store; the item is released again (not timed)."""
    t0 = time.perf_counter()
    item = await store.claim("bench", LEASE, kinds=kinds)
    elapsed = time.perf_counter() - t0
    if item is None:
        raise AssertionError("the store's claim found nothing to claim")
    _check({"scope": item.scope})
    await store.release(item.id, item.attempt)
    return elapsed


def sync_sample(conn: psycopg.Connection[Any], query: str, kinds: list[str]) -> float:
    """One claim statement on a sync connection, in a transaction rolled back after."""
    conn.execute("BEGIN")
    try:
        t0 = time.perf_counter()
        row = conn.execute(query, {**CLAIM_PARAMS, "kinds": kinds}).fetchone()
        elapsed = time.perf_counter() - t0
    finally:
        conn.execute("ROLLBACK")
    _check(row)
    return elapsed


def explain(conn: psycopg.Connection[Any], query: str, kinds: list[str]) -> str:
    conn.execute("BEGIN")
    try:
        rows = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS) " + query,
            {**CLAIM_PARAMS, "kinds": kinds},
        ).fetchall()
    finally:
        conn.execute("ROLLBACK")
    return "\n".join(r[0] for r in rows)


Sampler = Callable[[], Awaitable[float]]

#: Diagnostic series. The store's claim with synchronous_commit off: what the claim
#: costs without waiting for its commit's WAL flush. The claim SQL with a generic plan
#: (plan_cache_mode=force_generic_plan): what it costs without planning on each call.
NO_FLUSH = "store.claim, no flush wait"
GENERIC = "claim SQL, generic plan"
LABELS = ("store.claim", NO_FLUSH, "claim SQL", GENERIC, "plain NOT EXISTS")


def with_options(dsn: str, options: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, options=options)


def sync(conn: psycopg.Connection[Any], query: str, kinds: list[str]) -> Sampler:
    async def sample() -> float:
        return sync_sample(conn, query, kinds)

    return sample


def claims(store: PostgresStore, kinds: list[str]) -> Sampler:
    return lambda: store_sample(store, kinds)


async def measure(
    backlog_dsn: str,
    empty_dsn: str,
    rounds: int,
    per_round: int,
    plain_per_round: int,
    *,
    kinds: list[str],
    plain_too: bool,
) -> dict[str, list[float]]:
    """Samples (seconds) of each series, interleaved sample by sample."""
    claim, plain = CLAIM, QUERIES["plain_claim"]
    async with contextlib.AsyncExitStack() as stack:
        series: dict[str, tuple[Sampler, int]] = {}
        conns = []
        for where, dsn in (("backlog", backlog_dsn), ("near-empty", empty_dsn)):
            store = await stack.enter_async_context(open_store(dsn, max_connections=1))
            no_flush = await stack.enter_async_context(
                open_store(with_options(dsn, "-c synchronous_commit=off"), max_connections=1)
            )
            conn = stack.enter_context(connect(dsn))
            cached = stack.enter_context(
                connect(with_options(dsn, "-c plan_cache_mode=force_generic_plan"))
            )
            conns.append(conn)
            series[f"store.claim {where}"] = (claims(store, kinds), per_round)
            series[f"{NO_FLUSH} {where}"] = (claims(no_flush, kinds), per_round)
            series[f"claim SQL {where}"] = (sync(conn, claim, kinds), per_round)
            series[f"{GENERIC} {where}"] = (sync(cached, claim, kinds), per_round)
            if plain_too:
                series[f"plain NOT EXISTS {where}"] = (
                    sync(conn, plain, kinds),
                    plain_per_round if where == "backlog" else per_round,
                )
        samples: dict[str, list[float]] = {name: [] for name in series}
        for sampler, _ in series.values():  # warm up: connections, plans, caches
            for _ in range(3):
                await sampler()
        for _ in range(rounds):
            for conn in conns:
                conn.execute(QUERIES["vacuum"])
            for i in range(per_round):
                for name, (sampler, count) in series.items():
                    if i < count:
                        samples[name].append(await sampler())
        return samples


def run_shape(srv: Server, shape: Shape, rounds: int, per_round: int) -> dict[str, Any]:
    with srv.database(f"hol_{shape.key}") as backlog_dsn, srv.database("hol_empty") as empty_dsn:
        t0 = time.perf_counter()
        with connect(backlog_dsn) as conn:
            load(conn, shape, shape.held_by)
        load_seconds = time.perf_counter() - t0
        with connect(empty_dsn) as conn:
            load(conn, None, shape.held_by)
        plain_per_round = max(1, per_round // 6)
        samples = trio.run(
            functools.partial(measure, kinds=shape.kinds, plain_too=shape.plain),
            backlog_dsn, empty_dsn, rounds, per_round, plain_per_round,
        )  # fmt: skip
        with connect(backlog_dsn) as conn:
            plans = {"claim": explain(conn, CLAIM, shape.kinds)}
            if shape.plain:
                plans["plain_claim"] = explain(conn, QUERIES["plain_claim"], shape.kinds)
    series = {name: summary_ms(values) for name, values in samples.items()}

    def median(name: str) -> float:
        return series[name]["median_ms"]

    store_ratio = ratio(median("store.claim backlog"), median("store.claim near-empty"))
    return {
        "shape": attrs.asdict(shape),
        "rows": shape.rows,
        "load_seconds": load_seconds,
        "series": series,
        "ratios": {
            "store_backlog_vs_near_empty": store_ratio,
            "claim_sql_backlog_vs_near_empty": ratio(
                median("claim SQL backlog"), median("claim SQL near-empty")
            ),
            "no_flush_backlog_vs_near_empty": ratio(
                median(f"{NO_FLUSH} backlog"), median(f"{NO_FLUSH} near-empty")
            ),
            "generic_plan_backlog_vs_near_empty": ratio(
                median(f"{GENERIC} backlog"), median(f"{GENERIC} near-empty")
            ),
            "plain_backlog_vs_claim_sql_backlog": ratio(
                median("plain NOT EXISTS backlog"), median("claim SQL backlog")
            )
            if shape.plain
            else None,
        },
        "targets": {
            "median_within_2ms": median("store.claim backlog") <= 2.0,
            "within_2x_near_empty": store_ratio <= 2.0,
        },
        "plans": plans,
    }


def report(results: list[dict[str, Any]]) -> None:
    for r in results:
        s = r["series"]
        rows = []
        for label in LABELS:
            if f"{label} backlog" not in s:
                continue
            back, empty = s[f"{label} backlog"], s[f"{label} near-empty"]
            rows.append([
                label, back["median_ms"], back["p99_ms"], empty["median_ms"], empty["p99_ms"],
                ratio(back["median_ms"], empty["median_ms"]), back["n"],
            ])  # fmt: skip
        show(
            f"Head-of-line ({r['shape']['key']}): {r['shape']['title']} ({r['rows']:,} rows)",
            ["claim", "backlog median ms", "backlog p99 ms", "near-empty median ms",
             "near-empty p99 ms", "backlog / near-empty", "n"],
            rows,
        )  # fmt: skip
        t = r["targets"]
        within = f" (target <= 2 ms: {'met' if t['median_within_2ms'] else 'MISSED'})"
        print(
            f"  store.claim: {r['ratios']['store_backlog_vs_near_empty']:.2f}x near-empty"
            f" (target <= 2x: {'met' if t['within_2x_near_empty'] else 'MISSED'});"
            f" median {s['store.claim backlog']['median_ms']:.2f} ms{within}"
            + (
                ""
                if r["ratios"]["plain_backlog_vs_claim_sql_backlog"] is None
                else f"; plain NOT EXISTS is"
                f" {r['ratios']['plain_backlog_vs_claim_sql_backlog']:.0f}x the claim SQL on"
                " the backlog"
            )
        )


def main(srv: Server, quick: bool, out: Any) -> dict[str, Any]:
    size = "quick" if quick else "full"
    rounds, per_round = (3, 10) if quick else (10, 30)
    only = os.environ.get("BENCH_HOL_SHAPES")  # such as "e,f": those shapes alone
    shapes = [s for s in SHAPES[size] if only is None or s.key in only.split(",")]
    results = [run_shape(srv, shape, rounds, per_round) for shape in shapes]
    report(results)
    path = save(out, "hol", srv, {"size": size, "rounds": rounds, "per_round": per_round}, results)
    print(f"  -> {path}")
    return {"hol": results}
