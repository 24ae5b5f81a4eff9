"""Group completions into one statement, as a database groups commits.

Attempts that finish while a completion statement is in flight wait for the next one,
which carries all of them. Nothing waits on purpose: alone, a completion goes out at
once; under load, one round trip serves many.
"""

from __future__ import annotations

import math

import attrs
import trio

from trioworker._core.errors import StoreError
from trioworker._store.api import Store

MAX_BATCH = 500


@attrs.define
class _Request:
    id: int
    attempt: int
    done: trio.Event = attrs.field(factory=trio.Event)
    applied: bool = False
    error: StoreError | None = None


class CompletionBatcher:
    """`await complete(id, attempt)` from any task; `run()` in the Worker's nursery."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._send, self._receive = trio.open_memory_channel[_Request](math.inf)

    async def complete(self, id: int, attempt: int) -> bool:
        """Whether the fenced complete applied; raises StoreError like store.complete."""
        request = _Request(id, attempt)
        self._send.send_nowait(request)
        await request.done.wait()
        if request.error is not None:
            raise request.error
        return request.applied

    async def run(self) -> None:
        async for first in self._receive:
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            await self._flush(batch)

    async def _flush(self, batch: list[_Request]) -> None:
        error: StoreError | None = StoreError("complete abandoned: the Worker stopped at once")
        applied: set[int] = set()
        try:
            applied = await self._store.complete_batch([(r.id, r.attempt) for r in batch])
            error = None
        except StoreError as exc:
            error = exc
        finally:
            for request in batch:
                request.applied = request.id in applied
                request.error = error
                request.done.set()
