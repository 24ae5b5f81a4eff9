"""The plumbing of the PostgreSQL store: the pool, each call's time bound, the
translation of driver errors, the caller's transactions and LISTEN. The operations
(operations.py, worker_operations.py, sent by drive.py for store.py) say what to run;
this says how it is run: on psycopg's async connections waited on by Trio
(trio_connection.py), from a small Trio pool (pool.py).

Every call is one statement (or one short transaction) on a pooled autocommit
connection, bounded by `call_timeout`. Driver errors become trioworker errors here and
nowhere else.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from typing import Any, LiteralString, TypeVar

import psycopg
import psycopg.errors
import trio
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row

from trioworker._core.errors import SchemaNotReady, StoreError, StoreTimeout
from trioworker._core.retry import Backoff
from trioworker._postgres import failures
from trioworker._postgres.dsn import redact, redact_dsn
from trioworker._postgres.pool import Background, Pool
from trioworker._postgres.queries import queries_in
from trioworker._postgres.schema_name import resolve_schema
from trioworker._postgres.sessions import LINK, Bounds, set_local, set_session
from trioworker._postgres.trio_connection import TrioConnection
from trioworker._store.api import NotifyCallback

log = logging.getLogger("trioworker.store")

T = TypeVar("T")
Op = Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]

#: The channel the listener's probe goes on (connection.py `_notifications_arrive`),
#: the same for every schema: any probe that arrives proves the link.
PROBE_CHANNEL = "trioworker_probe"
_CONFLICT_RETRIES = 5
#: How long the listener waits for its probe notification (milliseconds on a working
#: link; a loaded server that takes longer only costs polling instead of waking).
_PROBE_WAIT = 3.0
#: A transaction's BEGIN tries this many pooled connections before it gives up.
_BEGIN_TRIES = 3
#: How long closing the store waits for its background work (a cancel sent to the
#: server, a ROLLBACK) before cancelling it.
_CLOSE_GRACE = 1.0

# Connection settings that keep a dead link from holding a call forever; a DSN that
# sets any of them wins. (The server's side of the same, which ends what a vanished
# client left open, is each transaction's own: sessions.py.)
_LINK_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}


class Connections:
    """A pool of connections to one database, and the way every call goes through it.

    Nothing relies on session state, so the pool may sit behind PgBouncer in
    transaction pooling mode: no prepared statements (PgBouncer 1.18 cannot keep them),
    the queue's settings on its functions (`SET jit = off`, the generic plans) or per
    transaction (`BEGIN ISOLATION LEVEL READ COMMITTED`). LISTEN alone needs a session
    of its own: `listen_dsn` names a direct one (default: `dsn`).
    """

    def __init__(
        self,
        dsn: str,
        *,
        max_connections: int,
        call_timeout: float,
        application_name: str,
        schema: str | None = None,
        listen_dsn: str | None = None,
    ) -> None:  # pragma: no mutate block
        self.dsn = dsn
        self.listen_dsn = listen_dsn or dsn
        self.call_timeout = call_timeout
        #: The queue's schema, and every statement qualified by it (queries.py): the
        #: connections' own search_path is left as it is, for the caller's SQL.
        self.schema = resolve_schema(schema)
        self.queries = queries_in(self.schema)
        self._connect_kwargs = connect_kwargs(dsn, application_name)
        self._listen_kwargs = connect_kwargs(self.listen_dsn, application_name)
        #: What must not hold the caller: cancels of abandoned statements, ROLLBACKs,
        #: new connections.
        self._background = Background()
        self._pool = Pool(
            self._connect,
            min_size=1,
            max_size=max_connections,
            # Give up a reconnect series after a few seconds; the next call starts a
            # new one at once, rather than waiting out a long backoff after an outage.
            reconnect_timeout=5.0,
            name="trioworker",
            configure=_configure,
            background=self._background,
        )
        #: Each transaction's BEGIN with its bounds, rendered once: by (bounds, server
        #: version).
        self._begins: dict[tuple[Bounds, int], bytes] = {}
        #: Calls that ran out of time, and the queue's own writes run again after a
        #: deadlock or serialization failure.
        self.timeouts = 0
        self.conflict_retries = 0

    async def _connect(
        self, dsn: str | None = None, kwargs: dict[str, Any] | None = None
    ) -> TrioConnection[Any]:  # pragma: no mutate block
        """A new autocommit connection (to `dsn`, default the pool's), whose abandoned
        statements are cancelled in the store's background."""
        conn = await TrioConnection.connect(
            dsn or self.dsn, **(kwargs or self._connect_kwargs), autocommit=True
        )
        conn.on_abandon = self._background.start
        return conn

    async def open(self) -> None:  # pragma: no mutate block
        """Open the pool (its first connection is made in the background); any Trio
        task of this run may then use it."""
        self._pool.open()

    async def close(self) -> None:  # pragma: no mutate block
        await self._pool.close()
        await self._background.aclose(min(_CLOSE_GRACE, self.call_timeout))

    async def call(
        self,
        name: str,
        op: Op[T],
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> T:  # pragma: no mutate block
        """Run `op` on a pooled connection (or `conn`), bounded by `call_timeout`.

        On a pooled connection every call is its own transaction, so one that meets a
        deadlock or a serialization failure is run again (and counted): the queue's
        own writes never hand those to the Worker as errors.
        """
        limit = self.call_timeout
        with trio.move_on_after(limit):
            for retry in range(_CONFLICT_RETRIES + 1):
                try:
                    if conn is not None:
                        return await _discarding_on_failure(conn, op)
                    return await self._with_pooled_connection(op)
                except failures.CONFLICTS as exc:
                    if conn is not None or retry == _CONFLICT_RETRIES:
                        raise self.translate(name, exc) from None
                    self.conflict_retries += 1
                    log.warning("%s met %s; running it again", name, type(exc).__name__)
                    await trio.sleep(0.01 * (retry + 1))
                except psycopg.Error as exc:
                    raise self.translate(name, exc) from None
                except UnicodeEncodeError as exc:  # psycopg's own, for a lone surrogate
                    raise failures.not_unicode(name, exc) from None
        self.timeouts += 1
        raise StoreTimeout(f"{name}: no answer from PostgreSQL within {limit:g}s")

    async def _with_pooled_connection(self, op: Op[T]) -> T:  # pragma: no mutate block
        conn = await self._pool.getconn()
        try:
            return await _discarding_on_failure(conn, op)
        finally:
            self._pool.putconn(conn)

    def _begin_statement(
        self, bounds: Bounds, conn: TrioConnection[Any]
    ) -> bytes:  # pragma: no mutate block
        """A transaction's BEGIN with `bounds`, for `conn`'s server: rendered once."""
        key = (bounds, conn.info.server_version)
        begin = self._begins.get(key)
        if begin is None:
            begin = self._begins[key] = _begin(*key).as_bytes(conn)
        return begin

    def translate(self, name: str, exc: psycopg.Error) -> StoreError | SchemaNotReady:
        return failures.translate(name, exc, self.dsn, self.schema)

    async def rows(
        self, name: str, query: LiteralString, params: dict[str, Any]
    ) -> list[dict[str, Any]]:  # pragma: no mutate block
        """Run one named statement on a pooled connection; its rows, as dicts (the
        listener's probe: the store's own calls are operations, `PostgresStore._run`)."""

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(query, params)
                return await cur.fetchall() if cur.description else []

        return await self.call(name, op)

    @asynccontextmanager
    async def transaction(
        self,
        *,
        refuse_commit: Callable[[], BaseException | None] | None = None,
        bounds: Bounds = LINK,
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:  # pragma: no mutate block
        """A transaction on a pooled connection: committed when the block exits cleanly,
        rolled back (in the background) if it raises.

        `refuse_commit` is asked as the very last thing before the COMMIT is sent, with
        no checkpoint in between: an exception it returns makes it a ROLLBACK instead,
        and is raised from the block's exit. `bounds`: how long the server keeps the
        transaction once its client is silent (sessions.py), set with its BEGIN.
        """

        async def begin() -> TrioConnection[Any]:
            # A pooled connection whose backend was terminated fails at once; nothing
            # was done on it yet, so the transaction begins again on a fresh one.
            for fresh in range(_BEGIN_TRIES, 0, -1):
                conn = await self._pool.getconn()
                try:
                    await conn.execute(self._begin_statement(bounds, conn))
                except BaseException as exc:
                    await conn.close()
                    self._pool.putconn(conn)
                    if fresh > 1 and isinstance(exc, psycopg.OperationalError):
                        continue
                    raise
                return conn
            raise AssertionError("unreachable")  # pragma: no cover

        async def finish(
            conn: TrioConnection[Any],
            statement: LiteralString,
            refuse: Callable[[], BaseException | None] | None = None,
        ) -> BaseException | None:
            refused = None
            try:
                refused = None if refuse is None else refuse()
                await conn.execute(statement if refused is None else "ROLLBACK")
            finally:
                if conn.pgconn.transaction_status != TransactionStatus.IDLE:
                    await conn.close()
                self._pool.putconn(conn)
            return refused

        async def roll_back(conn: TrioConnection[Any]) -> None:
            with trio.move_on_after(self.call_timeout):
                await _quietly(finish(conn, "ROLLBACK"))

        with trio.fail_after(self.call_timeout):
            try:
                conn = await begin()
            except psycopg.Error as exc:
                raise self.translate("transaction", exc) from None
        ended = False
        try:
            yield conn
            ended = True  # COMMIT returns the connection to the pool, whatever happens
            refused = await self.call(
                "commit", lambda _: finish(conn, "COMMIT", refuse_commit), conn=conn
            )
            if refused is not None:
                raise refused
        finally:
            if not ended:
                # In the background: a handler being cancelled (a self-stop, say) must not
                # wait on a dead link for its ROLLBACK, which would outlast its stop grace.
                # The connection goes back to the pool (or is discarded) once it is done.
                # One closed already (its statement was abandoned) is discarded at once.
                if conn.closed:
                    self._pool.putconn(conn)
                else:
                    self._background.start(lambda: roll_back(conn), "roll back")

    async def listen(
        self,
        on_notify: NotifyCallback,
        *,
        on_settle: NotifyCallback | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
        check_every: float = 30.0,
    ) -> None:  # pragma: no mutate block
        """Call `on_notify` for each NOTIFY about new work, until cancelled, and
        `on_settle` for each scope left to be settled.

        Runs on a connection of its own (to `listen_dsn`), checks the link when quiet
        for `check_every` seconds, and reconnects with backoff. After a reconnect it
        calls both with None, since notifications sent meanwhile were missed.

        Each new connection first proves that a notification reaches it: one sent on
        a pooled connection must arrive within a few seconds. Through a transaction
        pooler (PgBouncer) it never does; then the listener warns once and stops, and
        the Worker polls.
        """
        backoff = Backoff(initial=0.5, maximum=15.0)
        started = False
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                with trio.fail_after(self.call_timeout):
                    conn = await self._connect(self.listen_dsn, self._listen_kwargs)
                    channels = await self._listen(conn, settle=on_settle is not None)
                reconnected = started
                if not started:  # the Worker is ready once LISTEN is in place
                    started = True
                    task_status.started()
                if await self._notifications_arrive(conn, channels, on_notify, on_settle):
                    # A session of its own (a notification reached it): bounded for
                    # the server as a transaction is, for as long as it listens.
                    with trio.fail_after(self.call_timeout):
                        await conn.execute(set_session(LINK, conn.info.server_version))
                else:
                    log.warning(
                        "notifications do not reach the listener's connection (%s is"
                        " behind a transaction pooler?): polling alone from now on; give"
                        " a direct DSN for LISTEN (--listen-dsn) to be woken at once",
                        redact_dsn(self.listen_dsn),
                    )
                    await conn.close()
                    await trio.sleep_forever()
                backoff.reset()
                if reconnected:
                    log.info("listening for new work again")
                    on_notify(None)
                    if on_settle is not None:
                        on_settle(None)
                while True:
                    await _relay(conn, channels, on_notify, on_settle, check_every)
                    with trio.fail_after(self.call_timeout):
                        await conn.execute("SELECT 1")
            except (psycopg.Error, StoreError, trio.TooSlowError, OSError) as exc:
                delay = backoff.next()
                log.warning(
                    "notification listener lost PostgreSQL (%s); polling continues,"
                    " reconnecting in %.1fs",
                    redact(f"{type(exc).__name__}: {exc}", self.listen_dsn),
                    delay,
                )
                await trio.sleep(delay)
            finally:
                if conn is not None:
                    await conn.close()  # never waits

    async def _listen(
        self, conn: psycopg.AsyncConnection[Any], *, settle: bool
    ) -> tuple[str, str]:  # pragma: no mutate block
        """LISTEN on the schema's channels (for new work; and for scopes to settle);
        their names, (new work, settle)."""
        cur = await conn.execute(self.queries["channels"])
        row = await cur.fetchone()
        assert row is not None
        notify, settle_channel = str(row[0]), str(row[1])
        listen = sql.SQL(self.queries["listen"])
        for channel in (notify, settle_channel) if settle else (notify,):
            await conn.execute(listen.format(channel=sql.Identifier(channel)))
        return notify, settle_channel

    async def _notifications_arrive(
        self,
        conn: psycopg.AsyncConnection[Any],
        channels: tuple[str, str],
        on_notify: NotifyCallback,
        on_settle: NotifyCallback | None,
    ) -> bool:  # pragma: no mutate block
        """Whether a NOTIFY sent on a pooled connection reaches the LISTENing `conn`."""
        await conn.execute(self.queries["listen_probe"])
        await self.rows("notify_probe", self.queries["notify_probe"], {})
        arrived = False
        wait = min(self.call_timeout, _PROBE_WAIT)
        with trio.move_on_after(wait + 1.0):
            arrived = await _probe_arrives(conn, channels, on_notify, on_settle, wait)
        if arrived:
            await conn.execute(self.queries["unlisten_probe"])
        return arrived

    def __repr__(self) -> str:
        return f"Connections({redact_dsn(self.dsn)!r})"


async def _probe_arrives(
    conn: psycopg.AsyncConnection[Any],
    channels: tuple[str, str],
    on_notify: NotifyCallback,
    on_settle: NotifyCallback | None,
    seconds: float,
) -> bool:  # pragma: no mutate block
    # Whether the probe arrives within `seconds`; notifications about work that come
    # with it are relayed as usual. notifies() reads one batch at a time and ends after
    # the whole batch (stop_after=1): a notification sent just after the probe often
    # comes in the probe's batch, and closing notifies() at the probe would lose it.
    # (Closed here, not when collected: notifies() holds the connection's lock.)
    deadline = trio.current_time() + seconds
    arrived = False
    while not arrived and (remaining := deadline - trio.current_time()) > 0:
        async with aclosing(conn.notifies(timeout=remaining, stop_after=1)) as notifies:
            async for notify in notifies:
                if notify.channel == PROBE_CHANNEL:
                    arrived = True
                else:
                    _dispatch(notify, channels, on_notify, on_settle)
    return arrived


async def _relay(
    conn: psycopg.AsyncConnection[Any],
    channels: tuple[str, str],
    on_notify: NotifyCallback,
    on_settle: NotifyCallback | None,
    quiet_period: float,
) -> None:  # pragma: no mutate block
    # Returns after `quiet_period` seconds without a notification.
    async with aclosing(conn.notifies(timeout=quiet_period)) as notifies:
        async for notify in notifies:
            _dispatch(notify, channels, on_notify, on_settle)


def _dispatch(
    notify: psycopg.Notify,
    channels: tuple[str, str],
    on_notify: NotifyCallback,
    on_settle: NotifyCallback | None,
) -> None:  # pragma: no mutate block
    """Hand a notification on the schema's channels (new work, settle) to its callback."""
    notify_channel, settle_channel = channels
    if notify.channel == notify_channel:
        on_notify(notify.payload)
    elif notify.channel == settle_channel and on_settle is not None:
        on_settle(notify.payload)


async def _discarding_on_failure(
    conn: psycopg.AsyncConnection[Any], op: Op[T]
) -> T:  # pragma: no mutate block
    # A connection that was cancelled mid-statement, whose link failed, or whose
    # server turned read-only, is closed so the pool discards it rather than handing
    # it out again. (A statement cancelled in flight has closed it already, and is
    # being cancelled on the server: TrioConnection.wait.)
    try:
        return await op(conn)
    except BaseException as exc:
        if not isinstance(exc, psycopg.Error) or isinstance(exc, failures.CUT_OFF):
            await conn.close()
        raise


async def _quietly(aw: Awaitable[object]) -> None:  # pragma: no mutate block
    try:
        await aw
    except psycopg.Error as exc:
        log.warning("rollback failed; the connection was discarded: %s", type(exc).__name__)


_BEGIN: LiteralString = "BEGIN ISOLATION LEVEL READ COMMITTED; {}"


def _begin(bounds: Bounds, server_version: int) -> sql.Composed:
    """A transaction's BEGIN and its bounds, in one simple query (one round trip)."""
    return sql.SQL(_BEGIN).format(set_local(bounds, server_version))


def connect_kwargs(dsn: str, application_name: str) -> dict[str, Any]:
    given = psycopg.conninfo.conninfo_to_dict(dsn)
    kwargs: dict[str, Any] = {k: v for k, v in _LINK_DEFAULTS.items() if k not in given}
    kwargs.setdefault("application_name", given.get("application_name", application_name))
    # No server-side prepared statements: PgBouncer in transaction pooling mode (1.18)
    # cannot keep them, and each statement here is one short function call.
    kwargs["prepare_threshold"] = None
    return kwargs


#: A pooled connection asks the server's default isolation (ISOLATION_SHOW) and sets
#: READ COMMITTED for the session (ISOLATION_SET) only when it differs (see `_configure`).
ISOLATION_SHOW: LiteralString = "SHOW default_transaction_isolation"
ISOLATION_SET: LiteralString = "SET default_transaction_isolation = 'read committed'"


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:  # pragma: no mutate block
    # The queue's functions read fresh snapshots after taking their
    # locks, which needs READ COMMITTED. Transactions ask for it in their BEGIN; a
    # single statement runs at the server's default, PostgreSQL's own READ COMMITTED
    # unless changed. Only then is it set for the session, which a transaction pooler
    # does not keep: set it on the role or database instead (docs/deploy.md).
    cur = await conn.execute(ISOLATION_SHOW)
    row = await cur.fetchone()
    if row is not None and row[0] != "read committed":
        log.warning(
            "the server's default_transaction_isolation is %r; setting READ COMMITTED"
            " for this session (through a transaction pooler, set it on the role)",
            row[0],
        )
        await conn.execute(ISOLATION_SET)
