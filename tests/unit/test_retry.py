"""Backoff delays at their edges, and the retry delay `decide` passes through."""

from __future__ import annotations

import math

from trioworker._core.policy import Action, Outcome, RetryPolicy, decide
from trioworker._core.retry import Backoff, backoff_delay


def test_the_default_jitter_is_a_fifth_either_way() -> None:
    """Without a jitter argument, a delay lies within +/-20% of its base."""
    assert backoff_delay(1, initial=10.0, maximum=99.0, rand=lambda: 0.0) == 8.0
    assert backoff_delay(1, initial=10.0, maximum=99.0, rand=lambda: 1.0) == 12.0


def test_the_backoff_helpers_default_jitter_is_a_fifth_either_way() -> None:
    """Backoff's delays, drawn at random, always stay within +/-20% of their base."""
    backoff = Backoff(initial=10.0, maximum=10.0)
    delays = [backoff.next() for _ in range(500)]
    assert all(8.0 <= d <= 12.0 for d in delays)
    assert len(set(delays)) > 1  # the jitter does spread them


def test_delays_below_a_second_are_kept() -> None:
    """Short delays are not rounded up: only negative ones would be clamped to 0."""
    assert backoff_delay(1, initial=0.25, maximum=1.0, jitter=0.0) == 0.25
    assert backoff_delay(1, initial=0.5, maximum=1.0, jitter=1.0, rand=lambda: 0.0) == 0.0


def test_the_exponent_stops_growing_so_huge_retry_numbers_do_not_overflow() -> None:
    """The growth stops at factor**64: no OverflowError, however many retries."""
    big = backoff_delay(10_000, initial=1.0, maximum=math.inf, jitter=0.0)
    assert big == 2.0**64


def test_decide_spreads_retry_delays_with_the_given_randomness() -> None:
    """The retry delay uses the policy's jitter and the caller's random source."""
    policy = RetryPolicy(max_attempts=5, initial_delay=10.0, max_delay=100.0, jitter=0.5)
    low = decide(
        None, Outcome(error=ValueError()), failures_before=0, policy=policy, rand=lambda: 0.0
    )
    high = decide(
        None, Outcome(error=ValueError()), failures_before=0, policy=policy, rand=lambda: 1.0
    )
    assert (low.action, low.delay, high.delay) == (Action.RETRY, 5.0, 15.0)
