"""The per-item floor in Python: what an attempt costs a Worker before any database work.

Issue 23 asks for a Worker CPU of at most 0.2 ms an item and for throughput past Graphile
Worker batched, whose Worker (Node.js) spends about 0.05 ms an item. This measures, with
no database and no I/O, CPU time (`time.process_time`) an item, series interleaved
round by round:

- `call`: one no-op handler awaited, nothing else (the floor of any Python Worker);
- `cancel scope`: inside a cancel scope with a deadline (the self-stop);
- `nursery, no task`: an empty nursery inside it;
- `nursery + watcher`: the attempt's nursery and one watcher task in it that waits for
  the deadline or a stop: the shape the design mandates (each claimed item runs in a
  nursery whose cancel scope the heartbeats push). The handler checkpoints once, as any
  handler doing I/O does, so the watcher runs and waits first. When the handler is
  over, the watcher is either woken, and returns (the executor since 2026-12-04), or
  cancelled (before: in Trio, delivering a cancellation costs more than a task);
- `Worker`: the real Worker (`trioworker.testing.worker`, `--concurrency 128` as in
  `bench e2e`) over a store whose claims and completions answer at once from memory:
  everything a Worker does for an item but the SQL; with a no-op handler, and with one
  that checkpoints once. Since issue 31 the Worker has no watcher task an attempt (one
  heartbeat task and one stop watch for the Worker): the watcher series stay as the
  shape it had before. `python -m bench.profile_floor` says where its CPU goes.

The series above run one attempt after another. A Worker runs many at once, each in a
task of its own, so three more spawn a task an item, 128 to a scheduler pass, as the
Worker's claim loop spawns a claim's items: each task's attempt in a nursery alone, or
with a watcher beside it, woken or cancelled at the end.

The server's floor: the CPU an item of the server's processes (`bench/cpu.py`) for the
Worker's own claim and finish functions (`work_claim_v3`, `work_finish_v1`) of unscoped
items, one connection, in batches of 1 to 100, beside the least a queue can do in SQL
(a table shaped as Graphile Worker's jobs, a claim that locks, a DELETE for the finish),
beside the least a queue can do that keeps its finished rows, as `work_items` does
(the same claim, an UPDATE by primary key for the finish), and beside a lean claim: one
statement over `work_items`' unscoped items, finished by `work_finish_v1` (what the
claim's machinery for scopes, limits and pauses costs over the table as it is). The
four alternate, batch size by batch size.

`bench e2e` measures the whole, the database included.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import trio

import trioworker.testing
from bench.common import QUERIES, Server, connect, save, show
from bench.cpu import ms_per_item, server_pids, snapshot
from trioworker import Registry, Settings, WorkItem
from trioworker.testing import MemoryStore

ROUNDS = 5
#: How many attempts a Worker's claim loop keeps in flight (`bench e2e`'s concurrency).
IN_FLIGHT = 128
#: The batch sizes of the server's floor: one item a statement up to a full batch.
BATCHES = (1, 10, 32, 100)


Handler = Callable[[WorkItem, Any], Awaitable[None]]


async def noop(item: WorkItem, ctx: Any) -> None:
    pass


async def checkpoint(item: WorkItem, ctx: Any) -> None:
    """A handler that yields once, as any handler doing I/O does: its watcher runs."""
    await trio.lowlevel.checkpoint()


def item(i: int) -> WorkItem:
    return WorkItem(id=i, kind="Noop", scope=None, payload={}, attempt=1)


class InstantStore(MemoryStore):
    """Claims from a list made beforehand and completions counted, each answered at
    once; the rest is the in-memory store's (whose own claim sorts every row)."""

    def __init__(self, items: int) -> None:
        super().__init__()
        self.ready = collections.deque(item(i) for i in range(items))
        self.total, self.completed = items, 0
        self.done = trio.Event()

    async def claim_batch(
        self,
        worker_id: str,
        lease: float,
        limit: int,
        scopes: Sequence[str] | None = None,
        *,
        unscoped: bool = True,
        kinds: Sequence[str],
    ) -> list[WorkItem]:
        await trio.lowlevel.checkpoint()
        return [self.ready.popleft() for _ in range(min(limit, len(self.ready)))]

    async def complete_batch(
        self, attempts: Sequence[tuple[int, int]], results: Sequence[str | None] | None = None
    ) -> set[int]:
        """The Worker's one completion statement (its batcher's; it never calls
        `complete` itself)."""
        await trio.lowlevel.checkpoint()
        self.completed += len(attempts)
        if self.completed >= self.total:
            self.done.set()
        return {id for id, _ in attempts}


