"""The public surface: `trioworker.__all__` and `trioworker.testing.__all__`."""

from __future__ import annotations

import inspect

import pytest

import trioworker
import trioworker.config
import trioworker.dashboard
import trioworker.otel
import trioworker.testing

PUBLIC_MODULES = [
    trioworker,
    trioworker.testing,
    trioworker.otel,
    trioworker.dashboard,
    trioworker.config,
]
PUBLIC = [(module, name) for module in PUBLIC_MODULES for name in module.__all__]


@pytest.mark.parametrize(("module", "name"), PUBLIC, ids=[n for _, n in PUBLIC])
def test_every_public_name_exists_and_says_what_it_is(module: object, name: str) -> None:
    """Each exported name exists and has a docstring of its own (a constant is
    documented where it is defined, by its `#:` comment, so it is exempt)."""
    value = getattr(module, name)
    if isinstance(value, str | int | float):
        return
    doc = inspect.getdoc(value)
    assert doc and doc.strip(), f"{name} has no docstring"


def test_all_is_complete() -> None:
    """Every public class or function of the package is in `__all__` (ruff keeps it
    sorted)."""
    exported = {
        n for n, v in vars(trioworker).items()
        if not n.startswith("_") and (inspect.isclass(v) or inspect.isfunction(v))
    }  # fmt: skip
    assert exported <= set(trioworker.__all__)


@pytest.mark.parametrize(("module", "name"), PUBLIC, ids=[n for _, n in PUBLIC])
def test_every_public_name_reports_the_public_module_it_is_imported_from(
    module: object, name: str
) -> None:
    """As trio's own public names do: tracebacks and reprs show `trioworker.DoNotRetry`,
    never the private module that defines it."""
    value = getattr(module, name)
    if not (inspect.isclass(value) or inspect.isfunction(value)):
        return  # a constant: no module of its own
    assert value.__module__ == module.__name__  # type: ignore[attr-defined]


def test_a_handlers_error_and_its_traceback_name_the_public_classes() -> None:
    assert repr(trioworker.DoNotRetry("x")) == "DoNotRetry('x')"
    assert trioworker.DoNotRetry.__module__ == "trioworker"
    assert f"{trioworker.HandlerTimeout.__module__}.HandlerTimeout" == "trioworker.HandlerTimeout"


def test_a_handlers_store_is_the_public_handler_store() -> None:
    """`ctx.store` is typed as `trioworker.HandlerStore`, a public name of its own (not
    `trioworker.Client`, the synchronous client), and the Trio stores a program opens
    implement it, so one helper typed with it takes any of them."""
    assert vars(trioworker.Context)["store"].fget.__annotations__["return"] == "HandlerStore"
    offered = {n for n in vars(trioworker.HandlerStore) if not n.startswith("_")}
    assert {"enqueue", "cancel", "show", "transaction", "result"} <= offered
    for store in (trioworker.PostgresStore, trioworker.testing.MemoryStore):
        assert offered <= set(dir(store)), store


def test_where_the_dsn_and_the_schema_come_from_is_in_trioworker_config() -> None:
    """The environment variables of the DSN and the schema, and the functions that read
    them as the commands do, are plumbing: `trioworker.config` has them, the top level
    (what applications call) does not."""
    assert (trioworker.config.DSN_ENV, trioworker.config.SCHEMA_ENV) == (
        "TRIOWORKER_DSN",
        "TRIOWORKER_SCHEMA",
    )
    for name in trioworker.config.__all__:
        assert name not in trioworker.__all__
        assert not hasattr(trioworker, name), name
