"""Public names for objects that live in private modules."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping


def public_names(module: str, namespace: Mapping[str, object], names: Iterable[str]) -> None:
    """Make every class and function `names` lists report `module` as its own, so
    tracebacks and reprs show the public name (trioworker.DoNotRetry, not the private
    module that defines it), as trio's own public names do."""
    for name in names:
        obj = namespace[name]
        if inspect.isclass(obj) or inspect.isfunction(obj):
            obj.__module__ = module
