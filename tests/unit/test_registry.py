"""Handlers by kind, each with its retry policy."""

from __future__ import annotations

import pytest

from trioworker import Registry
from trioworker._policy import RetryPolicy


async def handler(item: object, ctx: object) -> None: ...


def test_a_kind_gets_its_own_retry_policy_else_the_registrys_default() -> None:
    """A handler's own policy wins; otherwise the registry's default, which is
    RetryPolicy() unless the registry was given one."""
    patient = RetryPolicy(max_attempts=9)
    registry = Registry()
    registry.handler("Crawl")(handler)
    registry.handler("Purge", retry=patient)(handler)
    crawl, purge = registry.get("Crawl"), registry.get("Purge")
    assert crawl is not None and purge is not None
    assert (crawl.kind, crawl.handler, crawl.retry) == ("Crawl", handler, RetryPolicy())
    assert (purge.kind, purge.retry) == ("Purge", patient)
    strict = Registry(default_retry=RetryPolicy(max_attempts=1))
    strict.handler("Crawl")(handler)
    assert strict.get("Crawl").retry == RetryPolicy(max_attempts=1)  # type: ignore[union-attr]
    assert strict.get("Nope") is None and "Nope" not in strict


@pytest.mark.parametrize("kind", ["", "  ", None, 3])
def test_a_kind_must_be_a_non_empty_string(kind: object) -> None:
    """A blank or non-string kind is refused when registering."""
    with pytest.raises(ValueError, match=r"^a handler's kind must be a non-empty string$"):
        Registry().handler(kind)  # type: ignore[arg-type]


def test_a_handler_that_is_not_async_is_refused_at_registration() -> None:
    """A plain `def` (or a lambda) is refused when registered, naming the kind, rather
    than failing every attempt later; async functions, partials of them and objects
    with an async __call__ are taken."""
    import functools

    registry = Registry()

    def sync(item: object, ctx: object) -> int:
        return 1

    with pytest.raises(TypeError, match="the handler of 'Sync' must be an async function"):
        registry.handler("Sync")(sync)  # type: ignore[arg-type]
    assert "Sync" not in registry

    async def takes_extra(item: object, ctx: object, extra: int) -> None: ...

    class Callable:
        async def __call__(self, item: object, ctx: object) -> None: ...

    registry.handler("Partial")(functools.partial(takes_extra, extra=1))  # type: ignore[arg-type]
    registry.handler("Object")(Callable())  # type: ignore[arg-type]
    assert registry.kinds == ["Object", "Partial"]
