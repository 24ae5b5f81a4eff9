"""RetryPolicy's filters by exception type: `retry_on` (retry only these) and `never_retry`
(never these), and the reason an item fails with when one stops a retry (issue 35, item 7)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trioworker import DoNotRetry, RetryPolicy
from trioworker._core.policy import (
    ERROR_LIMIT,
    Action,
    Decision,
    Outcome,
    decide,
    exceptions_in,
)


def after(error: BaseException, policy: RetryPolicy, failures_before: int = 0) -> Decision:
    return decide(
        None, Outcome(error=error), failures_before=failures_before, policy=policy, rand=lambda: 0.5
    )


NETWORK = RetryPolicy(max_attempts=3, jitter=0.0, retry_on=(ConnectionError, TimeoutError))


def test_an_error_retry_on_names_is_retried() -> None:
    """retry_on=(ConnectionError, TimeoutError): a ConnectionResetError (a subclass) and a
    TimeoutError are retried with the policy's backoff, as without a filter."""
    for error in [ConnectionResetError("reset"), TimeoutError()]:
        decision = after(error, NETWORK)
        assert (decision.action, decision.delay, decision.reason) == (Action.RETRY, 2.0, None)


def test_an_error_retry_on_does_not_name_fails_at_once_saying_why() -> None:
    """A ValueError under retry_on=(ConnectionError, TimeoutError) fails on its first
    attempt; the reason names its class and the filter, the error stays its own text."""
    decision = after(ValueError("bad payload"), NETWORK)
    assert decision.action is Action.FAIL
    assert decision.reason == (
        "not retried: ValueError is not in retry_on (ConnectionError, TimeoutError)"
    )
    assert decision.error == "ValueError: bad payload"
    assert decision.traceback is not None and "ValueError: bad payload" in decision.traceback


def test_never_retry_wins_over_retry_on_and_names_the_class_it_matched() -> None:
    """never_retry=(FileNotFoundError,) beside retry_on=(OSError,): a missing file fails at
    once though it is an OSError; a PermissionError (another OSError) is retried."""
    policy = RetryPolicy(retry_on=OSError, never_retry=FileNotFoundError, jitter=0.0)
    missing = after(FileNotFoundError("/media/x"), policy)
    assert (missing.action, missing.reason) == (
        Action.FAIL,
        "not retried: FileNotFoundError matches never_retry (FileNotFoundError)",
    )
    assert after(PermissionError(), policy).action is Action.RETRY
    lookup = RetryPolicy(never_retry=(KeyError, LookupError))
    assert after(IndexError(), lookup).reason == (
        "not retried: IndexError matches never_retry (LookupError)"
    )
    assert (
        after(KeyError(), lookup).reason == "not retried: KeyError matches never_retry (KeyError)"
    )


def test_never_retry_alone_retries_everything_else() -> None:
    """Without retry_on, any error never_retry does not match is retried."""
    policy = RetryPolicy(never_retry=(ValueError,))
    assert after(RuntimeError(), policy).action is Action.RETRY
    assert after(ValueError(), policy).action is Action.FAIL


def test_a_filter_is_checked_before_the_attempts_run_out() -> None:
    """On the last allowed attempt, an error a filter refuses fails with the filter's
    reason (it would not have been retried anyway); one it allows, with the count."""
    last = NETWORK.max_attempts - 1
    assert after(ValueError(), NETWORK, last).reason == (
        "not retried: ValueError is not in retry_on (ConnectionError, TimeoutError)"
    )
    assert after(TimeoutError(), NETWORK, last).reason == "failed 3 of 3 attempts"


def test_do_not_retry_keeps_its_reason_whatever_the_filters_say() -> None:
    """DoNotRetry is the handler's own word: its reason, even where never_retry matches."""
    policy = RetryPolicy(retry_on=(DoNotRetry,), never_retry=(DoNotRetry,))
    assert after(DoNotRetry("no"), policy).reason == "handler said not to retry"


