"""End-to-end throughput: enqueue -> finished, trioworker against its peers, one run.

For each system: a fresh database, N worker processes started and warmed up (a small
batch run through first), `VACUUM ANALYZE` (the same policy for every system; see
queries.sql), then all items enqueued in one statement; items/s = items / (last
finished - enqueue committed), and the CPU an item took, the Workers' and the server's
(its client backends of the database under test), from just before the enqueue to the
end of the wait (bench.cpu); and what the server did for them (bench.statements):
transactions, function calls and rows written an item, and items per claim and per
finish statement.
Systems take turns round by round, in a rotating order, and each figure is the median
of its rounds. pgbench's single-row UPDATE gives the physical reference.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import cpu, peer_graphile, pgbench, statements
from bench.common import QUERIES, Server, connect, median_measured, ratio, save, show
from bench.procs import Processes, processes, wait_until
from bench.systems import SERIAL_KEYS, Graphile, Pgqueuer, Procrastinate, System, Trioworker

PROCESSES = 2  # one per core
NO_PEER = {"label": "no peer ran", "items_per_s": math.nan}
#: The Graphile Worker rows trioworker's unscoped and serialised figures are set against.
GRAPHILE_BATCHED = "graphile, batched (local queue 100)"
GRAPHILE_QUEUES = f"graphile, {SERIAL_KEYS} named queues"


def graphile_systems() -> list[System]:
    """Graphile Worker: its defaults but for the concurrency (it ships with 1); the
    batching of its performance docs (concurrency 24 as there); and named queues, whose
    best found here is completion batching without the local queue (docs/benchmarks.md)."""
    return [
        Graphile("graphile, defaults (concurrency 8)", False, PROCESSES, concurrency=8),
        Graphile(GRAPHILE_BATCHED, False, PROCESSES, concurrency=24, local_queue=100,
                 batch_delay=0),
        Graphile(GRAPHILE_QUEUES, True, PROCESSES, concurrency=8, batch_delay=0),
    ]  # fmt: skip


def systems(graphile: bool) -> list[System]:
    """Each system at the best settings found (see docs/benchmarks.md for the search);
    Graphile Worker's only when `graphile` (it needs node)."""
    serial = f"{SERIAL_KEYS} scopes"
    return [
        # Unscoped, a claim takes as many items as there are free slots, so concurrency
        # is also the claim's batch (Graphile's local queue 100 is its counterpart).
        Trioworker("trioworker, unscoped", False, PROCESSES, concurrency=128),
        Trioworker(
            f"trioworker, unscoped, run --processes {PROCESSES}",
            False,
            PROCESSES,
            concurrency=128,
            supervised=True,
        ),
        Trioworker(f"trioworker, {serial}", True, PROCESSES, concurrency=32),
        # Dependencies (issue 34): the unscoped case's items, in fans of 100 and 1,000.
        Trioworker("trioworker, unscoped, fans of 100", False, PROCESSES, concurrency=128, fan=100),
        Trioworker(
            "trioworker, unscoped, fans of 1000", False, PROCESSES, concurrency=128, fan=1000
        ),
        Procrastinate("procrastinate, plain", False, PROCESSES, concurrency=16),
        Procrastinate(f"procrastinate, {SERIAL_KEYS} locks", True, PROCESSES, concurrency=16),
        Pgqueuer("pgqueuer, plain (batch 10)", False, PROCESSES, batch_size=10),
        Pgqueuer(
            "pgqueuer, batched (batch 100, pool)", False, PROCESSES, batch_size=100, pool=True
        ),
        Pgqueuer(f"pgqueuer, {SERIAL_KEYS} entrypoints limit 1", True, PROCESSES, batch_size=10),
        *limited_systems(),
        *(graphile_systems() if graphile else []),
    ]


def limited_systems() -> list[System]:
    """Limits beyond one (docs/design/limits.md): 50 scopes at 2 at a time and a kind at
    a global limit of 8, beside pgqueuer's concurrency_limit (per entrypoint and per
    Worker process: with 2 processes, 2 x the limit can run; trioworker's are global)."""
    return [
        Trioworker(f"trioworker, {SERIAL_KEYS} scopes at limit 2", True, PROCESSES,
                   concurrency=32, scope_limit=2),
        Trioworker("trioworker, unscoped, kind limit 8", False, PROCESSES, concurrency=32,
                   kind_limit=8),
        Pgqueuer(f"pgqueuer, {SERIAL_KEYS} entrypoints limit 2", True, PROCESSES,
                 batch_size=10, limit=2),
        Pgqueuer("pgqueuer, concurrency_limit 8", False, PROCESSES, batch_size=10, limit=8),
    ]  # fmt: skip


def slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")[:40]


