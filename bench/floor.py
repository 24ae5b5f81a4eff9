"""The per-item floor in Python: what an attempt costs a Worker before any database work.

Issue 23 asks for a Worker CPU of at most 0.2 ms an item and for throughput past Graphile
Worker batched, whose Worker (Node.js) spends about 0.05 ms an item. This measures, with
no database and no I/O, CPU time (`time.process_time`) an item, series interleaved
round by round:

- `call`: one no-op handler awaited, nothing else (the floor of any Python Worker);
- `cancel scope`: inside a cancel scope with a deadline (the self-stop);
- `nursery, no task`: an empty nursery inside it;
- `nursery + watcher`: the attempt's nursery and one watcher task in it that waits for
  the deadline or a stop, cancelled when the handler returns: the shape the design
  mandates (each claimed item runs in a nursery whose cancel scope the heartbeats push).
  With a no-op handler the watcher is cancelled before it first runs; with a handler
  that checkpoints once, as any handler doing I/O does, it runs and waits first;
- `Worker`: the real Worker (`trioworker.testing.worker`, `--concurrency 128` as in
  `bench e2e`) over a store whose claims and completions answer at once from memory:
  everything a Worker does for an item but the SQL and the bridge to psycopg.

`bench e2e` measures the whole, the database included.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import trio

import trioworker.testing
from bench.common import Server, save, show
from trioworker import Registry, Settings, WorkItem
from trioworker.testing import MemoryStore

ROUNDS = 5


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

    async def complete_batch(self, attempts: Sequence[tuple[int, int]]) -> set[int]:
        """The Worker's one completion statement (its batcher's; it never calls
        `complete` itself)."""
        await trio.lowlevel.checkpoint()
        self.completed += len(attempts)
        if self.completed >= self.total:
            self.done.set()
        return {id for id, _ in attempts}


async def watched(handler: Handler, i: int, self_stop: float) -> None:
    """The attempt's shape: a nursery, a watcher beside the handler, cancelled after it."""
    changed = trio.Event()
    scope = trio.CancelScope(deadline=trio.current_time() + self_stop)

    async def watch() -> None:
        while not (scope.cancel_called or trio.current_time() >= scope.deadline):
            with trio.move_on_at(scope.deadline):
                await changed.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        with scope:
            await handler(item(i), None)
        nursery.cancel_scope.cancel()


def series(items: int) -> dict[str, Callable[[], Awaitable[None]]]:
    self_stop = Settings().self_stop_after

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

    async def watched_noop() -> None:
        for i in range(items):
            await watched(noop, i, self_stop)

    async def watched_checkpoint() -> None:
        for i in range(items):
            await watched(checkpoint, i, self_stop)

    async def worker() -> None:
        registry = Registry()
        registry.handler("Noop")(noop)
        store = InstantStore(items)
        settings = Settings(concurrency=128)
        async with trioworker.testing.worker(registry, settings=settings, store=store):
            await store.done.wait()

    return {
        "call": call,
        "cancel scope": cancel_scope,
        "nursery, no task": nursery,
        "nursery + watcher, no-op handler": watched_noop,
        "nursery + watcher, handler checkpoints": watched_checkpoint,
        "Worker, no-op handler, concurrency 128": worker,
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
        f"Per-item floor: {items:,} no-op attempts a round, {ROUNDS} rounds, CPU µs an item",
        ["series", "median µs", "min", "max"],
        rows,
    )
    save(out, "floor", server, {"items": items, "rounds": ROUNDS}, {"cpu_us_per_item": samples})
