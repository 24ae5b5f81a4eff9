"""Text that came from handlers and callers, made safe to store. Pure functions."""

from __future__ import annotations


def storable(text: str, limit: int | None = None) -> str:
    """`text` as PostgreSQL's text type takes it, nothing lost: a lone surrogate (from
    `os.fsdecode` of a name that is not UTF-8, say) becomes its `\\udcXX` escape and a
    NUL becomes `\\x00`. With `limit`, cut to that many characters, marked with "...".
    """
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    text = text.replace("\x00", "\\x00")
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 3, 0)] + "..."
    return text


def ascii_only(text: str) -> str:
    """`text` in ASCII, every other character as its backslash escape (`\\xe9`)."""
    return text.encode("ascii", "backslashreplace").decode("ascii")
