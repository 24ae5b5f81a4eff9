"""The Trio store with its client operations sent through `trioworker.Client` or
`trioworker.AsyncClient` instead, so the contract tests hold both clients to the same
behaviour as the Trio store and the in-memory store.

Each client call runs in a thread (the sync client's own; the asyncio client's on an
event loop of its own in a thread), as it would in a synchronous or asyncio program;
the Worker's face (claim, heartbeat, the fenced writes) is the Trio store's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import attrs
import trio

from trioworker import AsyncClient, Client, PostgresStore, StoreStatistics

T = TypeVar("T")

#: What both clients offer, by the names the Trio store gives them.
CLIENT_OPERATIONS = frozenset(
    {
        "enqueue", "enqueue_many", "cancel", "retry", "failed_items", "pause", "resume",
        "pauses", "get_item", "attempts", "show", "queue_counts", "status", "schedules",
        "result",
    }
)  # fmt: skip

Invoke = Callable[[str, tuple[Any, ...], dict[str, Any]], Any]

#: Seconds a client call may take before the test fails (a thread cannot be cancelled).
CALL_BOUND = 120.0


class EventLoopThread:
    """An asyncio event loop running in a thread of its own."""

    def __init__(self) -> None:
        # A plain asyncio loop: trio-asyncio (imported by these tests) replaces
        # new_event_loop() with its own.
        self.loop: asyncio.AbstractEventLoop = asyncio.SelectorEventLoop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run the coroutine `make()` makes on the loop; block until it is done."""

        async def main() -> T:
            return await make()

        future = asyncio.run_coroutine_threadsafe(main(), self.loop)
        done, _ = concurrent.futures.wait([future], timeout=CALL_BOUND)
        if not done:  # (not future.result(timeout=...): a call may raise TimeoutError)
            future.cancel()
            raise AssertionError(f"an asyncio client call took over {CALL_BOUND} s")
        return future.result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CALL_BOUND)
        assert not self._thread.is_alive(), "the asyncio client's loop did not stop"
        self.loop.close()


class ThroughClient:
    """A store whose client operations go through a client; the rest is `store`'s."""

    def __init__(self, store: PostgresStore, client: Client | AsyncClient, invoke: Invoke) -> None:
        self._store = store
        self._client = client
        self._invoke = invoke
        self._dedup_hits = 0

    @property
    def known_kinds(self) -> frozenset[str] | None:
        return self._client.known_kinds

    @known_kinds.setter
    def known_kinds(self, kinds: frozenset[str] | None) -> None:
        self._store.known_kinds = self._client.known_kinds = kinds

    def __getattr__(self, name: str) -> Any:
        if name not in CLIENT_OPERATIONS:
            return getattr(self._store, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            result = await trio.to_thread.run_sync(self._invoke, name, args, kwargs)
            if name == "enqueue":
                self._dedup_hits += result.deduplicated
            elif name == "enqueue_many":
                self._dedup_hits += sum(r.deduplicated for r in result)
            return result

        return call

    def statistics(self) -> StoreStatistics:
        stats = self._store.statistics()
        return attrs.evolve(stats, dedup_hits=stats.dedup_hits + self._dedup_hits)

    def __repr__(self) -> str:
        return f"ThroughClient({self._client!r})"


@contextlib.contextmanager
def through_sync_client(store: PostgresStore) -> Iterator[ThroughClient]:
    with Client(store.dsn, known_kinds=store.known_kinds) as client:
        yield ThroughClient(
            store, client, lambda name, args, kwargs: getattr(client, name)(*args, **kwargs)
        )


@contextlib.contextmanager
def through_async_client(store: PostgresStore) -> Iterator[ThroughClient]:
    thread = EventLoopThread()
    client = AsyncClient(store.dsn, known_kinds=store.known_kinds)
    try:
        yield ThroughClient(
            store,
            client,
            lambda name, args, kwargs: thread.run(lambda: getattr(client, name)(*args, **kwargs)),
        )
    finally:
        thread.run(client.close)
        thread.close()
