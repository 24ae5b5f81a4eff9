"""Group completions into one statement, as a database groups commits.

An attempt whose handler has returned hands its completion here and is done: nothing
waits for the answer, which comes back through `done(attempt, outcome)`. Completions
that arrive while a statement is in flight go out together in the next one; alone, a
completion goes out at once. Before each statement, a completion whose attempt's
self-stop deadline has passed is dropped (from then on the item belongs to lease
recovery); a statement that fails is tried again, with backoff, for the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from trioworker._core.errors import StoreError
from trioworker._core.policy import AttemptOutcome
from trioworker._core.retry import Backoff
from trioworker._store.api import WorkerStore
from trioworker._worker.attempt import Attempt

log = logging.getLogger("trioworker.executor")

MAX_BATCH = 500
COMPLETE = AttemptOutcome.COMPLETE


class CompletionBatcher:
    """`submit(attempt)` from any task; `run()` in the Worker's nursery."""

    def __init__(self, store: WorkerStore, done: Callable[[Attempt, AttemptOutcome], None]) -> None:
        self._store = store
        self._done = done
        self._pending: list[Attempt] = []
        self._wake = trio.Event()

    def submit(self, attempt: Attempt) -> None:
        self._pending.append(attempt)
        self._wake.set()

    async def run(self) -> None:
        backoff = Backoff(initial=0.2, maximum=2.0)
        while True:
            await self._wake.wait()
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            if not self._pending:
                self._wake = trio.Event()
            batch = [a for a in batch if self._still_due(a)]
            if not batch:  # all given up: the next completion starts a new series
                backoff.reset()
                continue
            attempts = [(a.item.id, a.item.attempt) for a in batch]
            try:
                if any(a.result is not None for a in batch):
                    applied = await self._store.complete_batch(attempts, [a.result for a in batch])
                else:  # no results: the plain finish, as before there were any
                    applied = await self._store.complete_batch(attempts)
            except StoreError as exc:
                delay = backoff.next()
                log.warning(
                    "could not record %d completion(s) (%s); retrying in %.1fs",
                    len(batch),
                    exc,
                    delay,
                )
                self._pending[:0] = batch
                self._wake.set()
                await trio.sleep(delay)
                continue
            backoff.reset()
            for attempt in batch:
                applies = attempt.item.id in applied
                self._done(attempt, COMPLETE if applies else AttemptOutcome.FENCED_OUT)

    def _still_due(self, attempt: Attempt) -> bool:
        """Whether the attempt may still write; if not, it is answered WRITE_FAILED."""
        if not attempt.self_stopped:
            return True
        self._done(attempt, AttemptOutcome.WRITE_FAILED)
        return False
