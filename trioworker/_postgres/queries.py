"""The named statements of queries.sql, parsed once, and qualified by the queue's schema.

Every object of the queue is named `work_...` (tables, indexes, functions), and
nothing else the statements name is: so `queries_in(schema)` writes each such name as
`schema.work_...`, quoted by psycopg.sql.Identifier, outside comments and literals
(with no schema given, the statements stay as written, resolved by the search_path).
A statement added to queries.sql is qualified like the others, with nothing to do.
The caller's own search_path is never touched (docs/design/schema.md).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from importlib import resources
from typing import LiteralString, cast

from psycopg import sql

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
# A comment, a string literal, a quoted identifier (each kept as it is), or a queue
# object's name that is not already qualified (`w.work_x` is a column of alias w).
_TOKEN = re.compile(
    r"(?P<keep>--[^\n]*|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\")|(?<![.\w])(?P<name>work_\w+)"
)


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


def qualify(statement: LiteralString, schema: str) -> LiteralString:
    """`statement` with each queue object's name qualified by `schema`."""
    prefix = sql.Identifier(schema).as_string(None) + "."
    # Our own statement with a schema name quoted by psycopg: safe as a query string
    # (mypy takes LiteralString for str, so no cast is needed here).
    return _TOKEN.sub(lambda m: m["keep"] or prefix + m["name"], statement)


def qualify_all(
    queries: Mapping[str, LiteralString], schema: str | None
) -> Mapping[str, LiteralString]:
    """`queries` qualified by `schema` (None: as they are)."""
    if schema is None:
        return queries
    return {name: qualify(statement, schema) for name, statement in queries.items()}


#: The statements as written in queries.sql (unqualified: use `queries_in`).
WRITTEN = parse(resources.files("trioworker._postgres").joinpath("queries.sql").read_text())


@functools.cache
def queries_in(schema: str | None) -> Mapping[str, LiteralString]:
    """Every statement of queries.sql, for the queue in `schema` (None: as written,
    for the search_path to resolve)."""
    return qualify_all(WRITTEN, schema)
