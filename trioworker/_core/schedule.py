"""Periodic items: schedules, and when each fires. Pure functions over frozen values.

A schedule fires at its due times: every N seconds from its first due time, or at the
times of a cron expression (in its timezone; parsed by cronsim). The database holds
each schedule's next due time; a Worker that finds it past locks the row, enqueues one
item for the most recent due time (so a long downtime makes one catch-up item, not a
burst) and moves the next due time past now.
"""

from __future__ import annotations

import datetime as dt
import math
import zoneinfo
from typing import Any

import attrs
from cronsim import CronSim, CronSimError

from trioworker._core.errors import ConfigurationError, InvalidWorkItem
from trioworker._core.validation import EnqueueRequest, validate_enqueue

_SECOND = dt.timedelta(seconds=1)


@attrs.frozen
class Schedule:
    """One periodic item: `Registry.periodic(kind, cron=... | every=..., ...)`."""

    kind: str
    cron: str | None = None
    every: float | None = None  # seconds
    scope: str | None = None
    payload: Any = None
    priority: int = 0
    timezone: str = "UTC"
    #: Unique across the database; defaults to the kind (and the scope, if any).
    name: str = ""

    def __attrs_post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ConfigurationError(f"schedule {self.kind!r}: give cron= or every=, not both")
        if self.every is not None and not (math.isfinite(self.every) and self.every > 0):
            raise ConfigurationError(f"schedule {self.kind!r}: every= must be positive seconds")
        try:
            zoneinfo.ZoneInfo(self.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ConfigurationError(
                f"schedule {self.kind!r}: no timezone {self.timezone!r}"
            ) from None
        if self.cron is not None:
            try:
                CronSim(self.cron, dt.datetime.now(dt.UTC))  # pragma: no mutate  (any start)
            except CronSimError as exc:
                raise ConfigurationError(
                    f"schedule {self.kind!r}: bad cron {self.cron!r}: {exc}"
                ) from None
        if not self.name:
            name = self.kind if self.scope is None else f"{self.kind}@{self.scope}"
            object.__setattr__(self, "name", name)
        # Its items are checked as they will be enqueued, so a bad scope, payload,
        # priority or name fails at registration, not at every firing.
        now = dt.datetime.now(dt.UTC)  # pragma: no mutate  (any time does)
        try:
            schedule_request(self, now, now)  # pragma: no mutate  (any due time does)
        except InvalidWorkItem as exc:
            raise ConfigurationError(f"schedule {self.name!r}: {exc}") from None

    @property
    def spec(self) -> str:
        """When it fires, as text: the database compares it to see a schedule change."""
        if self.every is not None:
            return f"every {self.every:g}s"
        return f"cron {self.cron} {self.timezone}"


def schedule_dedup_key(schedule: Schedule) -> str:
    """The dedup key of a schedule's items: while one is still Queued (its kind paused,
    or no Worker free), a later due time adds none, so a backlog never piles up."""
    return f"trioworker.schedule:{schedule.name}"


def schedule_request(schedule: Schedule, due: dt.datetime, now: dt.datetime) -> EnqueueRequest:
    """The item a schedule enqueues for its due time `due`: due then, under its dedup key."""
    return validate_enqueue(
        schedule.kind,
        schedule.scope,
        schedule.payload,
        schedule_dedup_key(schedule),
        due,
        priority=schedule.priority,
        now=now,
    )


def first_due(schedule: Schedule, now: dt.datetime) -> dt.datetime:
    """A new schedule's first due time: now for `every`, the next cron time for cron."""
    if schedule.every is not None:
        return now
    return _next_cron(schedule, now)


def plan(
    schedule: Schedule, next_due: dt.datetime, now: dt.datetime
) -> tuple[dt.datetime | None, dt.datetime]:
    """(the due time to enqueue now, or None; the next due time after that).

    The due time is the most recent one not after `now` and not before `next_due`:
    missed ones before it are skipped. The next due time is always after `now`.
    """
    if next_due > now:
        return None, next_due
    if schedule.every is not None:
        period = dt.timedelta(seconds=schedule.every)
        missed = (now - next_due) // period
        due = next_due + missed * period
        return due, due + period
    latest = _previous_cron(schedule, now)
    due = latest if latest is not None and latest >= next_due else next_due  # pragma: no mutate
    return due, _next_cron(schedule, now)


def _zone(schedule: Schedule) -> zoneinfo.ZoneInfo:
    return zoneinfo.ZoneInfo(schedule.timezone)


def _next_cron(schedule: Schedule, after: dt.datetime) -> dt.datetime:
    assert schedule.cron is not None
    local = after.astimezone(_zone(schedule))
    return next(CronSim(schedule.cron, local)).astimezone(dt.UTC)


def _previous_cron(schedule: Schedule, now: dt.datetime) -> dt.datetime | None:
    """The latest cron time not after `now` (cronsim's reverse excludes its start)."""
    assert schedule.cron is not None
    local = (now + _SECOND).astimezone(_zone(schedule))
    for when in CronSim(schedule.cron, local, reverse=True):
        if when <= now:
            return when.astimezone(dt.UTC)
    return None  # pragma: no cover - a cron expression always has an earlier time
