"""The pure decisions: which write follows an attempt, and retry delays."""

from __future__ import annotations

import itertools
import traceback
from typing import Any

import pytest

from trioworker import Lost
from trioworker._core.policy import (
    ERROR_LIMIT,
    REDUCED_ERROR_LIMIT,
    UNSTORABLE_ERROR,
    Action,
    CancelReason,
    Decision,
    DoNotRetry,
    Outcome,
    RetryPolicy,
    decide,
    describe_error,
    describe_traceback,
    formattable,
    reduced,
    undecodable_payload,
    undecodable_values,
)
from trioworker._core.retry import Backoff, backoff_delay

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


# -- what handlers raise, made storable (issue 18) -------------------------------------


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (DoNotRetry("no such file: /m/caf\udce9"), "DoNotRetry: no such file: /m/caf\\udce9"),
        (ValueError("a\x00b"), "ValueError: a\\x00b"),
        (BrokenStr(), "BrokenStr: <str() of the error raised RuntimeError>"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (SystemExit(3), "SystemExit: 3"),
        (ValueError("é [b]"), "ValueError: é [b]"),
    ],
)
def test_an_error_is_described_as_storable_text(error: BaseException, text: str) -> None:
    assert describe_error(error) == text


def test_an_error_text_is_cut_to_its_limit() -> None:
    text = describe_error(ValueError("x" * 10_000))
    assert len(text) == ERROR_LIMIT and text.startswith("ValueError: xxx")
    assert text.endswith("x...")


def test_a_traceback_is_storable_and_within_its_limit_after_escaping() -> None:
    """Escaping a surrogate takes six characters for one: the cut comes after it, so
    the stored traceback still fits the table's limit."""
    try:
        raise ValueError("\udce9" * 10_000)
    except ValueError as exc:
        text = describe_traceback(exc, limit=1000)
    assert "\udce9" not in text and "\\udce9" in text
    assert len(text) <= 1000 + len("... (59999 characters cut)\n")
    assert text.startswith("... (") and text.endswith("\\udce9\n")
    text.encode("utf-8")  # storable


def test_a_traceback_of_a_broken_str_is_still_formatted() -> None:
    try:
        raise BrokenStr
    except BrokenStr as exc:
        text = describe_traceback(exc)
    assert text.startswith("Traceback") and "BrokenStr: <exception str() failed>" in text


def test_a_refused_write_is_reduced_then_replaced() -> None:
    """The database refused the full text: first without the traceback and cut short,
    ASCII only; then a fixed text; then nothing is left to cut."""
    full = Decision(Action.FAIL, reason="r", error="E: " + "é" * 600, traceback="tb")
    first = reduced(full)
    assert first is not None
    assert (first.action, first.reason, first.traceback) == (Action.FAIL, "r", None)
    assert first.error is not None and first.error.isascii()
    assert first.error.startswith("E: \\xe9") and len(first.error) == REDUCED_ERROR_LIMIT
    second = reduced(first)
    assert second == Decision(Action.FAIL, reason="r", error=UNSTORABLE_ERROR)
    assert reduced(second) is None
    short = Decision(Action.RETRY, delay=3.0, error="E: x")
    assert reduced(short) == Decision(Action.RETRY, delay=3.0, error=UNSTORABLE_ERROR)
    assert reduced(Decision(Action.RETRY, error="E: x", traceback="tb")) == Decision(
        Action.RETRY, error="E: x"
    )
    assert reduced(Decision(Action.COMPLETE)) is None


def test_an_undecodable_payload_fails_its_item_with_the_reason() -> None:
    assert undecodable_payload("nested too deeply") == Decision(
        Action.FAIL,
        reason="payload cannot be decoded",
        error="UndecodablePayload: the payload nested too deeply",
    )


def completed(reason: CancelReason | None, outcome: Outcome) -> Decision:
    return decide(
        reason, outcome, failures_before=9, policy=POLICY, completed=True, rand=lambda: 0.5
    )


@pytest.mark.parametrize(
    "outcome",
    [RETURNED, RAISED, Outcome(error=DoNotRetry("x")), Outcome(error=Lost("x"))],
)
@pytest.mark.parametrize(
    "reason", [None, CancelReason.CANCEL_REQUESTED, CancelReason.SHUTDOWN, CancelReason.TIMEOUT]
)
def test_an_item_completed_in_its_transaction_is_finished_succeeded_whatever_followed(
    reason: CancelReason | None, outcome: Outcome
) -> None:
    """Its success is durable: the write after its handler returns finishes it as
    Succeeded (giving its scope back), whatever the handler raised after the commit
    or whoever asked it to stop meanwhile."""
    assert completed(reason, outcome) == Decision(Action.COMPLETE)
    database_lost = Outcome(error=ValueError("down"), database_lost=True)
    assert completed(reason, database_lost) == Decision(Action.COMPLETE)


