"""The named statements of queries.sql, parsed once, and qualified by the queue's schema.

Each name of the queue's objects (tables, functions) that a statement must qualify is
written after a marker, as River writes its templates: `/* TEMPLATE: schema */work_items`.
`queries_in(schema)` replaces each marker with the schema's name and a dot, quoted by
psycopg.sql.Identifier (`"tenant_a".work_items`); with no schema given, with nothing,
so the search_path resolves the names as written. The marker is a comment, so
queries.sql stays plain SQL that psql runs as written. A statement added to queries.sql
marks its names itself: tests/unit/test_schema_name.py fails for a queue object named
without a marker, and for a marker before anything else. The caller's own search_path
is never touched (docs/design/schema.md).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from importlib import resources
from typing import LiteralString, cast

from psycopg import sql

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)

#: Written before each name a statement must qualify by the queue's schema.
SCHEMA_MARKER = "/* TEMPLATE: schema */"


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


def qualify(statement: LiteralString, schema: str | None) -> LiteralString:
    """`statement` with each schema marker replaced by `schema`'s name and a dot (None:
    by nothing, for the search_path to resolve the name)."""
    prefix = "" if schema is None else sql.Identifier(schema).as_string(None) + "."
    # Our own statement with a schema name quoted by psycopg: safe as a query string
    # (mypy takes LiteralString for str, so no cast is needed here).
    return statement.replace(SCHEMA_MARKER, prefix)


def qualify_all(
    templates: Mapping[str, LiteralString], schema: str | None
) -> Mapping[str, LiteralString]:
    """Every statement of `templates` qualified by `schema` (None: as written)."""
    return {name: qualify(statement, schema) for name, statement in templates.items()}


#: The statements of queries.sql with their schema markers: use `queries_in`.
TEMPLATES = parse(resources.files("trioworker._postgres").joinpath("queries.sql").read_text())
#: The statements as written, unqualified, for the search_path to resolve.
WRITTEN = qualify_all(TEMPLATES, None)


@functools.cache
def queries_in(schema: str | None) -> Mapping[str, LiteralString]:
    """Every statement of queries.sql, for the queue in `schema` (None: as written,
    for the search_path to resolve)."""
    return WRITTEN if schema is None else qualify_all(TEMPLATES, schema)
