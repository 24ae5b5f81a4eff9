"""What a handler raised, looked into as data.

A handler may raise anything: a group nested deeper than the recursion limit, a group
subclass whose `exceptions` lists itself or raises, an endless iterable. `leaves` walks
it with a stack of its own, each group once, and at most LIMIT exceptions in all; the
standard `split` would recurse, and so would anything built on it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import trio

#: How many exceptions `leaves` looks at, at most.
LIMIT = 100_000


def leaves(error: BaseException) -> Iterator[BaseException]:
    """`error` if it is not a group, else the exceptions its groups hold at any depth
    (each group once, at most LIMIT exceptions looked at; a group whose `exceptions`
    cannot be read holds none)."""
    stack, seen = [error], set()
    for _ in range(LIMIT):
        if not stack:
            return
        current = stack.pop()
        if not isinstance(current, BaseExceptionGroup):
            yield current
        elif id(current) not in seen:
            seen.add(id(current))
            try:
                stack.extend(itertools.islice(current.exceptions, LIMIT))
            except BaseException:  # a hostile `exceptions`: what it holds is unknown
                continue


def holds(error: BaseException | None, wanted: BaseException) -> bool:
    """Whether `error` is `wanted`, or a group holding it at any depth."""
    return error is not None and any(leaf is wanted for leaf in leaves(error))


def only_cancelled(error: BaseException | None) -> bool:
    """Whether `error` is Trio's Cancelled, or a group of nothing else: what a handler
    raises when its scope is cancelled, and no error of its own."""
    return error is not None and all(isinstance(leaf, trio.Cancelled) for leaf in leaves(error))
