"""Handlers by kind: `@registry.handler("Crawl") async def crawl(item, ctx): ...`."""

from __future__ import annotations

import datetime as dt
import inspect
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs

from trioworker._core.errors import ConfigurationError, InvalidLimit
from trioworker._core.limits import LimitChange, Rate, validate_limit
from trioworker._core.model import WorkItem
from trioworker._core.policy import RetryPolicy
from trioworker._core.schedule import Schedule

if TYPE_CHECKING:
    from trioworker._worker.context import Context

Handler: TypeAlias = Callable[[WorkItem, "Context"], Awaitable[Any]]


@attrs.frozen
class Registration:
    """One kind's handler, its retry policy, its timeout (seconds, or None) and the
    limit declared with it (`declared`: None, or its running limit and rate)."""

    kind: str
    handler: Handler
    retry: RetryPolicy
    timeout: float | None = None
    declared: LimitChange | None = None


class Registry:
    """The kinds a Worker can run, each with its handler and retry policy.

    `migrations`: a directory of the application's own yoyo migrations, applied beside
    the queue's by `python -m trioworker migrate --app MODULE:ATTR` and checked when a
    Worker starts with that app.
    """

    def __init__(
        self, *, default_retry: RetryPolicy | None = None, migrations: Path | str | None = None
    ) -> None:
        self._registrations: dict[str, Registration] = {}
        self.default_retry = default_retry or RetryPolicy()
        self.migrations = Path(migrations) if migrations is not None else None
        #: The periodic items Workers of this registry enqueue (`periodic`).
        self.schedules: list[Schedule] = []

    def handler(
        self,
        kind: str,
        *,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        limit: int | None = None,
        rate: Rate | str | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register the decorated coroutine function as the handler of `kind`.

        `retry`: how its errors are retried (default: the registry's). `timeout`:
        seconds an attempt may run; past it the handler is cancelled, and the attempt
        counts as a handler failure ("timed out after Ns"), retried by `retry`.
        `limit`, `rate`: the kind's limit, declared here (at most `limit` Running at
        once across all Workers, at most `rate` starts per period, "10/s" or a
        `Rate`). A Worker carrying this registry writes it to the database as it
        starts, replacing whatever limit the kind had there (docs/guide/limits.md).
        """
        if not isinstance(kind, str) or not kind.strip():
            raise ConfigurationError("a handler's kind must be a non-empty string")
        if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
            raise ConfigurationError(
                f"the timeout of {kind!r} must be positive seconds, not {timeout!r}"
            )
        declared = _declared_limit(kind, limit, rate)

        def register(fn: Handler) -> Handler:
            if not _is_async(fn):
                raise ConfigurationError(
                    f"the handler of {kind!r} must be an async function (async def), not"
                    f" {fn!r}: the Worker awaits it"
                )
            if kind in self._registrations:
                raise ConfigurationError(f"kind {kind!r} already has a handler")
            self._registrations[kind] = Registration(
                kind, fn, retry or self.default_retry, timeout, declared
            )
            return fn

        return register

    def periodic(
        self,
        kind: str,
        *,
        cron: str | None = None,
        every: float | None = None,
        scope: str | None = None,
        payload: Any = None,
        priority: int = 0,
        timezone: str = "UTC",
        name: str | None = None,
    ) -> Schedule:
        """Enqueue an item of `kind` at each due time: `every` N seconds, or at the times
        of the cron expression `cron` (in `timezone`). Each due time is enqueued once,
        whichever of the Workers carrying this registry gets to it (the database holds
        the schedule); after downtime, only the most recent missed time is. `name`
        tells two schedules of one kind and scope apart.

            registry.periodic("TokenCleanup", every=3600)
            registry.periodic("Crawl", cron="0 3 * * *", scope="cfg-7", timezone="Europe/Berlin")
        """
        schedule = Schedule(kind, cron, every, scope, payload, priority, timezone, name or "")
        if any(s.name == schedule.name for s in self.schedules):
            raise ConfigurationError(f"a schedule named {schedule.name!r} exists; give name=")
        self.schedules.append(schedule)
        return schedule

    def retention(self, older_than: float | dt.timedelta, *, every: float = 3600.0) -> Schedule:
        """Delete finished items older than `older_than` (seconds or a timedelta), every
        `every` seconds, as one periodic unscoped item: one Worker at a time does it,
        in short bounded batches (`python -m trioworker run --retain 7d` calls this)."""
        from trioworker._core.retention import RETENTION_KIND, prune_finished

        seconds = older_than.total_seconds() if isinstance(older_than, dt.timedelta) else older_than
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ConfigurationError(
                f"retention: older_than must be >= 0 seconds, not {older_than!r}"
            )
        self.handler(RETENTION_KIND, retry=RetryPolicy(max_attempts=3))(prune_finished)
        return self.periodic(RETENTION_KIND, every=every, payload={"older_than": seconds})

    def get(self, kind: str) -> Registration | None:
        return self._registrations.get(kind)

    @property
    def kinds(self) -> list[str]:
        return sorted(self._registrations)

    @property
    def declared_limits(self) -> list[LimitChange]:
        """The limits declared with the handlers (`handler(..., limit=, rate=)`), by kind."""
        return [
            r.declared for _, r in sorted(self._registrations.items()) if r.declared is not None
        ]

    def __contains__(self, kind: object) -> bool:
        return kind in self._registrations


def _declared_limit(kind: str, limit: int | None, rate: Rate | str | None) -> LimitChange | None:
    """The limit a handler declares (None: none), checked as the store would check it."""
    if limit is None and rate is None:
        return None
    try:
        return validate_limit(kind, None, limit, rate)
    except InvalidLimit as exc:
        raise ConfigurationError(f"the limit declared for {kind!r}: {exc}") from None


def _is_async(fn: object) -> bool:
    """Whether calling `fn` gives an awaitable: an async def function, a partial of one,
    or an object whose __call__ is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004  a callable object's own method
    )
