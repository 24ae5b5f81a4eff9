"""The fail-stop's clock: when each running handler must have ended, and the earliest.

A handler asked to stop (by its self-stop deadline at the latest) has the stop grace to
end; one that has not ended by then may still be writing files, so the process must
end. The Worker keeps that bound for each running attempt here, counted by value:
attempts claimed together, or renewed by one heartbeat, share one, so the earliest is
found among a few, and only when a change can move it (outside `together`, the earliest
is the least bound held: a later bound added or dropped leaves it, and nobody is told).
`watch` (one task for the Worker) asks for the fail-stop when the earliest bound comes
with a handler still running; `on_earliest` tells a watchdog outside the process, which
ends it at that time (plus a margin) even when the interpreter is wedged and `watch`
cannot run.
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
        self._held = 0  # inside together(): told once, after
        #: The earliest bound of a running handler, on Trio's clock (inf: none).
        self.earliest = math.inf

    def add(self, bound: float) -> None:
        self._bounds[bound] += 1
        if bound < self.earliest and not self._held:  # else the earliest stays
            self._tell(bound)

    def discard(self, bound: float) -> None:
        self._drop(bound)
        if bound <= self.earliest:  # else the earliest stays: a later bound went
            self._settle()

    def move(self, old: float, new: float) -> None:
        """One handler's bound moved from `old` to `new`."""
        self._bounds[new] += 1
        self._drop(old)
        self._settle()

    def _drop(self, bound: float) -> None:
        """One handler fewer at `bound`."""
        left = self._bounds[bound] - 1
        if left:
            self._bounds[bound] = left
        else:
            del self._bounds[bound]

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Many changes at once (a heartbeat's): the earliest is told once, after."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            self._settle()

    def _settle(self) -> None:
        """Tell whoever needs it when the earliest bound has changed (not in the middle
        of `together`)."""
        if self._held:
            return
        earliest = min(self._bounds, default=math.inf)
        if earliest != self.earliest:
            self._tell(earliest)

    def _tell(self, earliest: float) -> None:
        """The earliest bound is now `earliest`: tell `watch`, to sleep until it, and
        `on_earliest`."""
        self.earliest = earliest
        self._sooner.set()
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
