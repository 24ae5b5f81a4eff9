"""Handlers by kind: `@registry.handler("Crawl") async def crawl(item, ctx): ...`."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs

from ._model import WorkItem
from ._policy import RetryPolicy

if TYPE_CHECKING:
    from ._context import Context

Handler: TypeAlias = Callable[[WorkItem, "Context"], Awaitable[Any]]


@attrs.frozen
class Registration:
    kind: str
    handler: Handler
    retry: RetryPolicy


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

    def handler(
        self, kind: str, *, retry: RetryPolicy | None = None
    ) -> Callable[[Handler], Handler]:
        """Register the decorated coroutine function as the handler of `kind`."""
        if not isinstance(kind, str) or not kind.strip():
            raise ValueError("a handler's kind must be a non-empty string")

        def register(fn: Handler) -> Handler:
            if not _is_async(fn):
                raise TypeError(
                    f"the handler of {kind!r} must be an async function (async def), not"
                    f" {fn!r}: the Worker awaits it"
                )
            if kind in self._registrations:
                raise ValueError(f"kind {kind!r} already has a handler")
            self._registrations[kind] = Registration(kind, fn, retry or self.default_retry)
            return fn

        return register

    def get(self, kind: str) -> Registration | None:
        return self._registrations.get(kind)

    @property
    def kinds(self) -> list[str]:
        return sorted(self._registrations)

    def __contains__(self, kind: object) -> bool:
        return kind in self._registrations


def _is_async(fn: object) -> bool:
    """Whether calling `fn` gives an awaitable: an async def function, a partial of one,
    or an object whose __call__ is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004  a callable object's own method
    )
