"""A thread that fail-stops the process when the event loop is stuck past a self-stop.

A handler that blocks the event loop in synchronous code stops every timer: its own
deadline cannot fire and the in-loop stop watch cannot run. This thread sees it from
outside: the loop ticks it a few times a second, and publishes the earliest self-stop
deadline of its running attempts (in `time.monotonic()` terms) whenever it changes.
When that deadline plus the stop grace has passed and the loop has not ticked for over a second, the
file side effects cannot be trusted to stop, so the process exits.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

TICK_EVERY = 0.2
STUCK_AFTER = 1.0


class Watchdog:
    def __init__(self, stop_grace: float, fail_stop: Callable[[str], None]) -> None:
        self.stop_grace = stop_grace
        self._fail_stop = fail_stop
        self._last_tick = time.monotonic()
        self._deadline = math.inf
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="trioworker-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def tick(self) -> None:
        """Called from the loop a few times a second: it is alive."""
        self._last_tick = time.monotonic()

    def set_deadline(self, earliest: float) -> None:
        """Called from the loop whenever an attempt starts, ends or moves its deadline."""
        self._deadline = earliest

    def _watch(self) -> None:
        while not self._stopped.wait(TICK_EVERY):
            now = time.monotonic()
            stuck_for = now - self._last_tick
            if stuck_for > STUCK_AFTER and now > self._deadline + self.stop_grace:
                self._fail_stop(
                    f"the event loop has been blocked for {stuck_for:.1f}s and a running"
                    f" attempt is {now - self._deadline:.1f}s past its self-stop deadline;"
                    " a handler is blocking the loop in synchronous code"
                )
                return
