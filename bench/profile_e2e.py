"""Where a Worker's CPU an item goes end to end: `bench e2e`'s unscoped trioworker run
(2 Worker processes, `--concurrency 128`, no-op items, a warm-up, `VACUUM ANALYZE`),
each Worker process (the `run` supervisor and its Worker) sampled by its own CPU time
(bench/sampling/sitecustomize.py), for this tree or another.

    python -m bench.profile_e2e [--tree PATH] [--items N] [--rounds R] [--scopes S]
                                [--raw FILE]

Sampling runs only while the measured items run (SIGUSR1 at the enqueue, SIGUSR2 when
they have finished), so the figures are those of `bench e2e`'s window. Prints the
Workers' CPU an item (from /proc, as `bench e2e` measures it) and its share in each
bucket below: each sample is charged, once, to the innermost frame of its stack that a
bucket matches (the first listed, if several do). `--raw` keeps the merged stacks
(collapsed format) for a flame graph or another breakdown. Another tree runs its own
Worker and `bench.apps` (`--tree ../old` after `git worktree add ../old COMMIT`, or a
`git archive`), started in that tree; the database is migrated by this tree.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import cpu
from bench.common import DEFAULT_DSN, QUERIES, ROOT, connect, server
from bench.procs import APP, processes, wait_until

#: (bucket, frame name part, function names or None for any): the frame names are
#: the sampler's `file:qualname`; first match from the innermost frame outwards wins.
BUCKETS: list[tuple[str, str, frozenset[str] | None]] = [
    ("the handler", "bench/apps.py", None),
    ("rows read as stored (timestamptz loader)", "trioworker/_postgres/as_stored.py", None),
    ("work items built from rows (operations.py)", "trioworker/_postgres/operations.py", None),
    ("JSON and text decoding (jsontext)", "trioworker/_core/jsontext.py", None),
    ("waits on the socket (trio_connection.py)", "trioworker/_postgres/trio_connection.py", None),
    ("pool: checkout and return (pool.py)", "trioworker/_postgres/pool.py", None),
    ("Connections.call: bound, errors (connection.py)", "trioworker/_postgres/connection.py",
     None),
    ("session bounds (sessions.py)", "trioworker/_postgres/sessions.py", None),
    ("psycopg: cursors, rows, adapters", "psycopg/", None),
    ("the store's calls (store.py)", "trioworker/_postgres/store.py", None),
    ("completion batcher (batching.py)", "trioworker/_worker/batching.py", None),
    ("heartbeats (heartbeats.py)", "trioworker/_worker/heartbeats.py", None),
    ("stop watch (stops.py)", "trioworker/_worker/stops.py", None),
    ("metrics (metrics.py)", "trioworker/_worker/metrics.py", None),
    ("logging (the Worker's and the stdlib's)", "trioworker/_worker/logging.py", None),
    ("logging (the Worker's and the stdlib's)", "logging/", None),
    ("attempt state (attempt.py)", "trioworker/_worker/attempt.py", None),
    ("the context (context.py)", "trioworker/_worker/context.py", None),
    ("the decision (policy)", "trioworker/_core/policy.py", None),
    ("trace and events (otel)", "trioworker/otel", None),
    ("executor: attempt bookkeeping", "trioworker/_worker/executor.py", None),
    ("claim loop (worker.py)", "trioworker/_worker/worker.py", None),
    ("values built (attrs, the model)", "<attrs generated", None),
    ("values built (attrs, the model)", "trioworker/_core/model.py", None),
    ("Trio: cancel scopes", "trio/_core/_run.py:CancelScope", None),
    ("Trio: cancel scopes", "trio/_core/_run.py:CancelStatus", None),
    ("Trio: nurseries", "trio/_core/_run.py:Nursery", None),
    ("Trio: nurseries", "trio/_core/_run.py:open_nursery", None),
    ("Trio: I/O waits (epoll, wait_readable)", "trio/_core/_io_epoll.py", None),
    ("Trio: scheduling", "trio/_core/", None),
    ("Trio: other", "trio/", None),
]  # fmt: skip
IDLE = "waiting for I/O (epoll_wait's own CPU)"
OTHER = "other (Python, the standard library)"


def bucket(stack: list[str]) -> str:
    if stack and stack[-1].endswith("EpollIOManager.get_events"):
        return IDLE
    for frame in reversed(stack):
        for name, part, functions in BUCKETS:
            if part in frame and (functions is None or frame.rsplit(":", 1)[1] in functions):
                return name
    return OTHER


def read_stacks(paths: list[Path]) -> collections.Counter[str]:
    stacks: collections.Counter[str] = collections.Counter()
    for path in paths:
        for line in path.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            stacks[stack] += int(n)
    return stacks


def report(stacks: collections.Counter[str], us_per_item: float, top: int) -> None:
    total = sum(stacks.values()) or 1
    buckets: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    within: collections.Counter[str] = collections.Counter()
    for stack, n in stacks.items():
        frames = stack.split(";")
        buckets[bucket(frames)] += n
        own[frames[-1]] += n
        for frame in set(frames):
            if "trioworker/" in frame:
                within[frame] += n
    print(f"{total:,} samples; µs an item = share x {us_per_item:.1f}")
    print(f"{'bucket':50} {'share':>7} {'µs an item':>11}")
    for name, n in buckets.most_common():
        print(f"{name:50} {n / total:7.1%} {n / total * us_per_item:11.1f}")
    print(f"\nfunctions by their own samples (top {top})")
    for name, n in own.most_common(top):
        print(f"{n / total:7.1%} {n / total * us_per_item:6.1f}  {name}")
    print(f"\ntrioworker functions by samples within them (top {top})")
    for name, n in within.most_common(top):
        print(f"{n / total:7.1%} {n / total * us_per_item:6.1f}  {name}")


def measure(
    pids: list[int],
    items: int,
    enqueue: Callable[[int], None],
    finished: Callable[[], bool],
    conn: Any,
) -> float:
    """One round, sampled: `items` enqueued and run; the Workers' CPU seconds."""
    before = cpu.snapshot(pids, [])
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    began = time.monotonic()
    enqueue(items)
    wait_until(finished, 60 + items / 20, "the items")
    seconds = time.monotonic() - began
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)
    after = cpu.snapshot(pids, [])
    ms = cpu.ms_per_item(before, after, items)["worker_cpu_ms_per_item"] or 0.0
    print(f"round: {items / seconds:,.0f} items/s, Worker CPU {ms:.4f} ms an item", flush=True)
    conn.execute(QUERIES["vacuum_analyze"])
    return ms * items / 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_e2e", description=__doc__)
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scopes", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=128)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--raw", type=Path, default=None)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--dsn", default=os.environ.get("TRIOWORKER_DSN") or DEFAULT_DSN)
    args = parser.parse_args(argv)
    tree = args.tree.resolve()
    scratch = Path(tempfile.mkdtemp(prefix="trioworker-profile-e2e-"))
    env = {"BENCH_SAMPLE_DIR": str(scratch),
           "PYTHONPATH": f"{ROOT / 'bench' / 'sampling'}{os.pathsep}{tree}"}  # fmt: skip
    with server(args.dsn) as srv, srv.database("profile") as dsn, processes(scratch) as procs:
        for i in range(args.processes):
            procs.start([sys.executable, "-m", "trioworker", "--dsn", dsn, "run", "--app", APP,
                         "--worker-id", f"bench-{i}", "--concurrency", str(args.concurrency),
                         "--poll", "5"], f"worker-{i}", env=env, cwd=tree)  # fmt: skip
        with connect(dsn) as conn:

            def enqueue(n: int) -> None:
                params = {"kind": "Noop", "prefix": "s-", "n": n, "age": 0,
                          "scopes": args.scopes}  # fmt: skip
                conn.execute(QUERIES["insert_queued"], params)

            def finished() -> bool:
                procs.check_alive()
                row = conn.execute(QUERIES["unfinished"]).fetchone()
                return bool(row and row[0] == 0)

            def connected() -> bool:
                procs.check_alive()
                row = conn.execute(QUERIES["other_backends"]).fetchone()
                return bool(row and row[0] >= args.processes)

            wait_until(connected, 60, "the Workers connecting")
            enqueue(50 * args.processes)
            wait_until(finished, 60, "the warm-up")
            time.sleep(0.5)
            conn.execute(QUERIES["vacuum_analyze"])
            pids = [*procs.pids(), *(c for p in procs.pids() for c in cpu.descendants_of(p))]
            spent = sum(measure(pids, args.items, enqueue, finished, conn)
                        for _ in range(args.rounds))  # fmt: skip
    items = args.items * args.rounds
    stacks = read_stacks(sorted(scratch.glob("*.stacks")))
    if args.raw:
        args.raw.write_text("".join(f"{s} {n}\n" for s, n in stacks.most_common()))
    print(f"tree {tree}: {items:,} items, {args.processes} Workers x {args.concurrency},"
          f" scopes {args.scopes}")  # fmt: skip
    report(stacks, spent / items * 1e6, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
