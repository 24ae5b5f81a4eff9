"""The media library's database: its named statements, a connection per attempt for the
handlers (every write fenced by the attempt), and the app side on a plain connection.

Handlers find PostgreSQL as the Worker does: $TRIOWORKER_MEDIA_DSN if set, else
$TRIOWORKER_DSN, else libpq's PG* variables. Start the Worker with the DSN in the
environment (not --dsn) and both use the same one, fault proxy and all.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, LiteralString

import psycopg
import psycopg.errors
import trio
from psycopg.rows import dict_row

from .. import DatabaseUnavailable, StoreError, StoreTimeout, WorkItem, _bridge
from .._dsn import redact, resolve_dsn
from .._postgres import _connect_kwargs
from .._queries import parse

QUERIES = parse(resources.files("trioworker.media").joinpath("queries.sql").read_text())

DSN_ENV = "TRIOWORKER_MEDIA_DSN"

Statement = tuple[str, dict[str, Any]]


def media_dsn() -> str:
    """$TRIOWORKER_MEDIA_DSN, else the Worker's own ($TRIOWORKER_DSN, else PG* variables)."""
    return os.environ.get(DSN_ENV) or resolve_dsn(None)


class AttemptLost(StoreError):
    """The attempt no longer owns its work item; the transaction wrote nothing."""


class MediaDb:
    """One attempt's connection. Reads are plain; writes go through `write`, which
    commits only while the attempt still owns its item (see the `fence` statement)."""

    def __init__(self, dsn: str, item: WorkItem, timeout: float) -> None:
        self._dsn = dsn
        self._item = item
        self._timeout = timeout
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None:
            kwargs = _connect_kwargs(self._dsn, "trioworker media")
            self._conn = await _bridge.run(
                psycopg.AsyncConnection.connect(self._dsn, **kwargs, autocommit=True)
            )
        return self._conn

    async def _call(self, name: str, op: Any) -> Any:
        """Run `op(conn)` (an asyncio coroutine function) within the time bound."""
        with trio.move_on_after(self._timeout):
            try:
                conn = await self._connection()
                return await _bridge.run(op(conn))
            except psycopg.Error as exc:
                await self.close()
                message = redact(f"{name}: {type(exc).__name__}: {exc}".strip(), self._dsn)
                if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
                    raise DatabaseUnavailable(message) from None
                raise StoreError(message) from None
            except BaseException:
                await self.close()  # cancelled mid-statement: the connection is unusable
                raise
        await self.close()
        raise StoreTimeout(f"{name}: no answer from PostgreSQL within {self._timeout:g}s")

    async def rows(self, name: str, **params: Any) -> list[dict[str, Any]]:
        query = QUERIES[name]

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query, params)
                return await cur.fetchall() if cur.description else []

        result: list[dict[str, Any]] = await self._call(name, op)
        return result

    async def column(self, name: str, **params: Any) -> list[Any]:
        """The first column of every row."""
        return [next(iter(r.values())) for r in await self.rows(name, **params)]

    async def value(self, name: str, **params: Any) -> Any:
        """The first column of the first row."""
        rows = await self.rows(name, **params)
        return next(iter(rows[0].values())) if rows else None

    async def write(self, statements: Sequence[Statement]) -> None:
        """Run the named statements in one transaction, fenced by (item id, attempt).

        Raises AttemptLost, having written nothing, when another attempt owns the item.
        """
        if not statements:
            return
        fence = {"item_id": self._item.id, "attempt": self._item.attempt}
        prepared = [(QUERIES[name], params) for name, params in statements]

        async def op(conn: psycopg.AsyncConnection[Any]) -> bool:
            async with conn.transaction():
                cur = await conn.execute(QUERIES["fence"], fence)
                if await cur.fetchone() is None:
                    raise psycopg.Rollback()
                for query, params in prepared:
                    await conn.execute(query, params)
                return True
            return False  # rolled back: fenced out

        if not await self._call(statements[0][0], op):
            raise AttemptLost(
                f"item {self._item.id} attempt {self._item.attempt} no longer owns the item;"
                " nothing written"
            )

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await _bridge.run(conn.close())


@asynccontextmanager
async def connect(item: WorkItem, *, call_timeout: float = 10.0) -> AsyncIterator[MediaDb]:
    """A connection for one attempt, opened on first use and closed at the end."""
    db = MediaDb(media_dsn(), item, call_timeout)
    try:
        yield db
    finally:
        await db.close()


def query(name: str) -> LiteralString:
    """A named media statement, for the app side's plain connections."""
    return QUERIES[name]
