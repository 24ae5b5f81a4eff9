"""JSON that other programs stored: decoded, measured and shown without a stored value
ever raising where the Worker or a reader did not expect it. Pure functions.

PostgreSQL's jsonb holds what Python's `json` cannot always read back: nesting deeper
than the interpreter's recursion limit, integers longer than its 4,300 digits. The
table bounds nesting (`MAX_DEPTH`, the same bound every enqueue path checks); the rest
is caught here, once, for the claim, `show`, `status` and the dashboard alike.
"""

from __future__ import annotations

import json
import reprlib
from typing import Any

import attrs

#: The deepest nesting a payload may have: a value inside MAX_DEPTH - 1 containers, or
#: MAX_DEPTH empty ones. The table holds the same bound (migrations: its CHECK reads
#: `NOT jsonb_path_exists(payload, 'strict $.**{64}')`: no value at level 64).
MAX_DEPTH = 64

#: Stored text shown in place of a value that cannot be decoded is cut to this length.
RAW_LIMIT = 2000


class Undecodable(ValueError):
    """Stored JSON that Python's `json` cannot read back (too deep, a too long number)."""


@attrs.frozen
class UndecodableValue:
    """What stands for a stored value that could not be decoded: why, and the start of
    its text. A claimed item whose payload is one of these is failed, never run."""

    reason: str
    text: str  # the stored text, cut to RAW_LIMIT characters


def loads(text: str | bytes) -> Any:
    """`json.loads`, raising Undecodable (with the reason) for what it cannot read."""
    try:
        return json.loads(text)
    except RecursionError:
        raise Undecodable("nested too deeply for Python to decode") from None
    except ValueError as exc:  # json.JSONDecodeError, and int's digit limit
        raise Undecodable(f"cannot be decoded: {exc}") from None


def loads_or_mark(text: str | bytes | None) -> Any:
    """The decoded value, or an UndecodableValue in its place (None stays None)."""
    if text is None:
        return None
    try:
        return loads(text)
    except Undecodable as exc:
        raw = text.decode(errors="replace") if isinstance(text, bytes) else text
        return UndecodableValue(str(exc), raw[:RAW_LIMIT])


def depth(value: Any) -> int:
    """How deeply `value` nests: 1 for a scalar or an empty container, one more for
    each level of containers around a value. Iterative, so any depth can be measured."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        current, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(current, dict):
            stack.extend((v, level + 1) for v in current.values())
        elif isinstance(current, list | tuple):
            stack.extend((v, level + 1) for v in current)
    return deepest


def pretty(value: Any) -> str:
    """`value` as indented JSON for a reader; an UndecodableValue as its reason and raw
    text. Never raises on anything `loads_or_mark` returns."""
    if isinstance(value, UndecodableValue):
        return f"(cannot be shown as JSON: {value.reason})\n{value.text}"
    try:
        return json.dumps(value, indent=2, ensure_ascii=False)
    except (RecursionError, ValueError, TypeError) as exc:
        short = reprlib.Repr()  # keyword arguments only from Python 3.12
        short.maxlevel, short.maxstring, short.maxother = 8, RAW_LIMIT, RAW_LIMIT
        shown = short.repr(value)[:RAW_LIMIT]
        return f"(cannot be shown as JSON: {type(exc).__name__})\n{shown}"