@pytest.mark.parametrize("reason", [CancelReason.SELF_STOP, CancelReason.LOST])
def test_a_completed_item_past_its_self_stop_or_lost_still_writes_nothing(
    reason: CancelReason,
) -> None:
    """Past the deadline the item is lease recovery's (which finishes it Succeeded)."""
    assert completed(reason, RETURNED) == Decision(Action.NOTHING)


def test_a_lost_database_link_is_a_stall_not_a_failure() -> None:
    """Even past the retry budget: the attempt writes nothing, and lease recovery
    counts a stall."""
    lost = Outcome(error=ValueError("down"), database_lost=True)
    assert choose(None, lost, failures_before=5) == Decision(Action.NOTHING)
    assert choose(CancelReason.CANCEL_REQUESTED, lost) == Decision(Action.CANCEL)
    assert choose(None, Outcome(error=ValueError("down")), failures_before=5).action is (
        Action.FAIL
    )


def test_a_traceback_that_cannot_be_formatted_falls_back_to_its_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the standard formatting raises (anything, KeyboardInterrupt too), the
    frames alone and the error's description."""

    def broken(error: BaseException) -> list[str]:
        raise KeyboardInterrupt

    monkeypatch.setattr("trioworker._core.policy.traceback.format_exception", broken)
    error = raised(ValueError("x"))
    assert describe_traceback(error) == (
        "Traceback (most recent call last):\n"
        + "".join(traceback.format_tb(error.__traceback__))
        + "ValueError: x\n"
    )
    assert describe_traceback(ValueError("y")) == (
        "Traceback (most recent call last):\nValueError: y\n"
    )


class HostileTraceback(ValueError):
    @property  # type: ignore[override]
    def __traceback__(self) -> None:
        raise SystemExit(1)


