"""What to write after an attempt, and when to retry: pure functions over frozen values.

The executor records why it cancelled a handler before cancelling it; `decide` then
picks the one write that follows from that reason alone. A self-stopped or lost
attempt gets `Action.NOTHING` whatever its handler did afterwards, so it can never
reach the fail path; once the self-stop deadline has passed, the executor gives
`SELF_STOP` as the reason, whatever was recorded before.
"""

from __future__ import annotations

import enum
import itertools
import random
import traceback
from collections.abc import Callable, Iterable, Sequence

import attrs

from trioworker._core.errors import Lost
from trioworker._core.retry import backoff_delay
from trioworker._core.text import ascii_only, storable


class CancelReason(enum.Enum):
    SELF_STOP = "self_stop"  # its deadline passed: no heartbeat succeeded for half a lease
    LOST = "lost"  # a heartbeat found the attempt no longer owns the item
    CANCEL_REQUESTED = "cancel_requested"  # someone asked for the item to stop
    SHUTDOWN = "shutdown"  # the Worker is stopping and the grace period ran out
    TIMEOUT = "timeout"  # the kind's timeout ran out (the executor makes it an error)


class Action(enum.Enum):
    NOTHING = "nothing"
    COMPLETE = "complete"
    RETRY = "retry"
    FAIL = "fail"
    CANCEL = "cancel"
    RELEASE = "release"


class AttemptOutcome(enum.Enum):
    """How an attempt ended, one closed set for its log lines, metrics and trace: the
    write it made (an `Action`'s value), or why it made none."""

    COMPLETE = "complete"
    RETRY = "retry"
    FAIL = "fail"
    CANCEL = "cancel"
    RELEASE = "release"
    SUCCEEDED_IN_TRANSACTION = "succeeded_in_transaction"  # in its own transaction, then
    # finished once the handler had returned (its scope held until then)
    SELF_STOPPED = "self_stopped"  # no heartbeat succeeded for half a lease
    LOST = "lost"  # another attempt owns the item now
    DATABASE_LOST = "database_lost"  # its fenced transaction lost PostgreSQL: a stall
    FENCED_OUT = "fenced_out"  # its write found the item no longer its own
    WRITE_FAILED = "write_failed"  # its write could not be made before the self-stop
    ABANDONED = "abandoned"  # the Worker stopped at once, mid-attempt

    @classmethod
    def of(cls, action: Action) -> AttemptOutcome:
        """The outcome of making `action`'s write."""
        return cls(action.value)


class DoNotRetry(Exception):
    """Raise from a handler to fail the item now, without further attempts."""


ExceptionTypes = tuple[type[BaseException], ...]


def _exception_types(given: type[BaseException] | Iterable[type[BaseException]]) -> ExceptionTypes:
    """One exception class, or several, as a tuple; anything else is refused."""
    types = (given,) if isinstance(given, type) else tuple(given)
    for each in types:
        if not (isinstance(each, type) and issubclass(each, BaseException)):
            raise TypeError(f"{each!r} is not an exception class")
    return types


def _exception_types_or_none(
    given: type[BaseException] | Iterable[type[BaseException]] | None,
) -> ExceptionTypes | None:
    return None if given is None else _exception_types(given)


@attrs.frozen
class RetryPolicy:
    """Per-kind retry policy for handler errors (self-stops and stalls are not errors).

    `retry_on`: retry only errors of these classes (None: any error; Celery's
    `autoretry_for`, procrastinate's `retry_exceptions`). `never_retry`: never retry
    errors of these classes, even when `retry_on` names a base class of theirs (Celery's
    `dont_autoretry_for`). An error not retried fails its item at once, the reason saying
    which rule stopped it. An exception group is retried only if every exception in it
    would be."""

    max_attempts: int = attrs.field(default=5, validator=attrs.validators.ge(1))
    initial_delay: float = attrs.field(default=2.0, validator=attrs.validators.ge(0))
    max_delay: float = attrs.field(default=300.0, validator=attrs.validators.ge(0))
    jitter: float = attrs.field(
        default=0.2, validator=[attrs.validators.ge(0), attrs.validators.le(1)]
    )
    retry_on: ExceptionTypes | None = attrs.field(
        default=None, converter=_exception_types_or_none, kw_only=True
    )
    never_retry: ExceptionTypes = attrs.field(default=(), converter=_exception_types, kw_only=True)

    def refusal(self, error: BaseException) -> str | None:
        """Why `error` is not retried under `retry_on` and `never_retry` (None: it may be,
        attempts allowing), naming the error's class and the rule. Never raises."""
        leaves = exceptions_in(error)
        grouped = not (len(leaves) == 1 and leaves[0] is error)
        for leaf in leaves:
            match = _first_match(leaf, self.never_retry)
            if match is not None:
                return _reason(error, leaf, grouped, f"matches never_retry ({match.__name__})")
        if self.retry_on is None:
            return None
        for leaf in leaves:
            if _first_match(leaf, self.retry_on) is None:
                named = ", ".join(each.__name__ for each in self.retry_on)
                return _reason(error, leaf, grouped, f"is not in retry_on ({named})")
        return None