async def watched(i: int, settings: Settings, *, cancel: bool) -> None:
    """The attempt's shape: a nursery, a watcher beside the handler that waits for the
    end or a stop until the first heartbeat is due; at the end, woken (`cancel` false)
    or cancelled."""
    changed = trio.Event()
    ended = False
    now = trio.current_time()
    scope = trio.CancelScope(deadline=now + settings.self_stop_after)

    async def watch() -> None:
        with trio.move_on_at(now + settings.heartbeat):
            while not (ended or scope.cancel_called or trio.current_time() >= scope.deadline):
                with trio.move_on_at(scope.deadline):
                    await changed.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        with scope:
            await checkpoint(item(i), None)
        if cancel:
            nursery.cancel_scope.cancel()
        else:
            ended = True
            changed.set()


def series(items: int) -> dict[str, Callable[[], Awaitable[None]]]:
    defaults = Settings()
    self_stop = defaults.self_stop_after

    async def call() -> None:
        for i in range(items):
            await noop(item(i), None)

    async def cancel_scope() -> None:
        for i in range(items):
            with trio.CancelScope(deadline=trio.current_time() + self_stop):
                await noop(item(i), None)

    async def nursery() -> None:
        for i in range(items):
            with trio.CancelScope(deadline=trio.current_time() + self_stop):
                async with trio.open_nursery():
                    await noop(item(i), None)

    async def one_by_one(cancel: bool) -> None:
        for i in range(items):
            await watched(i, defaults, cancel=cancel)

    async def spawned(attempt: Callable[[int], Awaitable[None]]) -> None:
        async with trio.open_nursery() as lanes:
            for i in range(items):
                lanes.start_soon(attempt, i)
                if i % IN_FLIGHT == IN_FLIGHT - 1:  # as the claim loop waits for a claim
                    await trio.lowlevel.checkpoint()

    async def alone(i: int) -> None:
        with trio.CancelScope(deadline=trio.current_time() + self_stop):
            async with trio.open_nursery():
                await checkpoint(item(i), None)

    async def task_each() -> None:
        await spawned(alone)

    async def task_each_watched(cancel: bool) -> None:
        await spawned(functools.partial(watched, settings=defaults, cancel=cancel))

    async def worker(handler: Handler) -> None:
        registry = Registry()
        registry.handler("Noop")(handler)
        store = InstantStore(items)
        settings = Settings(concurrency=IN_FLIGHT)
        async with trioworker.testing.worker(registry, settings=settings, store=store):
            await store.done.wait()

    return {
        "call": call,
        "cancel scope": cancel_scope,
        "nursery, no task": nursery,
        "nursery + watcher, woken at the end": functools.partial(one_by_one, False),
        "nursery + watcher, cancelled at the end": functools.partial(one_by_one, True),
        f"a task an item, {IN_FLIGHT} spawned a pass: nursery alone": task_each,
        f"a task an item, {IN_FLIGHT} spawned a pass: + watcher, woken": functools.partial(
            task_each_watched, False
        ),
        f"a task an item, {IN_FLIGHT} spawned a pass: + watcher, cancelled": functools.partial(
            task_each_watched, True
        ),
        f"Worker, no-op handler, concurrency {IN_FLIGHT}": functools.partial(worker, noop),
        f"Worker, handler checkpoints, concurrency {IN_FLIGHT}": functools.partial(
            worker, checkpoint
        ),
    }


async def measure(items: int) -> dict[str, list[float]]:
    """CPU µs an item, one figure a round for each series (the first round warms up)."""
    runs = series(items)
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(ROUNDS + 1):
        for name, run in runs.items():
            t0 = time.process_time()
            await run()
            if r:
                samples[name].append((time.process_time() - t0) / items * 1e6)
    return samples


