"""Group completions into one statement, as a database groups commits.

An attempt whose handler has returned hands its completion here and is done: nothing
waits for the answer, which comes back through `done(attempt, outcome)`. Completions
that arrive while a statement is in flight go out together in the next one; alone, a
completion goes out at once. Before each statement, a completion whose attempt's
self-stop deadline has passed is dropped (from then on the item belongs to lease
recovery); a statement that fails is tried again, with backoff, for the others.

When the Worker claims along (`claims`: it has one while it is not stopping), a batch
of completions and the next claim go out as one statement (`complete_and_claim`): the
slots of the batch's attempts, and every other free slot, are the claim's, and the
Worker pays one round trip for both instead of two.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import trio

from trioworker._core.errors import StoreError
from trioworker._core.policy import AttemptOutcome
from trioworker._core.retry import Backoff
from trioworker._store.api import WorkerStore
from trioworker._worker.attempt import Attempt, Slot

log = logging.getLogger("trioworker.executor")

MAX_BATCH = 500
COMPLETE = AttemptOutcome.COMPLETE


class ClaimsAlong(Protocol):
    """The Worker's claims, made along with a batch of completions."""

    def claiming(self) -> bool:
        """Whether the Worker claims now (not once it is stopping)."""

    def free_slots(self) -> list[Slot]:
        """Every slot free now, taken (none: an empty list)."""

    async def complete_and_claim(
        self, attempts: Sequence[tuple[int, int]], slots: list[Slot]
    ) -> set[int]:
        """Complete `attempts` and claim for `slots` in one call, run what was claimed
        and give back the slots left over (all of them if the call fails); the ids
        whose completion applied."""


class CompletionBatcher:
    """`submit(attempt)` from any task; `run()` in the Worker's nursery."""

    def __init__(self, store: WorkerStore, done: Callable[[Attempt, AttemptOutcome], None]) -> None:
        self._store = store
        self._done = done
        self._pending: list[Attempt] = []
        self._wake = trio.Event()
        #: The Worker's claims, when it claims along with completions (None: never).
        self.claims: ClaimsAlong | None = None

    @property
    def claims_along(self) -> bool:
        """Whether a batch now would claim too: then a completing attempt's slot is
        the batch's to give to the claim, not to be given back before."""
        return self.claims is not None and self.claims.claiming()

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
                applied = await self._send(attempts, batch)
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

    async def _send(self, pairs: list[tuple[int, int]], batch: list[Attempt]) -> set[int]:
        """The batch's completions, with a claim for the batch's slots and the free ones
        when the Worker claims along."""
        if any(a.result is not None for a in batch):
            # Results go with the plain finish (the finish and claim carries none); each
            # attempt keeps its slot, which its answer gives back.
            return await self._store.complete_batch(pairs, [a.result for a in batch])
        claims = self.claims
        if claims is None or not claims.claiming():
            return await self._store.complete_batch(pairs)
        # The slots the batch's attempts hold go to the claim (each attempt then holds
        # none: its answer gives back nothing), with every slot free now.
        slots = [s for s in (a.hand_over_slot() for a in batch) if s is not None]
        slots += claims.free_slots()
        if not slots:
            return await self._store.complete_batch(pairs)
        return await claims.complete_and_claim(pairs, slots)

    def _still_due(self, attempt: Attempt) -> bool:
        """Whether the attempt may still write; if not, it is answered WRITE_FAILED."""
        if not attempt.self_stopped:
            return True
        self._done(attempt, AttemptOutcome.WRITE_FAILED)
        return False