#: The families whose Workers count their own claims and finishes, printed on SIGWINCH
#: (bench/peer_pgqueuer.py, bench/graphile/run.mjs); the others' are function calls.
COUNTING = frozenset({"pgqueuer", "graphile"})


def wait_finished(
    conn: Any, system: System, procs: Processes, timeout: float, polls: list[int] | None = None
) -> int:
    """Poll until nothing is unfinished (or the timeout); how many are left. Each poll
    is one statement on `conn`, counted in `polls[0]` when given."""
    deadline = time.monotonic() + timeout
    while True:
        if polls is not None:
            polls[0] += 1
        left = system.unfinished(conn)
        if left == 0 or time.monotonic() > deadline:
            return left
        procs.check_alive()
        time.sleep(0.05)


def ask_counts(system: System, procs: Processes) -> None:
    """Have a counting system's Workers print their counts so far (COUNTING)."""
    if system.family in COUNTING:
        for pid in procs.pids():
            os.kill(pid, signal.SIGWINCH)


def counted(system: System, procs: Processes) -> dict[str, int] | None:
    """The Workers' counts between the two `ask_counts`, summed (None: none kept)."""
    if system.family not in COUNTING:
        return None
    lines = statements.read_counts([log for _, log in procs.started])
    if len(lines) < 2:
        return None
    return {key: lines[-1][key] - lines[-2][key] for key in lines[-1]}


def no_other_backends(conn: Any, waits: list[int]) -> bool:
    """Whether no session but `conn`'s is left on its database (counted in waits[0])."""
    waits[0] += 1
    row = conn.execute(QUERIES["other_backends"]).fetchone()
    return bool(row and row[0] == 0)


def run_once(srv: Server, system: System, n: int, log_dir: Path) -> dict[str, Any]:
    name = slug(system.label)
    with (
        srv.database(name, migrated=system.migrated) as dsn,
        processes(log_dir / name) as procs,
        connect(dsn) as conn,
    ):
        statements.track(conn)  # before any Worker connects
        system.install(dsn)
        for i, command in enumerate(system.worker_commands(dsn)):
            procs.start(command, f"worker-{i}")

        def connected() -> bool:
            procs.check_alive()
            row = conn.execute(QUERIES["other_backends"]).fetchone()
            return bool(row and row[0] >= system.processes)

        wait_until(connected, 60, f"{system.label}: workers connecting")
        system.enqueue(dsn, 50 * system.processes)  # warm-up, not timed
        if wait_finished(conn, system, procs, 60):
            raise RuntimeError(f"{system.label}: the warm-up batch did not finish")
        time.sleep(0.5)
        conn.execute(QUERIES["vacuum_analyze"])
        planner = {name: [pages, rows] for name, pages, rows in
                      conn.execute(QUERIES["table_statistics"]).fetchall()}  # fmt: skip
        # The started processes and their children (`run --processes`'s Workers).
        pids = [*procs.pids(), *(c for p in procs.pids() for c in cpu.descendants_of(p))]
        ask_counts(system, procs)
        before = cpu.snapshot(pids, cpu.database_pids(conn))
        stats_before = statements.snapshot(conn)
        polls = [0]
        committed = system.enqueue(dsn, n)
        left = wait_finished(conn, system, procs, 60 + n / 20, polls)
        seconds = time.monotonic() - committed
        after = cpu.snapshot(pids, cpu.database_pids(conn))
        ask_counts(system, procs)
        time.sleep(0.3)  # for the counts to be printed
        counts = counted(system, procs)
        # A backend's statistics are flushed when it exits (an idle one's only after
        # 10 s): the Workers stop, and their sessions end, before the second snapshot.
        procs.stop()
        waits = [0]
        wait_until(lambda: no_other_backends(conn, waits), 30, f"{system.label}: sessions ending")
        # Between the snapshots, the harness's own: the first snapshot, the polls,
        # database_pids, the waits for the sessions to end.
        harness = 1 + polls[0] + 1 + waits[0]
        stats = statements.per_item(stats_before, statements.snapshot(conn), max(n - left, 1),
                                    harness=harness, family=system.family,
                                    counted=counts)  # fmt: skip
    return {
        "items": n,
        "finished": n - left,
        "seconds": seconds,
        "items_per_s": (n - left) / seconds,
        "complete": left == 0,
        "planner_pages_rows": planner,
        **cpu.ms_per_item(before, after, max(n - left, 1)),
        **stats,
    }


def run_peer(srv: Server, system: System, n: int, log_dir: Path) -> dict[str, Any]:
    """run_once; a peer that cannot be made to run is reported with the reason, and the
    others still run. trioworker's own failures are bugs and end the benchmark."""
    if system.family == "trioworker":
        return run_once(srv, system, n, log_dir)
    try:
        return run_once(srv, system, n, log_dir)
    except (RuntimeError, TimeoutError, OSError, psycopg.Error) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[-2000:]}