def test_a_group_is_retried_only_if_all_it_holds_would_be() -> None:
    """A handler's nursery raises an ExceptionGroup: retried when every exception in it,
    nested groups too, is; else the reason names the group and the first one that is not."""
    allowed = ExceptionGroup("x", [ConnectionError(), ExceptionGroup("y", [TimeoutError()])])
    assert after(allowed, NETWORK).action is Action.RETRY
    mixed = ExceptionGroup("x", [ConnectionError(), KeyError("k"), ValueError("v")])
    assert after(mixed, NETWORK).reason == (
        "not retried: ExceptionGroup holds KeyError, which is not in retry_on"
        " (ConnectionError, TimeoutError)"
    )
    banned = ExceptionGroup("x", [TimeoutError(), ExceptionGroup("y", [ValueError()])])
    policy = RetryPolicy(never_retry=(ValueError,))
    assert after(banned, policy).reason == (
        "not retried: ExceptionGroup holds ValueError, which matches never_retry (ValueError)"
    )


def test_a_group_of_one_is_named_as_a_group() -> None:
    """A nursery that raised one exception raises a group of one: the reason names the
    group and what it holds."""
    assert after(ExceptionGroup("x", [ValueError()]), NETWORK).reason == (
        "not retried: ExceptionGroup holds ValueError, which is not in retry_on"
        " (ConnectionError, TimeoutError)"
    )


def test_a_group_class_in_a_filter_matches_the_group_s_members_not_the_group() -> None:
    """retry_on=(ExceptionGroup,) says nothing about what a group holds: its members are
    what is matched, so a group of ValueErrors is not retried."""
    policy = RetryPolicy(retry_on=(ExceptionGroup,))
    assert after(ExceptionGroup("x", [ValueError()]), policy).action is Action.FAIL


def test_the_members_of_a_group_are_walked_in_order() -> None:
    """exceptions_in: the leaves of nested groups in the order they were raised."""
    a, b, c, d = ValueError("a"), KeyError("b"), OSError("c"), TypeError("d")
    group = ExceptionGroup("g", [a, ExceptionGroup("h", [b, c]), d])
    assert exceptions_in(group) == [a, b, c, d]
    assert exceptions_in(a) == [a]


class _Endless(ExceptionGroup[Exception]):
    """A group subclass whose members include itself: a walk must stop."""

    @property  # type: ignore[override]
    def exceptions(self) -> tuple[Exception, ...]:
        return (self, ValueError())


class _Unreadable(ExceptionGroup[Exception]):
    @property  # type: ignore[override]
    def exceptions(self) -> tuple[Exception, ...]:
        raise RuntimeError("no")


def test_a_group_that_cannot_be_walked_stands_for_itself() -> None:
    """A group that lists itself, or whose members raise when read, is matched as a
    whole: never an endless walk nor an exception out of the decision."""
    endless = _Endless("e", [ValueError()])
    assert exceptions_in(endless) == [endless]
    assert exceptions_in(endless, limit=3) == [endless]
    unreadable = _Unreadable("u", [ValueError()])
    assert exceptions_in(unreadable) == [unreadable]
    assert after(endless, RetryPolicy(retry_on=(_Endless,))).action is Action.RETRY
    assert after(unreadable, NETWORK).reason == (
        "not retried: _Unreadable is not in retry_on (ConnectionError, TimeoutError)"
    )


class _Counted(ExceptionGroup[Exception]):
    """A group whose members are counted as they are read."""

    read = 0

    @property  # type: ignore[override]
    def exceptions(self) -> Iterator[Exception]:  # type: ignore[override]
        for _ in range(100):
            _Counted.read += 1
            yield ValueError()


def test_a_walk_reads_no_more_members_than_its_limit() -> None:
    """However many members a group says it has, a walk reads at most `limit` of them,
    and the default limit is a thousand steps."""
    group = _Counted("c", [ValueError()])
    _Counted.read = 0  # mutmut runs the tests more than once in one process
    assert exceptions_in(group, limit=10) == [group]
    assert _Counted.read == 10
    assert len(exceptions_in(ExceptionGroup("g", [ValueError()] * 999))) == 999
    wide = ExceptionGroup("g", [ValueError()] * 1000)
    assert exceptions_in(wide) == [wide]


