"""Claim contention: W claimer processes over S scopes plus unscoped items.

Each claimer is a process of its own with its own store; they start together (a
barrier) and for a fixed time claim through `store.claim` and complete at once what
they got. The queue alternates unscoped items and items of S scopes, with more than
the run can take; with L > 1 each scope's items are spread over L priorities, so a scope
has L heads and two claims can meet on one scope (one of them is refused its claim
lock: before migration 0006 that emptied a claim of one item). Reported: claims/s, race
losses (`store.statistics()`), claim latency, and the scope rule, checked twice: a
sampler that reads the most Running items any scope has (every 10 ms, during the run),
and afterwards the claimers' own records of when they held each scoped item, which must
never overlap within a scope.
"""

from __future__ import annotations

# trio_asyncio before psycopg, or psycopg's async calls find no running event loop.
import trio_asyncio  # noqa: F401  isort: skip

import itertools
import multiprocessing
import time
from pathlib import Path
from typing import Any

import trio

from bench.common import QUERIES, Server, connect, save, show, summary_ms
from trioworker import open_store

LEASE = 60.0


def claimer(dsn: str, duration: float, name: str, barrier: Any, results: Any) -> None:
    """A claimer process: claim and complete until `duration` after the barrier."""
    results.put(trio.run(_claim_loop, dsn, duration, name, barrier))


async def _claim_loop(dsn: str, duration: float, name: str, barrier: Any) -> dict[str, Any]:
    latencies: list[float] = []
    empty: list[float] = []
    held: list[tuple[str, float, float]] = []  # (scope, claimed, completion sent)
    unscoped = 0
    async with open_store(dsn, max_connections=1, application_name=name) as store:
        await store.queue_counts()  # the pool's connection is open and warm
        await trio.to_thread.run_sync(barrier.wait, abandon_on_cancel=True)
        stop_at = time.monotonic() + duration
        while time.monotonic() < stop_at:
            t0 = time.perf_counter()
            item = await store.claim(name, LEASE, kinds=["Noop"])
            elapsed = time.perf_counter() - t0
            if item is None:
                empty.append(elapsed)
                await trio.sleep(0.001)
                continue
            latencies.append(elapsed)
            claimed = time.monotonic()
            if item.scope is None:
                unscoped += 1
            else:
                held.append((item.scope, claimed, time.monotonic()))
            await store.complete(item.id, item.attempt)
        return {
            "latencies": latencies,
            "empty": empty,
            "held": held,
            "unscoped": unscoped,
            "race_losses": store.statistics().race_losses,
        }


def overlaps(held: list[tuple[str, float, float]]) -> int:
    """Pairs of holds of one scope, by different claims, whose intervals intersect."""
    found = 0
    by_scope: dict[str, list[tuple[float, float]]] = {}
    for scope, start, end in held:
        by_scope.setdefault(scope, []).append((start, end))
    for spans in by_scope.values():
        spans.sort()
        found += sum(1 for a, b in itertools.pairwise(spans) if b[0] < a[1])
    return found


def run_config(
    srv: Server, workers: int, scopes: int, duration: float, items: int, *, lines: int = 1
) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    with srv.database("contention") as dsn, connect(dsn) as conn:
        conn.execute(QUERIES["insert_lines"], {"kind": "Noop", "prefix": "s-", "n": items,
                                               "scopes": scopes, "lines": lines})  # fmt: skip
        conn.execute("VACUUM ANALYZE work_items")
        barrier = ctx.Barrier(workers + 1)
        queue = ctx.Queue()
        procs = [
            ctx.Process(target=claimer, args=(dsn, duration, f"claimer-{i}", barrier, queue))
            for i in range(workers)
        ]
        for p in procs:
            p.start()
        barrier.wait(timeout=120)
        stop_at = time.monotonic() + duration + 0.5
        most_running, samples = 0, 0
        while time.monotonic() < stop_at:
            row = conn.execute(QUERIES["most_running_in_a_scope"]).fetchone()
            most_running = max(most_running, int(row[0]) if row else 0)
            samples += 1
            time.sleep(0.01)
        outcomes = [queue.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        left = conn.execute(QUERIES["count_status"], {"status": "Queued"}).fetchone()
    latencies = [x for o in outcomes for x in o["latencies"]]
    held = [(scope, start, end) for o in outcomes for scope, start, end in o["held"]]
    return {
        "workers": workers,
        "scopes": scopes,
        "lines": lines,
        "duration": duration,
        "items": items,
        "claims": len(latencies),
        "claims_per_s": len(latencies) / duration,
        "scoped_claims": len(held),
        "unscoped_claims": sum(o["unscoped"] for o in outcomes),
        "empty_claims": sum(len(o["empty"]) for o in outcomes),
        "race_losses": sum(o["race_losses"] for o in outcomes),
        "latency": summary_ms(latencies),
        "empty_claim_latency": summary_ms([x for o in outcomes for x in o["empty"]]),
        "most_running_in_a_scope": most_running,
        "sampler_reads": samples,
        "overlapping_holds": overlaps(held),
        "queued_left": int(left[0]) if left else None,
    }


def main(srv: Server, quick: bool, out: Path) -> dict[str, Any]:
    duration, items = (1.5, 10_000) if quick else (5.0, 40_000)
    # One line per scope, and (L=4) four priorities per scope: four heads, so claims
    # can meet on different heads of one scope and one of them is refused its claim lock.
    configs = [(w, s, 1) for s in (1, 10, 1000) for w in (1, 2, 4, 8)]
    configs += [(w, s, 4) for s in (1, 10) for w in (2, 4, 8)]
    results = []
    for workers, scopes, lines in configs:
        r = run_config(srv, workers, scopes, duration, items, lines=lines)
        results.append(r)
        print(f"  W={workers} S={scopes} L={lines}: {r['claims_per_s']:,.0f} claims/s")
    show(
        f"Claim contention: W claimer processes, S scopes of L lines + unscoped items"
        f" ({duration:g} s each)",
        ["W x S x L", "claims/s", "scoped", "unscoped", "empty", "race losses", "p50 ms",
         "p99 ms", "max Running/scope", "overlaps"],
        [[f"{r['workers']} x {r['scopes']} x {r['lines']}", r["claims_per_s"], r["scoped_claims"],
          r["unscoped_claims"], r["empty_claims"], r["race_losses"], r["latency"]["median_ms"],
          r["latency"]["p99_ms"], r["most_running_in_a_scope"], r["overlapping_holds"]]
         for r in results],
    )  # fmt: skip
    rule_held = all(
        r["most_running_in_a_scope"] <= 1 and r["overlapping_holds"] == 0 for r in results
    )
    print(f"  scope rule: {'held in every run' if rule_held else 'BROKEN'}"
          f" ({sum(r['sampler_reads'] for r in results):,} sampler reads)")  # fmt: skip
    params = {"duration": duration, "items": items, "configs": configs}
    print(f"  -> {save(out, 'contention', srv, params, {'runs': results, 'rule_held': rule_held})}")
    return {"runs": results, "rule_held": rule_held}