def summarise(system: System, runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["items_per_s"] for r in runs if "error" not in r] or [math.nan]
    return {
        "label": system.label,
        "family": system.family,
        "serialised": system.serialised,
        "settings": system.settings(),
        "runs": runs,
        "items_per_s": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
        "worker_cpu_ms_per_item": median_measured(r.get("worker_cpu_ms_per_item") for r in runs),
        "server_cpu_ms_per_item": median_measured(r.get("server_cpu_ms_per_item") for r in runs),
        **{key: median_measured(r.get(key) for r in runs) for key in PER_ITEM},
        "function_calls_per_item": median_calls(runs),
        "all_complete": all(r.get("complete") for r in runs),
        "errors": [r["error"] for r in runs if "error" in r],
    }


#: bench.statements' figures of a run, each summarised by its median.
PER_ITEM = ("transactions_per_item", "rows_written_per_item", "items_per_claim",
            "items_per_finish")  # fmt: skip


def median_calls(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each function's calls an item, the median over the runs (a run without a call
    of it counts as 0)."""
    measured = [r["function_calls_per_item"] for r in runs if "function_calls_per_item" in r]
    names = sorted({name for calls in measured for name in calls})
    medians = {name: statistics.median(c.get(name, 0.0) for c in measured) for name in names}
    return dict(sorted(medians.items(), key=lambda kv: -kv[1]))


def top_calls(calls: dict[str, float], n: int = 3) -> str:
    """The `n` functions called most an item, as "name 1.02"."""
    return ", ".join(f"{name} {per:.3g}" for name, per in list(calls.items())[:n]) or "-"


def _reference(row: dict[str, Any]) -> bool:
    """trioworker's rows the others are set against (not `run --processes`, not a run
    with limits, not one of fans: items after others)."""
    settings = row["settings"]
    return (
        row["family"] == "trioworker"
        and not settings.get("supervised")
        and not settings.get("fan")
        and not limited(row)
    )


def limited(row: dict[str, Any]) -> bool:
    """A run of `limited_systems`: reported, but not one the targets compare."""
    settings = row["settings"]
    return (
        settings.get("scope_limit", 1) != 1
        or settings.get("kind_limit") is not None
        or (settings.get("limit", 0) not in (0, 1))
        or (settings.get("limit", 0) == 1 and not row["serialised"])
    )


def compare(rows: list[dict[str, Any]], reference: dict[str, Any]) -> dict[str, Any]:
    rows = [r for r in rows if not limited(r)]

    def best(serialised: bool) -> dict[str, Any]:
        peers = [r for r in rows if r["family"] != "trioworker" and r["serialised"] == serialised
                 and not math.isnan(r["items_per_s"])]  # fmt: skip
        return max(peers, key=lambda r: r["items_per_s"], default=NO_PEER)

    ours = {r["serialised"]: r for r in rows if _reference(r)}
    plain, serial = best(False), best(True)
    unscoped_ratio = ratio(ours[False]["items_per_s"], plain["items_per_s"])
    scoped_ratio = ratio(ours[True]["items_per_s"], serial["items_per_s"])
    graphile = {r["label"]: r["items_per_s"] for r in rows if r["family"] == "graphile"}
    # NaN where Graphile did not run (no node) or failed.
    vs_batched = ratio(ours[False]["items_per_s"], graphile.get(GRAPHILE_BATCHED, math.nan))
    vs_queues = ratio(ours[True]["items_per_s"], graphile.get(GRAPHILE_QUEUES, math.nan))
    return {
        "best_peer_plain": plain["label"],
        "best_peer_serialised": serial["label"],
        "unscoped_vs_best_peer_plain": unscoped_ratio,
        "scoped_vs_best_peer_serialised": scoped_ratio,
        "unscoped_vs_graphile_batched": vs_batched,
        "scoped_vs_graphile_named_queues": vs_queues,
        "unscoped_vs_pgbench_ceiling": ratio(
            ours[False]["items_per_s"], reference["items_per_s_ceiling"]
        ),
        "targets": {
            "unscoped_at_least_best_peer_plain": unscoped_ratio >= 1.0,
            "scoped_at_least_1.5x_best_peer_serialised": scoped_ratio >= 1.5,
            # Issue 23's acceptance.
            "unscoped_at_least_1.2x_graphile_batched": vs_batched >= 1.2,
            "scoped_at_least_3x_graphile_named_queues": vs_queues >= 3.0,
        },
    }


def against(value: float, target: float, met: bool) -> str:
    """A ratio and its target's verdict; "not measured" where the peer did not run."""
    if math.isnan(value):
        return "not measured"
    return f"{value:.2f}x (target >= {target:g}x: {'met' if met else 'MISSED'})"


