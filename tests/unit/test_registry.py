"""Handlers by kind, each with its retry policy."""

from __future__ import annotations

import pytest

from trioworker import ConfigurationError, Registry
from trioworker._core.policy import RetryPolicy


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
    with pytest.raises(ConfigurationError, match=r"^a handler's kind must be a non-empty string$"):
        Registry().handler(kind)  # type: ignore[arg-type]


def test_a_handler_that_is_not_async_is_refused_at_registration() -> None:
    """A plain `def` (or a lambda) is refused when registered, naming the kind, rather
    than failing every attempt later; async functions, partials of them and objects
    with an async __call__ are taken."""
    import functools

    registry = Registry()

    def sync(item: object, ctx: object) -> int:
        return 1

    with pytest.raises(ConfigurationError, match="the handler of 'Sync' must be an async function"):
        registry.handler("Sync")(sync)  # type: ignore[arg-type]
    assert "Sync" not in registry

    async def takes_extra(item: object, ctx: object, extra: int) -> None: ...

    class Callable:
        async def __call__(self, item: object, ctx: object) -> None: ...

    registry.handler("Partial")(functools.partial(takes_extra, extra=1))  # type: ignore[arg-type]
    registry.handler("Object")(Callable())  # type: ignore[arg-type]
    assert registry.kinds == ["Object", "Partial"]


def test_something_not_callable_is_refused_as_a_handler() -> None:
    """Not even callable: the same ConfigurationError as a plain function."""
    with pytest.raises(ConfigurationError, match="the handler of 'Num' must be an async function"):
        Registry().handler("Num")(42)  # type: ignore[arg-type]


def test_a_registry_may_carry_the_applications_migrations() -> None:
    """`migrations=` is kept as a Path; none by default."""
    from pathlib import Path

    assert Registry(migrations="app/migrations").migrations == Path("app/migrations")
    assert Registry().migrations is None


@pytest.mark.parametrize("timeout", [0, -1.0, float("inf"), float("nan")])
def test_a_kinds_timeout_must_be_positive_finite_seconds(timeout: float) -> None:
    """A timeout that could never or would always fire is refused, naming the kind."""
    with pytest.raises(ConfigurationError) as raised:
        Registry().handler("K", timeout=timeout)
    assert str(raised.value) == f"the timeout of 'K' must be positive seconds, not {timeout!r}"


def test_a_kinds_timeout_is_kept_with_its_handler() -> None:
    """Any positive number of seconds, under a second too."""
    registry = Registry()
    registry.handler("K", timeout=0.5)(handler)
    registration = registry.get("K")
    assert registration is not None and registration.timeout == 0.5


def test_a_periodic_schedule_keeps_what_it_was_given() -> None:
    """The registry's schedule is the Schedule of its arguments (priority 0 unless
    given, the name defaulting to the kind)."""
    from trioworker._core.schedule import Schedule

    registry = Registry()
    nightly = registry.periodic("Crawl", cron="0 3 * * *", scope="7", payload={"a": 1})
    fast = registry.periodic("Crawl", every=5, name="fast", priority=9, timezone="Asia/Kolkata")
    assert nightly == Schedule("Crawl", cron="0 3 * * *", scope="7", payload={"a": 1})
    assert (nightly.name, nightly.priority) == ("Crawl@7", 0)
    assert fast == Schedule("Crawl", every=5, name="fast", priority=9, timezone="Asia/Kolkata")
    assert registry.schedules == [nightly, fast]


def test_two_schedules_may_not_share_a_name() -> None:
    """The name is unique in the database: a second one needs its own name=."""
    registry = Registry()
    registry.periodic("Crawl", every=5)
    with pytest.raises(ConfigurationError) as raised:
        registry.periodic("Crawl", every=10)
    assert str(raised.value) == "a schedule named 'Crawl' exists; give name="


def test_retention_is_a_periodic_prune_with_its_own_retry_policy() -> None:
    """retention(older_than) registers the prune handler (3 attempts) and a schedule
    every hour (or `every`), carrying the age in seconds (a timedelta is converted)."""
    import datetime as dt

    from trioworker._core.retention import RETENTION_KIND, prune_finished
    from trioworker._core.schedule import Schedule

    registry = Registry()
    schedule = registry.retention(dt.timedelta(days=7))
    assert schedule == Schedule(RETENTION_KIND, every=3600.0, payload={"older_than": 604800.0})
    registration = registry.get(RETENTION_KIND)
    assert registration is not None
    assert (registration.handler, registration.retry) == (
        prune_finished,
        RetryPolicy(max_attempts=3),
    )
    assert Registry().retention(0, every=60) == Schedule(
        RETENTION_KIND, every=60, payload={"older_than": 0}
    )
    assert Registry().retention(0.5).payload == {"older_than": 0.5}


@pytest.mark.parametrize("older_than", [-1, float("inf"), float("nan")])
def test_retention_needs_a_finite_age(older_than: float) -> None:
    """A negative or endless age is refused, saying what was given."""
    with pytest.raises(ConfigurationError) as raised:
        Registry().retention(older_than)
    assert str(raised.value) == f"retention: older_than must be >= 0 seconds, not {older_than!r}"


def test_the_error_tree_can_be_caught_by_meaning() -> None:
    """A retryable store error is never a lost attempt nor a missing schema; a missing
    schema is no bad value the caller passed (no ValueError, no ConfigurationError), so
    `except ValueError` around a call never takes an unmigrated database for bad input."""
    from trioworker import (
        DatabaseUnavailable,
        InvalidLimit,
        InvalidWorkItem,
        Lost,
        SchemaNotReady,
        StoreError,
        StoreTimeout,
        TrioWorkerError,
        UnstorableResult,
    )

    assert not issubclass(Lost, StoreError) and not issubclass(SchemaNotReady, StoreError)
    assert not issubclass(SchemaNotReady, ValueError)
    assert not issubclass(SchemaNotReady, ConfigurationError)
    for bad_value in (InvalidWorkItem, InvalidLimit, ConfigurationError, UnstorableResult):
        assert issubclass(bad_value, ValueError)
    assert issubclass(StoreTimeout, DatabaseUnavailable) and issubclass(
        DatabaseUnavailable, StoreError
    )
    for error in (Lost, SchemaNotReady, StoreError, ConfigurationError):
        assert issubclass(error, TrioWorkerError)


def test_except_trioworkererror_catches_every_error_trioworker_raises() -> None:
    """Every exception class of the public surface is a TrioWorkerError, but DoNotRetry,
    which handlers raise, not trioworker."""
    import trioworker

    errors = {
        name for name in trioworker.__all__
        if isinstance(value := getattr(trioworker, name), type)
        and issubclass(value, BaseException)
    }  # fmt: skip
    assert {"SchemaNotReady", "ConfigurationError", "DoNotRetry"} <= errors
    for name in errors - {"DoNotRetry"}:
        assert issubclass(getattr(trioworker, name), trioworker.TrioWorkerError), name
