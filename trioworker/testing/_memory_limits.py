"""The limits of the in-memory store (docs/design/limits.md), as PostgreSQL holds them:
a running limit per kind, per scope and a default for scopes; a rate per kind or
scope, counted as the starts in the last period."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

import attrs

from trioworker._core.limits import Limit, LimitChange, Rate

#: ("kind", name), ("scope", name) or ("default", "").
Key = tuple[str, str]
DEFAULT: Key = ("default", "")


@attrs.define
class _Held:
    running: int | None
    rate: Rate | None
    updated_at: dt.datetime
    #: Start times within the rate's reach, newest last (at most rate.count kept).
    starts: list[dt.datetime] = attrs.Factory(list)


def key_of(kind: str | None, scope: str | None) -> Key:
    if kind is not None:
        return ("kind", kind)
    return DEFAULT if scope is None else ("scope", scope)


class MemoryLimits:
    """Every limit, and the starts each rate has counted."""

    def __init__(self) -> None:
        self._held: dict[Key, _Held] = {}

    def set(self, change: LimitChange, now: dt.datetime) -> Limit:
        key = key_of(change.kind, change.scope)
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = _Held(change.running, change.rate, now)
        else:
            held.running = change.running if change.running is not None else held.running
            held.rate = change.rate if change.rate is not None else held.rate
            held.updated_at = now
        if held.rate is not None:
            del held.starts[: max(0, len(held.starts) - held.rate.count)]
        return self._limit(key, held)

    def held(self, kind: str | None, scope: str | None) -> tuple[int | None, Rate | None] | None:
        """The running limit and rate of a kind, a scope or the default (None: none)."""
        held = self._held.get(key_of(kind, scope))
        return None if held is None else (held.running, held.rate)

    def clear(self, kind: str | None, scope: str | None) -> bool:
        return self._held.pop(key_of(kind, scope), None) is not None

    def scope_limit(self, scope: str) -> int:
        for key in (("scope", scope), DEFAULT):
            held = self._held.get(key)
            if held is not None and held.running is not None:
                return held.running
        return 1

    def kind_limit(self, kind: str) -> int | None:
        held = self._held.get(("kind", kind))
        return None if held is None else held.running

    def rate_open(self, key: Key, now: dt.datetime) -> bool:
        """Whether a rate (if any) allows one more start now."""
        held = self._held.get(key)
        if held is None or held.rate is None:
            return True
        return self._in_window(held, now) < held.rate.count

    def reopens(self, key: Key, now: dt.datetime) -> dt.datetime | None:
        """When a closed rate window has a start again (None: not closed)."""
        held = self._held.get(key)
        if held is None or held.rate is None or self.rate_open(key, now):
            return None
        return held.starts[-held.rate.count] + dt.timedelta(seconds=held.rate.per)

    def started(self, kind: str, scope: str | None, now: dt.datetime) -> None:
        """Count a start against the kind's and the scope's rates."""
        for key in (("kind", kind), ("scope", scope or "")):
            held = self._held.get(key) if key[1] or key[0] == "kind" else None
            if held is not None and held.rate is not None:
                held.starts.append(now)
                del held.starts[: max(0, len(held.starts) - held.rate.count)]

    def rated(self) -> Iterable[Key]:
        return [key for key, held in self._held.items() if held.rate is not None]

    def all(self) -> list[tuple[Key, Limit]]:
        order = sorted(self._held, key=lambda k: (k[0] != "kind", k[0] != "scope", k[1]))
        return [(key, self._limit(key, self._held[key])) for key in order]

    def _in_window(self, held: _Held, now: dt.datetime) -> int:
        assert held.rate is not None
        since = now - dt.timedelta(seconds=held.rate.per)
        return sum(1 for t in held.starts if t > since)

    def _limit(self, key: Key, held: _Held) -> Limit:
        return Limit(
            kind=key[1] if key[0] == "kind" else None,
            scope=key[1] if key[0] == "scope" else None,
            running=held.running,
            rate=held.rate,
            updated_at=held.updated_at,
        )

    def with_usage(
        self, key: Key, limit: Limit, in_use: int, waiting: int, now: dt.datetime
    ) -> Limit:
        held = self._held[key]
        in_window = 0 if held.rate is None else self._in_window(held, now)
        full = (held.running is not None and in_use >= held.running) or (
            held.rate is not None and in_window >= held.rate.count
        )
        return attrs.evolve(
            limit,
            in_use=in_use,
            started_in_window=in_window,
            waiting=waiting if full and key != DEFAULT else 0,
        )