def main(server: Server, quick: bool, out: Path) -> None:
    items = 5_000 if quick else 50_000
    samples = trio.run(measure, items)
    rows = []
    for name, values in samples.items():
        ordered = sorted(values)
        median = ordered[ROUNDS // 2]
        rows.append([name, f"{median:.1f}", f"{ordered[0]:.1f}", f"{ordered[-1]:.1f}"])
    show(
        f"Per-item floor: {items:,} attempts a round, {ROUNDS} rounds, CPU µs an item",
        ["series", "median µs", "min", "max"],
        rows,
    )
    server_items = 2_000 if quick else 20_000
    server_floor = measure_server(server, server_items)
    show(
        f"The server's floor: {server_items:,} unscoped items a batch size"
        f" ({server_items // 10:,} one at a time), one connection, server CPU ms an item"
        " (median of 3)",
        [
            "batch",
            "claim_v3 + finish_v1",
            "lean claim + finish_v1",
            "UPDATE + UPDATE (kept)",
            "UPDATE + DELETE",
            "ours / plain",
            "kept / plain",
        ],
        [
            [
                batch,
                *(f"{ms:.3f}" for ms in series),
                f"{series[0] / series[3]:.2f}x" if series[3] else "-",
                f"{series[2] / series[3]:.2f}x" if series[3] else "-",
            ]
            for batch, series in server_floor.items()
        ],
    )
    save(
        out,
        "floor",
        server,
        {"items": items, "rounds": ROUNDS, "server_items": server_items, "batches": BATCHES},
        {"cpu_us_per_item": samples, "server_cpu_ms_per_item": server_floor},
    )


def measure_server(server: Server, items: int) -> dict[int, tuple[float, ...]]:
    """Server CPU ms an item, by batch size, of the series in `SERIES` order (ours, the
    lean claim, the pair that keeps its rows, the plain pair); a tenth of `items` one at
    a time (each costs some 10x more)."""
    results = {}
    with server.database("floor") as dsn, connect(dsn) as conn:
        conn.execute(QUERIES["floor_plain_table"])
        conn.execute(QUERIES["floor_kept_table"])
        for batch in BATCHES:
            n = items if batch > 1 else items // 10
            rounds: list[list[float]] = [[] for _ in SERIES]
            for _ in range(3):
                for taken, take in zip(rounds, SERIES, strict=True):
                    taken.append(_server_ms(conn, n, batch, take))
            results[batch] = tuple(sorted(r)[1] for r in rounds)
    return results


Claim = Callable[[psycopg.Connection[Any], int], int]
CLAIM = {"worker_id": "floor", "lease": 300.0, "kinds": ["Noop"]}


def _claim_and_finish(claim: str, finish: str, *, seqscan: bool = True) -> Claim:
    """A series: one claim of `batch` items by the query `claim`, then their finish by
    `finish`, each a transaction (the claim's under `enable_seqscan = off` unless
    `seqscan`, as work_claim_v2 runs); it returns the items taken."""

    def take(conn: psycopg.Connection[Any], batch: int) -> int:
        with contextlib.nullcontext() if seqscan else conn.transaction():
            if not seqscan:
                conn.execute("SET LOCAL enable_seqscan = off")
            rows = conn.execute(QUERIES[claim], {**CLAIM, "limit": batch}).fetchall()
        if rows:
            ids, attempts = zip(*rows, strict=True)
            conn.execute(QUERIES[finish], {"ids": list(ids), "attempts": list(attempts)})
        return len(rows)

    return take


_ours = _claim_and_finish("floor_claim", "floor_finish")
_lean = _claim_and_finish("floor_lean_claim", "floor_finish", seqscan=False)
_kept = _claim_and_finish("floor_kept_claim", "floor_kept_finish")


def _plain(conn: psycopg.Connection[Any], batch: int) -> int:
    rows = conn.execute(QUERIES["floor_plain_claim"], {**CLAIM, "limit": batch}).fetchall()
    if rows:
        conn.execute(QUERIES["floor_plain_finish"], {"ids": [id for (id,) in rows]})
    return len(rows)


SERIES: tuple[Claim, ...] = (_ours, _lean, _kept, _plain)


def _server_ms(conn: psycopg.Connection[Any], items: int, batch: int, take: Claim) -> float:
    """Server CPU ms an item to claim and finish `items` new items with `take`, both
    tables emptied first. Every server process counts but one that ends during the run
    (`bench.cpu.ms_per_item`)."""
    conn.execute(QUERIES["floor_reset"])
    if take in (_ours, _lean):
        conn.execute(QUERIES["insert_queued"],
                     {"kind": "Noop", "prefix": "", "n": items, "age": 0, "scopes": 0})  # fmt: skip
    elif take is _kept:
        conn.execute(QUERIES["floor_kept_insert"], {"n": items})
    else:
        conn.execute(QUERIES["floor_plain_insert"], {"n": items})
    conn.execute(QUERIES["vacuum_analyze"])
    time.sleep(0.5)  # the VACUUM's own background writes settle outside the window
    before = snapshot((), server_pids(conn.info.backend_pid))
    done = 0
    while (taken := take(conn, batch)) > 0:
        done += taken
    assert done == items, (done, items)
    spent = ms_per_item(before, snapshot((), server_pids(conn.info.backend_pid)), items)
    server_ms = spent["server_cpu_ms_per_item"]
    assert server_ms is not None, "the server is not on this machine"
    return server_ms
