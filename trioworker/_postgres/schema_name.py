"""Which PostgreSQL schema holds the queue (docs/design/schema.md).

One name everywhere: `--schema` on the command line, `schema=` in Python, else
`$TRIOWORKER_SCHEMA`. Given a name, every statement names the queue's objects
qualified by it, whatever the session's search_path. Given none, they are named
unqualified, as before there was a choice: PostgreSQL finds them through the role's
search_path, which is `public` unless the role says otherwise (docs/roles.sql sets
`trioworker`). A name is a plain lower-case identifier, so it never needs quoting in a
shell, a DSN or a log line, and the per-schema NOTIFY channels
(`trioworker_settle.NAME`) stay within PostgreSQL's 63 bytes.
"""

from __future__ import annotations

import os
import re

from trioworker._core.errors import ConfigurationError

#: The environment variable the schema is read from when `--schema` is not given.
SCHEMA_ENV = "TRIOWORKER_SCHEMA"
#: 40 at most: the longest channel, "trioworker_settle." + the name, fits in 63 bytes.
MAX_SCHEMA_LENGTH = 40
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def check_schema_name(name: str) -> str:
    """`name` if it can hold the queue, else a ConfigurationError saying why not."""
    if not _NAME.fullmatch(name) or len(name) > MAX_SCHEMA_LENGTH:
        raise ConfigurationError(
            f"bad schema name {name!r}: use 1 to {MAX_SCHEMA_LENGTH} lower-case letters,"
            " digits and underscores, not starting with a digit"
        )
    if name.startswith("pg_"):
        raise ConfigurationError(f"bad schema name {name!r}: PostgreSQL reserves pg_ names")
    return name


def resolve_schema(explicit: str | None = None) -> str | None:
    """The queue's schema: `explicit`, else $TRIOWORKER_SCHEMA, else None (the objects
    are found through the search_path: public, unless the role's says otherwise)."""
    if explicit is None:
        explicit = os.environ.get(SCHEMA_ENV) or None
    return None if explicit is None else check_schema_name(explicit)