def test_a_traceback_without_frames_to_format_is_the_description(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(error: BaseException) -> list[str]:
        raise RuntimeError("formatting broke")

    monkeypatch.setattr("trioworker._core.policy.traceback.format_exception", broken)
    assert describe_traceback(HostileTraceback("z")) == (
        "Traceback (most recent call last):\nHostileTraceback: z\n"
    )


class RaisesOnStr(Exception):
    def __init__(self, raised: BaseException) -> None:
        super().__init__()
        self.raised = raised

    def __str__(self) -> str:
        raise self.raised


class Nameless(type):
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        raise KeyboardInterrupt


class NamelessError(Exception, metaclass=Nameless):
    pass


class SneakyText(str):
    """A str whose own methods raise: describing must use str's, never these."""

    def __format__(self, spec: str) -> str:
        raise KeyboardInterrupt

    def isascii(self) -> bool:
        raise KeyboardInterrupt

    def __len__(self) -> int:
        raise KeyboardInterrupt


class SneakyStr(Exception):
    def __str__(self) -> str:
        return SneakyText("sneaky")


HOSTILE = {
    "str raises KeyboardInterrupt": (
        lambda: RaisesOnStr(KeyboardInterrupt()),
        "RaisesOnStr: <str() of the error raised KeyboardInterrupt>",
    ),
    "str raises SystemExit": (
        lambda: RaisesOnStr(SystemExit(2)),
        "RaisesOnStr: <str() of the error raised SystemExit>",
    ),
    "str raises BaseException": (
        lambda: RaisesOnStr(BaseException()),
        "RaisesOnStr: <str() of the error raised BaseException>",
    ),
    "str raises RecursionError": (
        lambda: RaisesOnStr(RecursionError()),
        "RaisesOnStr: <str() of the error raised RecursionError>",
    ),
    "a class without a name": (
        lambda: NamelessError("x"),
        "<an exception class without a name>: x",
    ),
    "str returns a hostile str": (SneakyStr, "SneakyStr: sneaky"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_describing_an_error_never_raises_whatever_it_does(case: str) -> None:
    """What a handler raised is data: a __str__ raising a BaseException, a metaclass
    without a name, a str subclass with hostile methods are all described, and their
    tracebacks formatted. (Made inside the test: pytest itself would trip on them.)"""
    make, text = HOSTILE[case]
    described = describe_error(make())
    trace = describe_traceback(raised(make()))
    assert type(described) is str and described == text
    assert type(trace) is str and trace.startswith("Traceback (most recent call last):")


def test_a_group_nested_deeper_than_the_recursion_limit_is_described() -> None:
    """2,000 levels of ExceptionGroup: described and its traceback formatted (cut)."""
    group: BaseException = ValueError("leaf")
    for depth in range(2_000):
        group = ExceptionGroup(f"level {depth}", [group])
    assert describe_error(group) == "ExceptionGroup: level 1999 (1 sub-exception)"
    trace = describe_traceback(raised(group))
    assert "Exception Group Traceback" in trace and "max_group_depth" in trace


def test_an_undecodable_time_fails_its_item_naming_each_column() -> None:
    """A claimed item whose stored times Python cannot hold fails at once; the reason
    names the columns, the error each one and why."""
    assert undecodable_values([("requested_at", "cannot be decoded: too large")]) == Decision(
        Action.FAIL,
        reason="requested_at cannot be decoded",
        error="UndecodableValue: requested_at cannot be decoded: too large",
    )
    both = undecodable_values([("requested_at", "is 'infinity'"), ("run_after", "is BC")])
    assert both.reason == "requested_at, run_after cannot be decoded"
    assert both.error == "UndecodableValue: requested_at is 'infinity'; run_after is BC"
    long = undecodable_values([("requested_at", "x" * 10_000)])
    assert long.error is not None and len(long.error) <= ERROR_LIMIT


def test_an_undecodable_payloads_reason_is_cut_to_the_error_limit() -> None:
    decision = undecodable_payload("x" * 10_000)
    assert decision.error is not None and len(decision.error) == ERROR_LIMIT


class ListsItself(ExceptionGroup):  # type: ignore[type-arg]
    @property
    def exceptions(self) -> Any:  # type: ignore[override]
        return (self, self)


class HostileCause(ValueError):
    @property  # type: ignore[override]
    def __cause__(self) -> Any:
        raise KeyboardInterrupt


def test_a_traceback_too_large_or_strange_to_format_is_told_apart() -> None:
    """The standard formatting walks every listed member, as often as it is listed: a
    group listing itself, a member listed twice at each of 20 levels (a million
    exceptions) or a cause that raises is not handed to it; a plain chain or a modest
    group is."""
    diamond: BaseException = ValueError("leaf")
    for _ in range(20):
        diamond = ExceptionGroup("twice", [diamond, diamond])
    assert not formattable(ListsItself("g", [ValueError("x")]))
    assert not formattable(diamond)
    assert not formattable(HostileCause("c"))
    assert formattable(ExceptionGroup("g", [ValueError(str(n)) for n in range(100)]))
    chained = ValueError("a")
    chained.__cause__ = chained.__context__ = KeyError("b")
    assert formattable(chained)
    assert not formattable(ExceptionGroup("g", [ValueError("x")] * 5), limit=5)
    assert formattable(ExceptionGroup("g", [ValueError("x")] * 4), limit=6)
    trace = describe_traceback(raised(diamond))
    assert trace.startswith("Traceback (most recent call last):\n")
    assert trace.endswith("ExceptionGroup: twice (2 sub-exceptions)\n")


class EndlessGroup(ExceptionGroup):  # type: ignore[type-arg]
    @property
    def exceptions(self) -> Any:  # type: ignore[override]
        return (ValueError(str(n)) for n in itertools.count())


def test_chains_are_walked_once_each_and_what_they_hold_counts() -> None:
    """A context cycle is walked once (formattable); a cause holding a group that lists
    itself is not; nor an endless group, whose walk stops at the limit."""
    first, second = ValueError("first"), ValueError("second")
    first.__context__, second.__context__ = second, first
    assert formattable(first)
    caused = ValueError("caused")
    caused.__cause__ = ListsItself("g", [ValueError("x")])
    assert not formattable(caused)
    assert not formattable(EndlessGroup("g", [ValueError("x")]))


def nested_raise() -> None:
    def inner() -> None:
        raise ValueError("deep")

    inner()


def test_the_fallback_keeps_every_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(error: BaseException) -> list[str]:
        raise KeyboardInterrupt

    monkeypatch.setattr("trioworker._core.policy.traceback.format_exception", broken)
    try:
        nested_raise()
    except ValueError as exc:
        error = exc
    frames = traceback.format_tb(error.__traceback__)
    assert len(frames) == 3
    assert describe_traceback(error) == (
        "Traceback (most recent call last):\n" + "".join(frames) + "ValueError: deep\n"
    )
