"""The named statements of sql/queries.sql, parsed once at import."""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString, cast

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, LiteralString]:
    """Split a queries file on `-- name:` headers; each body runs to the next one."""
    parts = _HEADER.split(text)
    queries: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        # The literal file is ours, not user input: it is safe as a query string.
        queries[name] = cast(LiteralString, body.strip().rstrip(";"))
    return queries


QUERIES = parse(resources.files("trioworker._postgres").joinpath("queries.sql").read_text())