def exceptions_in(error: BaseException, limit: int = 1000) -> list[BaseException]:
    """The exceptions `error` stands for: itself, or each member of a group, groups in
    groups walked (at most `limit` steps; a group that cannot be walked so, or that
    holds nothing, stands for itself)."""
    found: list[BaseException] = []
    stack = [error]
    try:
        for _ in range(limit):
            current = stack.pop()
            if isinstance(current, BaseExceptionGroup):
                stack.extend(reversed(list(itertools.islice(current.exceptions, limit))))
            else:
                found.append(current)
            if not stack:
                return found or [error]
    except BaseException:  # part of what the handler raised
        pass
    return [error]


def _first_match(error: BaseException, types: ExceptionTypes) -> type[BaseException] | None:
    try:
        for each in types:
            if isinstance(error, each):
                return each
    except BaseException:  # a hostile __class__: it matches nothing
        pass
    return None


def _reason(error: BaseException, leaf: BaseException, grouped: bool, rule: str) -> str:
    """`not retried: ValueError is not in retry_on (OSError)`; of a group, `not retried:
    ExceptionGroup holds ValueError, which is not in retry_on (OSError)`."""
    subject = _type_name(leaf)
    if grouped:
        subject = f"{_type_name(error)} holds {subject}, which"
    return storable(f"not retried: {subject} {rule}", ERROR_LIMIT)


@attrs.frozen
class Outcome:
    """How the handler ended, when nothing cancelled it."""

    error: BaseException | None = None  # None: it returned
    #: The error is the Worker's lost database link, raised by the attempt's fenced
    #: transaction (`ctx.transaction()`): not the handler's failure.
    database_lost: bool = False


#: A traceback kept with an item is cut to its last this many characters.
TRACEBACK_LIMIT = 16 * 1024
#: An error text kept with an item is cut to this many characters.
ERROR_LIMIT = 4096
#: A reduced error text, for a write the database refused with the full one.
REDUCED_ERROR_LIMIT = 500
#: The error text of a write refused even in its reduced form.
UNSTORABLE_ERROR = "(the error text could not be stored)"


@attrs.frozen
class Decision:
    """The one write that follows an attempt (`decide`)."""

    action: Action
    delay: float = 0.0  # RETRY: seconds until due again
    reason: str | None = None  # FAIL: the stated reason
    error: str | None = None  # RETRY, FAIL: the error text
    traceback: str | None = None  # RETRY, FAIL: the handler's traceback, its tail


#: The two decisions without details, made once (a Decision is frozen): most attempts
#: end in one of them.
DECIDED_COMPLETE = Decision(Action.COMPLETE)
DECIDED_NOTHING = Decision(Action.NOTHING)


def describe_error(error: BaseException) -> str:
    """`Type: message`, or the type alone when the message is empty; storable as text
    (`storable`) and at most ERROR_LIMIT characters. Never raises, whatever the
    exception's class, `__str__` or the string it returns do: what a handler raised is
    data (this is sync code, so nothing it catches can be Trio's cancellation)."""
    name = _type_name(error)
    try:
        text = str.__str__(str(error))  # a str subclass's own methods are not called
    except BaseException as exc:  # part of what the handler raised
        text = f"<str() of the error raised {_type_name(exc)}>"
    return storable(f"{name}: {text}" if text else name, ERROR_LIMIT)


def _type_name(error: BaseException) -> str:
    """The name of `error`'s class, or a stand-in if its metaclass will not say."""
    try:
        return str.__str__(type(error).__name__)
    except BaseException:  # a hostile metaclass
        return "<an exception class without a name>"


#: How many exceptions (groups' members, causes and contexts, each time it is met) a
#: traceback may hold for the standard formatting to be asked to format it.
FORMATTABLE_LIMIT = 10_000


def formattable(error: BaseException, limit: int = FORMATTABLE_LIMIT) -> bool:
    """Whether the standard `traceback` formatting can be trusted with `error`: it
    walks every member of every group as often as it is listed (a group subclass whose
    `exceptions` lists itself would never end, nor a member listed twice at each of
    thirty levels), so this walks the same way, counting, and gives up at `limit` or
    at anything that raises when read."""
    stack: list[BaseException] = [error]
    seen_in_chains: set[int] = set()
    for _ in range(limit):
        if not stack:
            return True
        current = stack.pop()
        try:
            links = [current.__cause__, current.__context__]
            members = current.exceptions if isinstance(current, BaseExceptionGroup) else ()
            stack.extend(itertools.islice(members, limit))
        except BaseException:  # part of what the handler raised
            return False
        for link in links:
            if link is not None and id(link) not in seen_in_chains:
                seen_in_chains.add(id(link))
                stack.append(link)
    return False