def report(rows: list[dict[str, Any]], reference: dict[str, Any], verdict: dict[str, Any]) -> None:
    ceiling = reference["items_per_s_ceiling"]
    ours = {r["serialised"]: r["items_per_s"] for r in rows if _reference(r)}
    table = [
        [r["label"], r["items_per_s"], r["min"], r["max"],
         ratio(ours[r["serialised"]], r["items_per_s"]), ratio(r["items_per_s"], ceiling),
         r["worker_cpu_ms_per_item"], r["server_cpu_ms_per_item"],
         "yes" if r["all_complete"] else f"NO {'; '.join(r['errors'])[:60]}"]
        for r in rows
    ]  # fmt: skip
    show(
        f"End-to-end throughput (pgbench: {reference['tps']:,.0f} tps, ceiling tps/3 ="
        f" {ceiling:,.0f} items/s; with a NOTIFY in each: {reference['tps_with_notify']:,.0f} tps)",
        ["system", "items/s (median)", "min", "max", "trioworker / this",
         "/ pgbench ceiling", "Worker CPU ms/item", "server CPU ms/item", "finished"],
        table,
    )  # fmt: skip
    show(
        "Where each item's time goes (medians of the rounds; server: the test database's"
        " client backends; transactions: pg_stat_database's less the harness's, the"
        " enqueue's included; see bench/statements.py)",
        ["system", "Worker CPU ms/item", "server CPU ms/item", "transactions/item",
         "rows written/item", "items/claim", "items/finish"],
        [[r["label"], r["worker_cpu_ms_per_item"], r["server_cpu_ms_per_item"],
          r["transactions_per_item"], r["rows_written_per_item"], r["items_per_claim"],
          r["items_per_finish"]] for r in rows],
    )  # fmt: skip
    print("  function calls an item (pg_stat_user_functions; triggers count per row):")
    for r in rows:
        print(f"    {r['label']}: {top_calls(r['function_calls_per_item'], 4)}")
    t = verdict["targets"]
    print(
        f"  unscoped: {verdict['unscoped_vs_best_peer_plain']:.2f}x {verdict['best_peer_plain']}"
        f" (target >= 1x: {'met' if t['unscoped_at_least_best_peer_plain'] else 'MISSED'});"
        f" {SERIAL_KEYS} scopes: {verdict['scoped_vs_best_peer_serialised']:.2f}x"
        f" {verdict['best_peer_serialised']} (target >= 1.5x:"
        f" {'met' if t['scoped_at_least_1.5x_best_peer_serialised'] else 'MISSED'})"
    )
    print(
        "  against Graphile Worker (issue 23): unscoped / batched "
        + against(verdict["unscoped_vs_graphile_batched"], 1.2,
                  t["unscoped_at_least_1.2x_graphile_batched"])
        + f"; {SERIAL_KEYS} scopes / {SERIAL_KEYS} named queues "
        + against(verdict["scoped_vs_graphile_named_queues"], 3,
                  t["scoped_at_least_3x_graphile_named_queues"])
    )  # fmt: skip


def main(srv: Server, quick: bool, out: Path) -> dict[str, Any]:
    n, rounds, pgbench_seconds = (1000, 1, 3) if quick else (10_000, 3, 10)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    log_dir = out / "logs" / f"e2e-{stamp}"
    graphile = peer_graphile.available()
    if not graphile:
        print("  graphile: skipped, no `node` on PATH (Graphile Worker runs on Node.js)")
    reference = pgbench.run(srv, pgbench_seconds)
    chosen = systems(graphile)
    only = os.environ.get("BENCH_E2E_ONLY")  # a label's part, such as "limit": those alone
    if only:
        chosen = [s for s in chosen if only in s.label or s.label.startswith("trioworker, ")]
    runs: dict[str, list[dict[str, Any]]] = {s.label: [] for s in chosen}
    for r in range(rounds):
        for system in chosen[r:] + chosen[:r]:
            result = run_peer(srv, system, n, log_dir / f"round-{r}")
            rate = f"{result['items_per_s']:,.0f} items/s" if "error" not in result else "FAILED"
            print(f"  round {r + 1}/{rounds} {system.label}: {rate}")
            runs[system.label].append(result)
    rows = [summarise(s, runs[s.label]) for s in chosen]
    verdict = compare(rows, reference)
    report(rows, reference, verdict)
    params = {"items": n, "rounds": rounds, "processes": PROCESSES, "serial_keys": SERIAL_KEYS,
              "graphile": graphile}  # fmt: skip
    results = {"pgbench": reference, "systems": rows, "comparison": verdict}
    print(f"  -> {save(out, 'e2e', srv, params, results)}")
    return results
