"""Where trioworker finds its database when a program does not say: the environment
variables, and the functions that read them as the command line does.

`Client()`, `AsyncClient()`, `open_store()` and every command read them themselves, so
an application rarely needs this module: it is for a program that opens a connection
of its own to the queue's database (`psycopg.connect(resolve_dsn())`), or hands the
settings on to another process (`DSN_ENV` in its environment).

- `resolve_dsn()`: the DSN given, else `$TRIOWORKER_DSN` (`DSN_ENV`), else "" (libpq
  then reads `PGHOST`, `PGUSER`, ...).
- `resolve_schema()`: the schema given, else `$TRIOWORKER_SCHEMA` (`SCHEMA_ENV`), else
  None (the role's search_path finds the queue).
"""

from __future__ import annotations

from trioworker._core.public import public_names as _public_names
from trioworker._core.settings import DSN_ENV
from trioworker._postgres.dsn import resolve_dsn
from trioworker._postgres.schema_name import SCHEMA_ENV, resolve_schema

__all__ = ["DSN_ENV", "SCHEMA_ENV", "resolve_dsn", "resolve_schema"]

_public_names(__name__, globals(), __all__)