def describe_traceback(error: BaseException, limit: int = TRACEBACK_LIMIT) -> str:
    """The formatted traceback of `error`, storable as text and cut to its last `limit`
    characters (the end is where it failed), with a first line saying how much was
    cut. Never raises: when the standard formatting cannot be trusted with it
    (`formattable`) or raises anyway (an exception whose `__notes__` raises
    KeyboardInterrupt, say), the frames alone and `describe_error`."""
    try:
        text = "".join(traceback.format_exception(error)) if formattable(error) else None
    except BaseException:  # part of what the handler raised
        text = None
    if text is None:
        try:
            frames = "".join(traceback.format_tb(error.__traceback__))
        except BaseException:  # a traceback object is the runtime's
            frames = ""
        text = f"Traceback (most recent call last):\n{frames}{describe_error(error)}\n"
    text = storable(text)
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    return f"... ({cut} characters cut)\n" + text[cut:]


def reduced(decision: Decision) -> Decision | None:
    """The smaller form of a write the database refused: the error text cut short and
    ASCII only, without the traceback; then a fixed text. None: nothing left to cut."""
    if decision.error is None or decision.error == UNSTORABLE_ERROR:
        return None
    if decision.traceback is not None or len(decision.error) > REDUCED_ERROR_LIMIT:
        short = storable(ascii_only(decision.error), REDUCED_ERROR_LIMIT)
        return attrs.evolve(decision, error=short, traceback=None)
    return attrs.evolve(decision, error=UNSTORABLE_ERROR)  # its traceback is None already


def undecodable_payload(reason: str) -> Decision:
    """The write for a claimed item whose stored payload Python cannot decode: it
    fails at once, without running its handler (another attempt would fare no better)."""
    return Decision(
        Action.FAIL,
        reason="payload cannot be decoded",
        error=storable(f"UndecodablePayload: the payload {reason}", ERROR_LIMIT),
    )


def undecodable_values(columns: Sequence[tuple[str, str]]) -> Decision:
    """The write for a claimed item a stored column of which Python cannot decode (a
    time past its datetime: (column, why) each): it fails at once, without running its
    handler, as for a payload, naming each."""
    return Decision(
        Action.FAIL,
        reason=f"{', '.join(column for column, _ in columns)} cannot be decoded",
        error=storable(
            "UndecodableValue: " + "; ".join(f"{column} {why}" for column, why in columns),
            ERROR_LIMIT,
        ),
    )


def decide(  # noqa: PLR0911  one return per rule reads like the rule
    reason: CancelReason | None,
    outcome: Outcome,
    *,
    failures_before: int,
    policy: RetryPolicy,
    completed: bool = False,
    rand: Callable[[], float] = random.random,
) -> Decision:
    """The single write that follows an attempt.

    `reason` is why the handler's scope was cancelled (None: it was not), and wins
    over whatever the handler did afterwards. `completed`: the handler completed its
    item in its own fenced transaction, so its success is durable and the write
    finishes it as Succeeded, whatever the handler did after that commit. Self-stopped
    and lost attempts write nothing all the same: the item belongs to lease recovery
    (which finishes a completed one as Succeeded). `failures_before` counts the item's
    handler errors before this attempt.
    """
    if reason is CancelReason.SELF_STOP or reason is CancelReason.LOST:
        return DECIDED_NOTHING
    if completed:  # Succeeded already with the handler's writes: give its scope back
        return DECIDED_COMPLETE
    if isinstance(outcome.error, Lost):  # a fenced transaction found the item gone
        return DECIDED_NOTHING
    if reason is CancelReason.CANCEL_REQUESTED:
        return Decision(Action.CANCEL)
    if reason is CancelReason.SHUTDOWN:
        return Decision(Action.RELEASE)
    if outcome.database_lost:  # a stall: lease recovery requeues it and counts one
        return DECIDED_NOTHING
    if outcome.error is None:
        return DECIDED_COMPLETE
    error = describe_error(outcome.error)
    trace = describe_traceback(outcome.error)
    failures = failures_before + 1
    if isinstance(outcome.error, DoNotRetry):
        return Decision(
            Action.FAIL, reason="handler said not to retry", error=error, traceback=trace
        )
    refused = policy.refusal(outcome.error)
    if refused is not None:
        return Decision(Action.FAIL, reason=refused, error=error, traceback=trace)
    if failures >= policy.max_attempts:
        gave_up = f"failed {failures} of {policy.max_attempts} attempts"
        return Decision(Action.FAIL, reason=gave_up, error=error, traceback=trace)
    delay = backoff_delay(
        failures,
        initial=policy.initial_delay,
        maximum=policy.max_delay,
        jitter=policy.jitter,
        rand=rand,
    )
    return Decision(Action.RETRY, delay=delay, error=error, traceback=trace)
