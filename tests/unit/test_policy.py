"""The pure decisions: which write follows an attempt, and retry delays."""

from __future__ import annotations

import pytest

from trioworker import Lost
from trioworker._policy import (
    Action,
    CancelReason,
    Decision,
    DoNotRetry,
    Outcome,
    RetryPolicy,
    decide,
    describe_error,
    describe_traceback,
)
from trioworker._retry import Backoff, backoff_delay

POLICY = RetryPolicy(max_attempts=3, initial_delay=2.0, max_delay=60.0, jitter=0.0)
RETURNED = Outcome()
RAISED = Outcome(error=ValueError("bad"))


def choose(reason: CancelReason | None, outcome: Outcome, failures_before: int = 0) -> Decision:
    return decide(reason, outcome, failures_before=failures_before, policy=POLICY, rand=lambda: 0.5)


@pytest.mark.parametrize("outcome", [RETURNED, RAISED, Outcome(error=DoNotRetry("x"))])
@pytest.mark.parametrize(
    ("reason", "action"),
    [
        (CancelReason.SELF_STOP, Action.NOTHING),
        (CancelReason.LOST, Action.NOTHING),
        (CancelReason.CANCEL_REQUESTED, Action.CANCEL),
        (CancelReason.SHUTDOWN, Action.RELEASE),
    ],
)
def test_a_cancel_reason_decides_the_write_whatever_the_handler_did(
    reason: CancelReason, action: Action, outcome: Outcome
) -> None:
    """Once cancelled, the reason alone picks the write: self-stop and lost write nothing."""
    assert choose(reason, outcome, failures_before=10) == Decision(action)


def test_a_returned_handler_completes() -> None:
    """No cancel, handler returned: complete."""
    assert choose(None, RETURNED) == Decision(Action.COMPLETE)


def raised(error: BaseException) -> BaseException:
    """`error` raised and caught, so it carries a traceback."""
    try:
        raise error
    except BaseException as caught:
        return caught


TRACED = Outcome(error=raised(ValueError("bad")))
TRACE = describe_traceback(TRACED.error)  # type: ignore[arg-type]


def test_an_error_is_retried_with_exponential_backoff() -> None:
    """Errors before the last attempt retry after initial * 2**n seconds, keeping the
    error and its traceback."""
    assert choose(None, TRACED, 0) == Decision(
        Action.RETRY, delay=2.0, error="ValueError: bad", traceback=TRACE
    )
    assert choose(None, TRACED, 1) == Decision(
        Action.RETRY, delay=4.0, error="ValueError: bad", traceback=TRACE
    )
    assert "raise error" in TRACE and TRACE.endswith("ValueError: bad\n")


def test_the_last_attempts_error_fails_the_item() -> None:
    """The max_attempts-th error fails the item, saying how many attempts failed."""
    assert choose(None, TRACED, 2) == Decision(
        Action.FAIL, reason="failed 3 of 3 attempts", error="ValueError: bad", traceback=TRACE
    )


def test_do_not_retry_fails_on_the_first_error() -> None:
    """An error that says not to retry fails at once."""
    error = raised(DoNotRetry("unsupported"))
    decision = choose(None, Outcome(error=error))
    assert decision == Decision(
        Action.FAIL,
        reason="handler said not to retry",
        error="DoNotRetry: unsupported",
        traceback=describe_traceback(error),
    )


def test_a_lost_item_writes_nothing_whatever_the_handler_did() -> None:
    """A handler whose fenced transaction found its item gone (Lost) writes nothing."""
    assert choose(None, Outcome(error=raised(Lost("gone")))) == Decision(Action.NOTHING)


def test_a_long_traceback_keeps_its_tail() -> None:
    """A traceback over the limit keeps its last `limit` characters (where it failed),
    after a line saying how much was cut; one within the limit is whole."""
    error = raised(ValueError("x" * 500))
    whole = describe_traceback(error)
    assert describe_traceback(error, limit=len(whole)) == whole
    cut = describe_traceback(error, limit=100)
    assert cut == f"... ({len(whole) - 100} characters cut)\n" + whole[-100:]


def test_describe_error_without_a_message_is_its_type() -> None:
    """An error with no text is described by its type alone."""
    assert describe_error(KeyError()) == "KeyError"
    assert describe_error(OSError("x")) == "OSError: x"


def test_backoff_grows_then_caps() -> None:
    """initial * factor**(n-1), capped at maximum."""
    delays = [backoff_delay(n, initial=1.0, maximum=10.0, jitter=0.0) for n in range(1, 7)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff_delay(10_000, initial=1.0, maximum=10.0, jitter=0.0) == 10.0


def test_backoff_jitter_spreads_both_ways() -> None:
    """Jitter moves the delay by up to +/- the jitter fraction."""
    assert backoff_delay(1, initial=10.0, maximum=99.0, jitter=0.2, rand=lambda: 0.0) == 8.0
    assert backoff_delay(1, initial=10.0, maximum=99.0, jitter=0.2, rand=lambda: 1.0) == 12.0
    assert backoff_delay(1, initial=10.0, maximum=99.0, jitter=0.2, rand=lambda: 0.5) == 10.0


def test_backoff_counts_from_one() -> None:
    """Retry numbers start at 1."""
    with pytest.raises(ValueError, match="start at 1"):
        backoff_delay(0, initial=1.0, maximum=2.0)


def test_backoff_helper_resets() -> None:
    """The helper counts failures and starts over after a success."""
    backoff = Backoff(initial=1.0, maximum=4.0, jitter=0.0)
    assert [backoff.next() for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]
    assert backoff.failures == 4
    backoff.reset()
    assert (backoff.failures, backoff.next()) == (0, 1.0)


@pytest.mark.parametrize(
    "kwargs", [{"max_attempts": 0}, {"initial_delay": -1}, {"jitter": 1.5}, {"max_delay": -2}]
)
def test_retry_policy_rejects_nonsense(kwargs: dict[str, float]) -> None:
    """A retry policy with impossible numbers is refused."""
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
