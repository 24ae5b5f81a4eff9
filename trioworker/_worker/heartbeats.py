"""The Worker's heartbeat: one statement an interval renews every lease it holds.

Each beat runs under `move_on_after(heartbeat interval)`, so a call that hangs is cut
off and the next one still goes out on time. An attempt whose row came back has its
self-stop deadline pushed to the statement's send time + lease/2 (never sooner, and
never once it has passed); one whose row did not come back is lost; a cancel request
is read for each. An attempt claimed between two beats is renewed at the next one, so
none waits longer than one interval for its first renewal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager

import trio

from trioworker._core.errors import StoreError
from trioworker._core.model import Heartbeat
from trioworker._core.policy import CancelReason
from trioworker._core.settings import Settings
from trioworker._store.api import WorkerStore
from trioworker._worker.attempt import Attempt

log = logging.getLogger("trioworker.executor")


class Heartbeats:
    """`run()` in the Worker's nursery renews the leases of `attempts` (the running
    ones, a set the executor keeps), calling `moved(attempt)` after each change, all of
    one beat inside `together()`."""

    def __init__(
        self,
        store: WorkerStore,
        settings: Settings,
        attempts: Collection[Attempt],
        *,
        moved: Callable[[Attempt], None],
        together: Callable[[], AbstractContextManager[None]],
        observe: Callable[[str, str, float | None], None],
    ) -> None:
        self._store = store
        self._settings = settings
        self._attempts = attempts
        self._moved = moved
        self._together = together
        self._observe = observe

    async def run(self) -> None:
        interval = self._settings.heartbeat
        next_beat = trio.current_time() + interval
        while True:
            await trio.sleep_until(next_beat)
            next_beat += interval
            held = [attempt for attempt in self._attempts if attempt.renewable]
            if held:
                await self._beat(held)

    async def _beat(self, held: list[Attempt]) -> None:
        interval, lease = self._settings.heartbeat, self._settings.lease
        keys = list(dict.fromkeys((a.item.id, a.item.attempt) for a in held))
        sent_at = trio.current_time()
        failure = f"no answer within {interval:g}s"
        with trio.move_on_after(interval):
            try:
                answers = await self._store.heartbeat_many(keys, lease)
            except StoreError as exc:
                failure = str(exc)
            else:
                self._observe("heartbeat_rtt", "", trio.current_time() - sent_at)
                with self._together():
                    self._apply(held, answers, sent_at + self._settings.self_stop_after)
                return
        first = min(a.deadline for a in held) - trio.current_time()
        log.warning(
            "heartbeat of %d attempt(s) failed (%s); the first self-stops in %.1fs"
            " unless one succeeds",
            len(held),
            failure,
            first,
        )
        for attempt in held:
            attempt.trace.event("heartbeat_failed", failure)

    def _apply(
        self, held: list[Attempt], answers: dict[tuple[int, int], Heartbeat], deadline: float
    ) -> None:
        for attempt in held:
            answer = answers.get((attempt.item.id, attempt.item.attempt))
            if answer is None:  # its row is locked (its own transaction, an operator)
                attempt.trace.event("heartbeat_failed", "its row is held by a transaction")
            elif answer is Heartbeat.LOST:
                attempt.stop(CancelReason.LOST)
            else:
                attempt.renew(deadline)
                if answer is Heartbeat.CANCEL_REQUESTED:
                    attempt.stop(CancelReason.CANCEL_REQUESTED)
            self._moved(attempt)