def test_a_walk_gives_up_at_its_limit() -> None:
    """Exactly `limit` steps: a group of three is walked in four (the group, then each)."""
    group = ExceptionGroup("g", [ValueError(), KeyError(), OSError()])
    assert len(exceptions_in(group, limit=4)) == 3
    assert exceptions_in(group, limit=3) == [group]


class _Masked(Exception):
    @property  # type: ignore[misc]
    def __class__(self) -> type:  # type: ignore[override]
        raise RuntimeError("who am I")


def test_an_error_whose_class_cannot_be_read_matches_no_filter() -> None:
    """isinstance consults `__class__`, which a handler's exception may make raise: it then
    matches nothing, so retry_on refuses it and never_retry lets it by."""
    assert RetryPolicy(retry_on=(KeyError,)).refusal(_Masked()) == (
        "not retried: _Masked is not in retry_on (KeyError)"
    )
    assert RetryPolicy(never_retry=(KeyError,)).refusal(_Masked()) is None


def test_a_long_list_of_classes_is_cut_to_the_error_limit() -> None:
    """The reason is bounded as the error text is."""
    many = tuple(type(f"E{'x' * 200}{i}", (Exception,), {}) for i in range(40))
    reason = after(ValueError(), RetryPolicy(retry_on=many)).reason
    assert reason is not None and len(reason) == ERROR_LIMIT
    assert reason.startswith("not retried: ValueError is not in retry_on (Exxx")


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"retry_on": (ValueError, "KeyError")}, "'KeyError'"),
        ({"never_retry": [int]}, "<class 'int'>"),
        ({"retry_on": ValueError()}, "not iterable"),
        ({"never_retry": None}, "not iterable"),
    ],
)
def test_a_filter_takes_exception_classes_only(kwargs: dict[str, Any], bad: str) -> None:
    """Anything but exception classes is refused when the policy is made."""
    with pytest.raises(TypeError, match=bad):
        RetryPolicy(**kwargs)


def test_a_filter_takes_one_class_or_any_iterable_of_them() -> None:
    """One class, a list or a generator all become a tuple; the default retries any error."""
    assert RetryPolicy(retry_on=KeyError).retry_on == (KeyError,)
    assert RetryPolicy(never_retry=[KeyError, OSError]).never_retry == (KeyError, OSError)
    assert RetryPolicy(retry_on=(e for e in [OSError])).retry_on == (OSError,)
    assert RetryPolicy().retry_on is None and RetryPolicy().never_retry == ()
    assert (
        RetryPolicy(retry_on=()).refusal(KeyError())
        == "not retried: KeyError is not in retry_on ()"
    )


CLASSES = [ValueError, KeyError, LookupError, OSError, ConnectionError, TimeoutError, TypeError]


@given(
    retry_on=st.none() | st.lists(st.sampled_from(CLASSES), max_size=3),
    never=st.lists(st.sampled_from(CLASSES), max_size=3),
    members=st.lists(st.sampled_from(CLASSES), min_size=1, max_size=4),
    grouped=st.booleans(),
    failures_before=st.integers(0, 5),
)
def test_the_filters_follow_their_rule(
    retry_on: list[type[Exception]] | None,
    never: list[type[Exception]],
    members: list[type[Exception]],
    grouped: bool,
    failures_before: int,
) -> None:
    """Retried exactly when attempts remain, nothing raised matches never_retry, and
    (retry_on given) everything raised matches retry_on; a refusal always says so."""
    policy = RetryPolicy(max_attempts=4, retry_on=retry_on, never_retry=never)
    raised = [cls() for cls in members]
    error: Exception = ExceptionGroup("g", raised) if grouped else raised[0]
    leaves = raised if grouped else raised[:1]
    allowed = not any(isinstance(e, tuple(never)) for e in leaves) and (
        retry_on is None or all(isinstance(e, tuple(retry_on)) for e in leaves)
    )
    decision = after(error, policy, failures_before)
    if allowed and failures_before + 1 < 4:
        assert decision.action is Action.RETRY
    else:
        assert decision.action is Action.FAIL
        assert decision.reason is not None
        assert decision.reason.startswith("not retried: ") != allowed
