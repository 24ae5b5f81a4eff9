"""`AsyncClient`: the queue for asyncio programs, on psycopg's asyncio API.

The source of `Client` too: scripts/generate-sync-client writes sync_client.py from
this module (clients.py says how, and holds what the two share). Change this one and
run the script; tests/unit/test_sync_client.py fails while the two differ.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Collection, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import psycopg
import psycopg_pool

from trioworker._core.model import (
    AttemptRecord,
    CancelOutcome,
    Enqueued,
    ItemState,
    NewItem,
    Pause,
    ScheduleState,
)
from trioworker._postgres import drive, failures, operations, result_wait
from trioworker._postgres.clients import (
    CONFLICT_RETRIES,
    ALock,
    ClientSettings,
    asleep,
    sync_docstring,
)
from trioworker._postgres.connection import ISOLATION_SET, ISOLATION_SHOW
from trioworker._postgres.dsn import redact_dsn
from trioworker._store.reads import ItemDetails, QueueCounts, QueueStatus

T = TypeVar("T")


@sync_docstring(
    """The queue for synchronous code (Django, Flask, scripts), on psycopg's sync API.

    `Client(dsn)` (default: `$TRIOWORKER_DSN`, else libpq's `PG*` variables) opens a
    small pool of its own when a call first needs it; `pool=` uses the application's
    psycopg_pool.ConnectionPool instead. Each call takes `conn=`, a psycopg connection
    of the application's, to run in its transaction. Close it (or use `with`) when
    done. Safe to share between threads.

    `known_kinds` refuses other kinds, as `PostgresStore`'s does; `max_connections`
    bounds its own pool, `timeout` how long a call waits for one of its connections;
    `schema` names the queue's schema (default `$TRIOWORKER_SCHEMA`, else the
    connection's search_path finds it, as before).
    """
)
class AsyncClient:
    """The queue for asyncio code (FastAPI, Starlette, aiohttp), on psycopg's asyncio API.

    `AsyncClient(dsn)` opens a small pool of its own, on the running event loop, when a
    call first needs it; `pool=` uses the application's
    psycopg_pool.AsyncConnectionPool instead. Each call takes `conn=`, a psycopg
    AsyncConnection of the application's, to run in its transaction. Close it with
    `await client.close()` (or use `async with`). Use it on one event loop.

    `known_kinds` refuses other kinds, as `PostgresStore`'s does; `max_connections`
    bounds its own pool, `timeout` how long a call waits for one of its connections;
    `schema` names the queue's schema (default `$TRIOWORKER_SCHEMA`, else the
    connection's search_path finds it, as before).
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: psycopg_pool.AsyncConnectionPool[Any] | None = None,
        known_kinds: Collection[str] | None = None,
        max_connections: int = 4,
        timeout: float = 10.0,
        application_name: str = "trioworker-client",
        schema: str | None = None,
    ) -> None:  # pragma: no mutate block
        self._settings = ClientSettings(dsn, max_connections, timeout, application_name, schema)
        #: The kinds enqueue accepts (None: any), as `PostgresStore.known_kinds`.
        self.known_kinds = frozenset(known_kinds) if known_kinds is not None else None
        self._pool = pool
        self._own_pool: psycopg_pool.AsyncConnectionPool[Any] | None = None
        self._lock = ALock()

    async def _connections(
        self,
    ) -> psycopg_pool.AsyncConnectionPool[Any]:  # pragma: no mutate block
        if self._pool is not None:
            return self._pool
        async with self._lock:
            if self._own_pool is None:
                settings = self._settings
                pool = psycopg_pool.AsyncConnectionPool(
                    settings.dsn,
                    kwargs=settings.kwargs,
                    min_size=1,
                    max_size=settings.max_connections,
                    timeout=settings.timeout,
                    name="trioworker-client",
                    configure=_configure_async,
                    open=False,
                )
                await pool.open()
                self._own_pool = pool
            return self._own_pool

    async def _run(
        self, op: operations.Operation[T], conn: psycopg.AsyncConnection[Any] | None
    ) -> T:  # pragma: no mutate block
        try:
            if conn is not None:
                return await drive.run_async(conn, op, self._settings.queries)
            pool = await self._connections()
            for retry in range(CONFLICT_RETRIES + 1):
                try:
                    async with pool.connection() as pooled:
                        return await drive.run_async(pooled, op, self._settings.queries)
                except failures.CONFLICTS:
                    if retry == CONFLICT_RETRIES:
                        raise
                    await asleep(0.01 * (retry + 1))
            raise AssertionError("unreachable")  # pragma: no cover
        except psycopg.Error as exc:
            raise self._settings.error(op.name, exc, in_callers=conn is not None) from exc
        except UnicodeEncodeError as exc:
            raise failures.not_unicode(op.name, exc) from None

    async def close(self) -> None:  # pragma: no mutate block
        """Close the client's own pool (the application's, if given, is left open)."""
        async with self._lock:
            pool = self._own_pool
            self._own_pool = None
            if pool is not None:
                await pool.close()

    async def __aenter__(self) -> Self:  # pragma: no mutate block
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:  # pragma: no mutate block
        await self.close()

    def __repr__(self) -> str:  # pragma: no mutate block
        return f"{type(self).__name__}({redact_dsn(self._settings.dsn)!r})"

    # -- the operations (each one of operations.py) ---------------------------------------

    async def enqueue(
        self,
        kind: str,
        *,
        scope: str | None = None,
        payload: Any = None,
        dedup_key: str | None = None,
        run_after: dt.datetime | dt.timedelta | None = None,
        priority: int = 0,
        trace_context: Mapping[str, str] | None = None,
        after: Sequence[int] | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> Enqueued:  # pragma: no mutate block
        """Queue an item, as `PostgresStore.enqueue` does; with `conn`, in its
        transaction (the item exists only if that transaction commits)."""
        known = self.known_kinds
        return await self._run(
            operations.enqueue(
                kind, scope=scope, payload=payload, dedup_key=dedup_key, run_after=run_after,
                priority=priority, trace_context=trace_context, known_kinds=known, after=after,
            ),
            conn,
        )  # fmt: skip

    async def enqueue_many(
        self, items: Sequence[NewItem], *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> list[Enqueued]:  # pragma: no mutate block
        """Queue many items in one statement, all or none (`PostgresStore.enqueue_many`)."""
        known = self.known_kinds
        return await self._run(operations.enqueue_many(items, known_kinds=known), conn)

    async def cancel(
        self, id: int, *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> CancelOutcome:  # pragma: no mutate block
        """Cancel a Queued item now, or ask a Running one to stop at its next heartbeat."""
        return await self._run(operations.cancel(id), conn)

    async def retry(
        self, ids: Sequence[int], *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> list[int]:  # pragma: no mutate block
        """Failed or Cancelled items back to Queued, history kept; the ids retried."""
        return await self._run(operations.retry(ids), conn)

    async def failed_items(
        self,
        *,
        kind: str | None = None,
        since: dt.datetime | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> list[int]:  # pragma: no mutate block
        return await self._run(operations.failed_items(kind=kind, since=since), conn)

    async def pause(
        self,
        *,
        kind: str | None = None,
        scope: str | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> bool:  # pragma: no mutate block
        """Pause a kind or a scope; False: it was paused already."""
        return await self._run(operations.pause(kind=kind, scope=scope), conn)

    async def resume(
        self,
        *,
        kind: str | None = None,
        scope: str | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> bool:  # pragma: no mutate block
        """Lift a pause; False: it was not paused."""
        return await self._run(operations.resume(kind=kind, scope=scope), conn)

    async def pauses(
        self, *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> list[Pause]:  # pragma: no mutate block
        return await self._run(operations.pauses(), conn)

    async def get_item(
        self, id: int, *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> ItemState | None:  # pragma: no mutate block
        return await self._run(operations.get_item(id), conn)

    async def attempts(
        self, id: int, *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> list[AttemptRecord]:  # pragma: no mutate block
        return await self._run(operations.attempts(id), conn)

    async def show(
        self, id: int, *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> ItemDetails | None:  # pragma: no mutate block
        """Item `id` and how its attempts ended; None: no such item."""
        return await self._run(operations.show(id), conn)

    async def queue_counts(
        self, *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> QueueCounts:  # pragma: no mutate block
        return await self._run(operations.queue_counts(), conn)

    async def status(
        self, *, failures: int = 10, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> QueueStatus:  # pragma: no mutate block
        """What `python -m trioworker status` shows."""
        return await self._run(operations.status(failures=failures), conn)

    async def schedules(
        self, *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> list[ScheduleState]:  # pragma: no mutate block
        return await self._run(operations.schedules(), conn)

    @sync_docstring(
        """Wait until item `id` has ended, at most `timeout` seconds (TimeoutError;
        None: no bound); its result if it Succeeded (None if its handler returned
        none). ItemNotSucceeded (naming its status and error) if it ended Failed or
        Cancelled; UnknownItem if there is no such item. A notification ends the wait
        as the result is stored; polling, every half second at most, is the fallback."""
    )
    async def result(
        self,
        id: int,
        *,
        timeout: float | None = None,  # noqa: ASYNC109  issue 34 names it, as Client does
    ) -> Any:  # pragma: no mutate block
        """As `Client.result`, on asyncio: wait until item `id` has ended; its result,
        or ItemNotSucceeded, UnknownItem, TimeoutError after `timeout` seconds."""
        op = operations.result_state(id)
        listen = None
        if self._pool is None:
            settings = self._settings
            listen = functools.partial(
                psycopg.AsyncConnection.connect, settings.dsn, **settings.kwargs
            )
        return await result_wait.wait_async(lambda: self._run(op, None), id, timeout, listen)


async def _configure_async(conn: psycopg.AsyncConnection[Any]) -> None:  # pragma: no mutate block
    # as the Trio store's connections (connection.py): READ COMMITTED, set for the
    # session only when the server's default is another (no session state otherwise)
    cur = await conn.execute(ISOLATION_SHOW)
    row = await cur.fetchone()
    if row is not None and row[0] != "read committed":
        await conn.execute(ISOLATION_SET)
