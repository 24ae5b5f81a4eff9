"""Exponential backoff with jitter: one pure function and a small stateful helper."""

from __future__ import annotations

import random
from collections.abc import Callable


def backoff_delay(
    n: int,
    *,
    initial: float,
    maximum: float,
    factor: float = 2.0,
    jitter: float = 0.2,
    rand: Callable[[], float] = random.random,
) -> float:
    """The delay before retry number `n` (1-based): initial * factor**(n-1), capped at
    `maximum`, then spread by +/- `jitter` (a fraction) so retries do not march in step.
    """
    if n < 1:
        raise ValueError(f"retry numbers start at 1, not {n}")
    base = min(maximum, initial * factor ** min(n - 1, 64))
    return max(0.0, base * (1.0 + jitter * (2.0 * rand() - 1.0)))


class Backoff:
    """Delays for a loop that retries until something succeeds."""

    def __init__(self, *, initial: float, maximum: float, jitter: float = 0.2) -> None:
        self._initial = initial
        self._maximum = maximum
        self._jitter = jitter
        self._failures = 0

    def next(self) -> float:
        self._failures += 1
        return backoff_delay(
            self._failures, initial=self._initial, maximum=self._maximum, jitter=self._jitter
        )

    def reset(self) -> None:
        self._failures = 0

    @property
    def failures(self) -> int:
        return self._failures
