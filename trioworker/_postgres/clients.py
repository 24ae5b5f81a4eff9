"""What `Client` and `AsyncClient` share: the queue for programs that are not Trio.

Web applications and scripts produce the work: asyncio ones (FastAPI, Starlette,
aiohttp) and synchronous ones (Django, Flask, scripts). These clients run the same
operations as the Trio store (operations.py: the same checks, statements and reading
of rows), on psycopg's own sync and asyncio APIs, and raise the same errors.

Every call takes `conn=`: the application's own psycopg connection, so the call runs
in the application's transaction, at its isolation level, and what it writes exists
only if that transaction commits (Django: `django.db.connection.connection` inside
`transaction.atomic()`). Without `conn=` a call runs on the client's own pooled
connections (autocommit, READ COMMITTED, each statement committed on its own, as the
Trio store's calls are), or on the application's pool given as `pool=`; a deadlock or
serialization failure there is run again. In the caller's transaction it is the
caller's to retry, as any statement of theirs would be: the error says so.

`AsyncClient` (async_client.py) is written by hand; `Client` (sync_client.py) is
written from it by scripts/generate-sync-client, which turns each `async def` into a
`def`, drops each `await` and renames the names of its NAMES table. What cannot be
written that way is here: the pairs of names that differ (`ALock` and `Lock`, `asleep`
and `sleep`), and `sync_docstring`, the sync client's own text where its docstring
says something else (docs/design/clients.md, "One source for both clients").
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg

from trioworker._core.errors import SchemaNotReady, StoreError
from trioworker._postgres import failures
from trioworker._postgres.connection import connect_kwargs
from trioworker._postgres.dsn import resolve_dsn
from trioworker._postgres.queries import queries_in
from trioworker._postgres.schema_name import resolve_schema

T = TypeVar("T")

#: A call on the client's own connections that meets a deadlock or a serialization
#: failure runs again, up to this many times.
CONFLICT_RETRIES = 5

#: The pairs: async_client.py names the first, sync_client.py the second.
ALock = asyncio.Lock
Lock = threading.Lock
asleep = asyncio.sleep
sleep = time.sleep


def sync_docstring(doc: str) -> Callable[[T], T]:
    """The docstring of the sync client's counterpart of what this decorates (the
    generator writes `doc` in its place); at run time it changes nothing."""

    def unchanged(decorated: T) -> T:
        return decorated

    return unchanged


class ClientSettings:
    """What both clients are given."""

    def __init__(
        self,
        dsn: str | None,
        max_connections: int,
        timeout: float,
        application_name: str,
        schema: str | None,
    ) -> None:  # pragma: no mutate block
        self.dsn = resolve_dsn(dsn)
        #: The queue's schema (None: $TRIOWORKER_SCHEMA, else the search_path's), and
        #: every statement qualified by it: the caller's search_path is never changed.
        self.schema = resolve_schema(schema)
        self.queries = queries_in(self.schema)
        self.max_connections = max_connections
        self.timeout = timeout
        self.kwargs = {**connect_kwargs(self.dsn, application_name), "autocommit": True}

    def error(
        self, name: str, exc: psycopg.Error, *, in_callers: bool
    ) -> StoreError | SchemaNotReady:  # pragma: no mutate block
        """`exc` translated; a conflict in the caller's transaction says whose it is."""
        translated = failures.translate(name, exc, self.dsn, self.schema)
        if in_callers and isinstance(exc, failures.CONFLICTS):
            return StoreError(f"{translated} (in the caller's transaction: retry it)")
        return translated
