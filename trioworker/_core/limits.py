"""Limits beyond one Running item per scope (docs/design/limits.md): the value a limit
is, and the checks on a limit before anything is written. Pure functions."""

from __future__ import annotations

import datetime as dt
import re

import attrs

from trioworker._core.errors import InvalidLimit
from trioworker._core.validation import MAX_NAME_LENGTH

#: Largest running limit, and largest number of starts in one rate window (the schema's
#: CHECKs: work_limits_running_sane, work_limits_rate_sane).
MAX_LIMIT = 10_000
#: Rate periods by the names `parse_rate` takes, in seconds.
PERIODS = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0,
           "h": 3600.0, "hour": 3600.0, "d": 86400.0, "day": 86400.0}  # fmt: skip
#: Longest rate period (the schema allows one day).
MAX_PERIOD = 86400.0

_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d*)\s*([a-z]+)\s*")


@attrs.frozen
class Rate:
    """At most `count` starts in any window of `per` seconds."""

    count: int
    per: float

    def __str__(self) -> str:
        for name in ("s", "min", "h", "day"):
            if self.per == PERIODS[name]:
                return f"{self.count}/{name}"
        return f"{self.count}/{self.per:g}s"


@attrs.frozen
class Limit:
    """A limit as the database holds it, with what it holds now.

    Exactly one of `kind` and `scope` is set, or neither: the default running limit of
    every scope with no running limit of its own (1 when there is no default)."""

    kind: str | None
    scope: str | None
    #: At most this many Running at once (None: no running limit of its own).
    running: int | None
    #: At most this many starts per window (None: no rate limit).
    rate: Rate | None
    updated_at: dt.datetime
    #: Running items it covers now (for the default: scopes at the default limit).
    in_use: int = 0
    #: Starts in the current rate window (0 without a rate).
    started_in_window: int = 0
    #: Due Queued items of its kind or scope held back while it is full.
    waiting: int = 0

    @property
    def target(self) -> str:
        """What it limits, as the CLI names it: `--kind K`, `--scope S` or `default`."""
        if self.kind is not None:
            return f"kind {self.kind}"
        if self.scope is not None:
            return f"scope {self.scope}"
        return "default (every scope without its own)"


def parse_rate(text: str) -> Rate:
    """`10/s`, `600/min`, `5/2s`, `100/h`, `1000/day` as a Rate; else InvalidLimit."""
    match = _RATE.fullmatch(text.lower()) if isinstance(text, str) else None
    if match is None or match[3] not in PERIODS:
        raise InvalidLimit(
            f"rate {text!r}: give starts per period, such as 10/s, 600/min, 100/h or 5/2s"
        )
    count, multiple = int(match[1]), int(match[2] or 1)
    per = multiple * PERIODS[match[3]]
    if count == 0:
        raise InvalidLimit(
            f"rate {text!r}: at least one start per period (--clear removes a limit)"
        )
    if count > MAX_LIMIT:
        raise InvalidLimit(f"rate {text!r}: at most {MAX_LIMIT} starts per period")
    if not 0 < per <= MAX_PERIOD:
        raise InvalidLimit(f"rate {text!r}: the period is more than 0 and at most one day")
    return Rate(count, per)


@attrs.frozen
class LimitChange:
    """A checked change to one limit, as the store writes it (work_set_limit_v1): a
    `running` or `rate` of None keeps what is set."""

    kind: str | None
    scope: str | None
    running: int | None
    rate: Rate | None


@attrs.frozen
class Declared:
    """What writing a kind's declared limit found (`declare_limit`)."""

    #: The limit as its handler declares it (a running limit or rate of None: none).
    declared: LimitChange
    #: The kind's limit in the database before, as (running, rate); None: it had none.
    before: tuple[int | None, Rate | None] | None
    #: Whether it was written (False: the database held exactly this one).
    written: bool


def describe_limit(running: int | None, rate: Rate | None) -> str:
    """A limit in words, as logs and messages give it: "running 2, rate 10/s"."""
    parts = ([] if running is None else [f"running {running}"]) + (
        [] if rate is None else [f"rate {rate}"]
    )
    return ", ".join(parts) or "none"


def limit_target(kind: object, scope: object) -> tuple[str | None, str | None]:
    """What a limit is for: a kind, a scope, or neither (the default); else InvalidLimit."""
    if kind is not None and scope is not None:
        raise InvalidLimit("a limit is for a kind or a scope (or neither: the default), not both")
    for what, name in (("kind", kind), ("scope", scope)):
        if name is not None and not (
            isinstance(name, str)
            and name.strip()
            and len(name) <= MAX_NAME_LENGTH
            and "\x00" not in name
        ):
            raise InvalidLimit(
                f"{what} must be a non-blank string of at most {MAX_NAME_LENGTH} characters"
            )
    return kind, scope  # type: ignore[return-value]  # checked above


def validate_limit(kind: object, scope: object, running: object, rate: object) -> LimitChange:
    """A limit to set, as the store writes it; else InvalidLimit. `running` is a whole
    number 1..MAX_LIMIT (None: keep it), `rate` a Rate or its text (None: keep it);
    kind and scope are not both given. Zero is refused: `clear_limit` removes one."""
    kind, scope = limit_target(kind, scope)
    if running is not None:
        if isinstance(running, bool) or not isinstance(running, int):
            raise InvalidLimit(f"running limit must be a whole number, not {running!r}")
        if not 1 <= running <= MAX_LIMIT:
            raise InvalidLimit(
                f"running limit {running}: give 1..{MAX_LIMIT} (--clear removes a limit)"
            )
    if isinstance(rate, str):
        rate = parse_rate(rate)
    if rate is not None and not isinstance(rate, Rate):
        raise InvalidLimit(f"rate must be a Rate or text such as 10/s, not {rate!r}")
    if isinstance(rate, Rate) and not (1 <= rate.count <= MAX_LIMIT and 0 < rate.per <= MAX_PERIOD):
        raise InvalidLimit(f"rate {rate}: 1..{MAX_LIMIT} starts per at most one day")
    if kind is None and scope is None and isinstance(rate, Rate):
        raise InvalidLimit("the default is a running limit only: give a rate a --kind or --scope")
    if running is None and rate is None:
        raise InvalidLimit("give a running limit, a rate, or both")
    return LimitChange(kind, scope, running, rate)
