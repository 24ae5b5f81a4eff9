"""The fail-stop's clock: when each running handler must have ended, and the earliest.

A handler asked to stop (by its self-stop deadline at the latest) has the stop grace to
end; one that has not ended by then may still be writing files, so the process must
end. The Worker keeps that bound for each running attempt here, counted by value:
attempts claimed together, or renewed by one heartbeat, share one, so the earliest is
found among a few. `watch` (one task for the Worker) asks for the fail-stop when the
earliest bound comes with a handler still running; `on_earliest` tells a watchdog
outside the process, which ends it at that time (plus a margin) even when the
interpreter is wedged and `watch` cannot run.
"""

from __future__ import annotations

import collections
import contextlib
import math
from collections.abc import Callable, Iterator

import trio


class StopWatch:
    """The running handlers' bounds (`add`, `discard`), the earliest of them, and the
    task that acts on it (`watch`)."""

    def __init__(self, on_earliest: Callable[[float], None] | None = None) -> None:
        """`on_earliest(at)` is called whenever the earliest bound changes (inf: none)."""
        self._bounds: collections.Counter[float] = collections.Counter()
        self._on_earliest = on_earliest
        self._sooner = trio.Event()
        self._holding = False
        #: The earliest bound of a running handler, on Trio's clock (inf: none).
        self.earliest = math.inf

    def add(self, bound: float) -> None:
        self._bounds[bound] += 1
        if bound < self.earliest:
            self._set(bound)

    def discard(self, bound: float) -> None:
        if self._drop(bound) and bound == self.earliest:
            self._set(min(self._bounds, default=math.inf))

    def move(self, old: float, new: float) -> None:
        """One handler's bound moved from `old` to `new` (told once, if it changes
        the earliest)."""
        self._bounds[new] += 1
        if (self._drop(old) and old == self.earliest) or new < self.earliest:
            self._set(min(self._bounds))

    def _drop(self, bound: float) -> bool:
        """One handler fewer at `bound`; whether it was the last there."""
        left = self._bounds[bound] - 1
        if left:
            self._bounds[bound] = left
            return False
        del self._bounds[bound]
        return True

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Many changes at once (a heartbeat's): the earliest is told once, after."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
            self._set(min(self._bounds, default=math.inf))

    def _set(self, earliest: float) -> None:
        if self._holding or earliest == self.earliest:
            return
        if earliest < self.earliest:
            self._sooner.set()  # `watch` sleeps until the later one
        self.earliest = earliest
        if self._on_earliest is not None:
            self._on_earliest(earliest)

    async def watch(self, overdue: Callable[[float], None]) -> None:
        """Call `overdue(now)` whenever the earliest bound has come; it must discard
        the bounds it acts on."""
        while True:
            self._sooner = sooner = trio.Event()
            with trio.move_on_at(self.earliest):
                await sooner.wait()
            now = trio.current_time()
            if now >= self.earliest:
                overdue(now)
