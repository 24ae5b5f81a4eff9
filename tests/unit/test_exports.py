"""The public surface: `trioworker.__all__` and `trioworker.testing.__all__`."""

from __future__ import annotations

import inspect

import pytest

import trioworker
import trioworker.testing

PUBLIC = [(trioworker, name) for name in trioworker.__all__] + [
    (trioworker.testing, name) for name in trioworker.testing.__all__
]


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
