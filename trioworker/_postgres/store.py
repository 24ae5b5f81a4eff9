"""The store on PostgreSQL: psycopg's async API, waited on by Trio (connection.py).

Every call is one statement (or one short transaction) on a pooled autocommit
connection, bounded by `call_timeout`. Driver errors become trioworker errors here and
nowhere else.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, LiteralString, TypeVar

import psycopg
import psycopg.errors
import trio
from psycopg.rows import dict_row

from trioworker._core.errors import (
    Lost,
    SelfStopped,
)
from trioworker._core.limits import (
    Declared,
    Limit,
    LimitChange,
    Rate,
    limit_target,
    validate_limit,
)
from trioworker._core.model import (
    FINISHED,
    AttemptRecord,
    CancelOutcome,
    Enqueued,
    Fired,
    Heartbeat,
    HeldLease,
    ItemState,
    NewItem,
    Pause,
    Recovered,
    ScheduleState,
    ScopeHolder,
    Status,
    StoreStatistics,
    WorkerInfo,
    WorkItem,
)
from trioworker._core.schedule import Schedule, plan, schedule_request
from trioworker._core.validation import result_json
from trioworker._postgres import drive, operations
from trioworker._postgres import worker_operations as wops
from trioworker._postgres.as_stored import read_as_stored
from trioworker._postgres.connection import Connections
from trioworker._postgres.dsn import redact_dsn, resolve_dsn
from trioworker._postgres.sessions import LINK, set_local
from trioworker._postgres.trio_connection import require_trio
from trioworker._store.api import NotifyCallback, Transaction
from trioworker._store.reads import (
    ItemDetails,
    QueueCounts,
    QueueStatus,
    process_gone,
)
from trioworker._store.waiting import wait_result

log = logging.getLogger("trioworker.store")

T = TypeVar("T")
Op = Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]

#: The unique indexes over Running rows (migrations/0001.queue.sql): a scope's slots
#: and a limited kind's. For a scope at limit 1 (the default), the first is the founding
#: rule: at most one Running item per scope.
RUNNING_SCOPE_INDEX = "work_items_one_running_per_scope_slot"
RUNNING_KIND_INDEX = "work_items_one_running_per_kind_slot"
RUNNING_SLOT_INDEXES = frozenset({RUNNING_SCOPE_INDEX, RUNNING_KIND_INDEX})
#: work_items_take_slot's refusals of a start over a limit (SQLSTATE 23514, as a CHECK).
LIMIT_REFUSALS = frozenset({"work_items_slot_within_limit", "work_items_rate_within_limit"})
#: A claim that loses a scope race claims again at once, up to this many times: each
#: one sees the commits that beat the one before (two losses in a row were seen with
#: 2 claimers on one scope of four lines, bench contention's W=2 S=1 L=4).
_RACE_RETRIES = 3


def lost_race(exc: BaseException) -> str | None:
    """The slot index or limit refusal a claim lost a race on (it met a start its
    snapshot could not see), by its name; None for any other error."""
    name = getattr(getattr(exc, "diag", None), "constraint_name", None)
    if isinstance(exc, psycopg.errors.UniqueViolation) and name in RUNNING_SLOT_INDEXES:
        return str(name)
    if isinstance(exc, psycopg.errors.CheckViolation) and name in LIMIT_REFUSALS:
        return str(name)
    return None


class PostgresTransaction:
    """The caller's own transaction (`PostgresStore.transaction()`); pass it to
    `enqueue(tx=...)` to enqueue atomically with the caller's other writes."""

    def __init__(
        self, conns: Connections, conn: psycopg.AsyncConnection[Any]
    ) -> None:  # pragma: no mutate block
        self._conns = conns
        self._conn = conn

    async def execute(
        self, query: LiteralString, params: Sequence[Any] | dict[str, Any] | None = None
    ) -> list[tuple[Any, ...]]:  # pragma: no mutate block
        """Run one statement in this transaction; rows it returns, if any."""

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[tuple[Any, ...]]:
            cur = await conn.execute(query, params)
            return await cur.fetchall() if cur.description else []

        return await self._conns.call("transaction.execute", op, conn=self._conn)

    async def rows(
        self,
        query: LiteralString,
        params: Sequence[Any] | dict[str, Any] | None = None,
        *,
        as_stored: bool = False,
    ) -> list[dict[str, Any]]:  # pragma: no mutate block
        """Run one statement in this transaction; the rows it returns, as dicts.
        `as_stored`: a time Python cannot hold comes back as an UndecodableValue rather
        than failing the statement (the dashboard's item page; as_stored.py)."""

        async def op(conn: psycopg.AsyncConnection[Any]) -> list[dict[str, Any]]:
            async with conn.cursor(row_factory=dict_row) as cur:
                if as_stored:
                    read_as_stored(cur)
                await cur.execute(query, params)
                return await cur.fetchall() if cur.description else []

        return await self._conns.call("transaction.rows", op, conn=self._conn)


class PostgresFencedTransaction(PostgresTransaction):
    """A handler's transaction, fenced by its attempt (`Context.transaction()`).

    It began by locking the item's row and checking that this attempt (id, attempt)
    still owns it, Running; the lock holds until the commit, so nothing can take the
    item meanwhile, and the handler's writes commit only while the attempt owns it (and
    before its self-stop deadline, when the store was given one).
    """

    def __init__(
        self, conns: Connections, conn: psycopg.AsyncConnection[Any], id: int, attempt: int
    ) -> None:  # pragma: no mutate block
        super().__init__(conns, conn)
        self.item_id = id
        self.attempt = attempt
        #: Whether the commit notes the attempt's success (`complete()` was called).
        self.completes = False
        #: The result given to `complete`, as JSON text (None: none).
        self.result_json: str | None = None

    def complete(self, result: Any = None) -> None:
        """Commit the attempt's success with this transaction, so the handler's writes
        and its success commit together (exactly once for its database effects): once
        committed, no attempt runs the item again. The item stays Running, holding its
        scope's slot (and its kind's), until the Worker finishes it Succeeded after the
        handler has returned (or lease recovery does). `result` (JSON) is the item's
        result, stored in the same commit (UnstorableResult, here: it cannot be)."""
        self.result_json = result_json(result)
        self.completes = True


class PostgresStore:
    """Durable work items on PostgreSQL. Open with `open_store`."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        max_connections: int = 10,
        call_timeout: float = 10.0,
        known_kinds: Sequence[str] | None = None,
        application_name: str = "trioworker",
        schema: str | None = None,
        listen_dsn: str | None = None,
    ) -> None:  # pragma: no mutate block
        """`dsn`: None reads $TRIOWORKER_DSN, else libpq's PG* variables decide, as for
        `Client` and the commands (`trioworker.config.resolve_dsn`); `schema`: None
        reads $TRIOWORKER_SCHEMA, else the role's search_path finds the queue.
        `listen_dsn`: a direct DSN for LISTEN when `dsn` goes through a transaction
        pooler such as PgBouncer (default: `dsn`)."""
        self.dsn = resolve_dsn(dsn)
        self.call_timeout = call_timeout
        self.known_kinds = frozenset(known_kinds) if known_kinds is not None else None
        self._conns = Connections(
            self.dsn,
            max_connections=max_connections,
            call_timeout=call_timeout,
            application_name=application_name,
            schema=schema,
            listen_dsn=listen_dsn,
        )
        #: The PostgreSQL schema that holds the queue (`resolve_schema`); None: the
        #: search_path finds it.
        self.schema = self._conns.schema
        self._sql = self._conns.queries
        self._race_losses = 0
        self._dedup_hits = 0
        self._scopes_settled = 0
        self._heads_repaired = 0

    # -- enqueue ----------------------------------------------------------------

    async def open(self) -> None:  # pragma: no mutate block
        """Open the pool; any Trio task of this run may then use it."""
        await self._conns.open()

    async def close(self) -> None:  # pragma: no mutate block
        await self._conns.close()

    async def _run(
        self,
        op: operations.Operation[T],
        tx: Transaction | None = None,
        *,
        again: drive.Again | None = None,
    ) -> T:  # pragma: no mutate block
        """Run an operation (the clients', operations.py, or the Worker's,
        worker_operations.py) on a pooled connection, or in `tx`; `again`: the retry
        policy (drive.py), the claims' `_lost_race`."""
        return await self._conns.call(
            op.name,
            lambda conn: drive.run_async(conn, op, self._sql, again),
            conn=_connection_of(tx),
        )

    def _lost_race(
        self, op: operations.Operation[Any], exc: psycopg.Error, tries: int
    ) -> bool:  # pragma: no mutate block
        """A claim's retry policy: run it again at once when it lost a race (`lost_race`),
        up to `_RACE_RETRIES` times; counted and logged."""
        lost_on = lost_race(exc)
        if tries == _RACE_RETRIES or lost_on is None:
            return False
        # Lost a slot (of a scope or a kind) or a rate window to a start this claim
        # could not see; the next claim sees it, and takes the batch's other items (a
        # lost finish_and_claim rolled its completions back too: they go again with it).
        self._race_losses += 1
        log.info("%s lost a race on %s; sending it again", op.name, lost_on)
        return True

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
        tx: Transaction | None = None,
    ) -> Enqueued:  # pragma: no mutate block
        """Queue an item; with `tx`, only if the caller's transaction commits.
        `trace_context`: a propagator's carrier; None takes the current span's (if
        the otel extra is installed), {} carries none."""
        op = operations.enqueue(
            kind,
            scope=scope,
            payload=payload,
            dedup_key=dedup_key,
            run_after=run_after,
            priority=priority,
            trace_context=trace_context,
            known_kinds=self.known_kinds,
            after=after,
        )
        enqueued = await self._run(op, tx)
        self._dedup_hits += enqueued.deduplicated
        return enqueued

    async def enqueue_many(
        self, items: Sequence[NewItem], *, tx: Transaction | None = None
    ) -> list[Enqueued]:  # pragma: no mutate block
        """Queue many items in one statement (one round trip), all or none: each is
        checked first, and a bad one raises InvalidWorkItem naming its index. Results
        in order; an item whose dedup key a Queued item (or an earlier one of the
        batch) holds is merged onto it, as `enqueue` does."""
        results = await self._run(operations.enqueue_many(items, known_kinds=self.known_kinds), tx)
        self._dedup_hits += sum(r.deduplicated for r in results)
        return results

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[PostgresTransaction]:  # pragma: no mutate block
        """A transaction of the caller's own, committed when the block exits cleanly
        (rolled back if it raises)."""
        async with self._conns.transaction() as conn:
            yield PostgresTransaction(self._conns, conn)

    @asynccontextmanager
    async def fenced_transaction(
        self,
        id: int,
        attempt: int,
        *,
        until: Callable[[], float] | None = None,
        server_timeout: float | None = None,
    ) -> AsyncIterator[PostgresFencedTransaction]:  # pragma: no mutate block
        """A transaction that commits only while attempt (`id`, `attempt`) owns its
        Running item (else Lost, writing nothing) and only while `trio.current_time()`
        is before `until()`, the attempt's self-stop deadline (else SelfStopped: past it
        at the start, nothing is opened; past it at the end, the transaction rolls back,
        checked as the last thing before the COMMIT). Handlers reach it through
        `Context.transaction()`. `server_timeout`: the server ends the session once
        the transaction has sat idle, or run one statement, that many seconds
        (sessions.py), so a vanished Worker host cannot hold the item's row."""
        refuse = None if until is None else functools.partial(_past, until, id, attempt)
        if refuse is not None and (stopped := refuse()) is not None:
            raise stopped
        bounds = LINK if server_timeout is None else LINK.fenced(server_timeout)
        async with self._conns.transaction(refuse_commit=refuse, bounds=bounds) as conn:
            tx = PostgresFencedTransaction(self._conns, conn, id, attempt)
            params = {"id": id, "attempt": attempt}
            [(fenced,)] = await tx.execute(self._sql["lock_attempt"], params)
            if not fenced:
                raise Lost(f"item {id} attempt {attempt} no longer owns the item; nothing written")
            yield tx
            if tx.completes:
                # The success (with the handler's result, if it gave one), noted in
                # the handler's own commit.
                query, values = self._sql["complete_in_transaction"], dict[str, object](params)
                if tx.result_json is not None:
                    query = self._sql["complete_in_transaction_result"]
                    values["result"] = tx.result_json
                [(noted,)] = await tx.execute(query, values)
                if not noted:  # pragma: no cover - the row is locked since lock_attempt
                    raise Lost(f"item {id} attempt {attempt} could not be completed")

    # -- claim and the fenced writes ---------------------------------------------

    async def claim(
        self,
        worker_id: str,
        lease: float,
        scopes: Sequence[str] | None = None,
        *,
        unscoped: bool = True,
        kinds: Sequence[str],
    ) -> WorkItem | None:  # pragma: no mutate block
        """Take the best due item of `kinds` whose scope is free; None if there is none."""
        items = await self.claim_batch(worker_id, lease, 1, scopes, unscoped=unscoped, kinds=kinds)
        return items[0] if items else None

    async def claim_batch(
        self,
        worker_id: str,
        lease: float,
        limit: int,
        scopes: Sequence[str] | None = None,
        *,
        unscoped: bool = True,
        kinds: Sequence[str],
    ) -> list[WorkItem]:  # pragma: no mutate block
        """Claim up to `limit` due items of `kinds` in one call (no more of a scope than its
        limit lets start; fewer than `limit` only when no more could start).

        Highest priority first, then by due time. A claim a slot index or a limit
        refusal rejects (it met a Running item of a scope or kind that its snapshot
        could not see) is a race loss, recognised by the name and counted; the store
        claims again at once, so the batch's other items are still claimed, and the
        lost item waits for the next poll.
        """
        params = wops.claim_params(worker_id, lease, limit, scopes, unscoped=unscoped, kinds=kinds)
        return await self._run(wops.claim(params), again=self._lost_race)

    async def complete_and_claim(
        self,
        attempts: Sequence[tuple[int, int]],
        worker_id: str,
        lease: float,
        limit: int,
        scopes: Sequence[str] | None = None,
        *,
        unscoped: bool = True,
        kinds: Sequence[str],
    ) -> tuple[set[int], list[WorkItem]]:  # pragma: no mutate block
        """`complete_batch(attempts)`, then `claim_batch(...)`, in one round trip: the ids
        whose completion applied, and the items claimed. The claim sees the completions
        (their scopes and kinds have room again). A race the claim loses rolls back the
        completions too, and both are sent again, as a lost claim is; a completion whose
        row another transaction held is made on its own afterwards, as in
        `complete_batch`."""
        params = wops.claim_params(worker_id, lease, limit, scopes, unscoped=unscoped, kinds=kinds)
        op = wops.finish_and_claim(attempts, params)
        applied, claimed = await self._run(op, again=self._lost_race)
        for id, attempt in attempts:
            if id not in applied and await self.complete(id, attempt):
                applied.add(id)
        return applied, claimed

    async def seconds_until_due(
        self,
        *,
        kinds: Sequence[str],
        scopes: Sequence[str] | None = None,
        unscoped: bool = True,
    ) -> float | None:  # pragma: no mutate block
        """Seconds until the next not-yet-due item a claim could take; None: none."""
        return await self._run(
            wops.seconds_until_due(kinds=kinds, scopes=scopes, unscoped=unscoped)
        )

    async def heartbeat(
        self, id: int, attempt: int, lease: float
    ) -> Heartbeat:  # pragma: no mutate block
        return await self._run(wops.heartbeat(id, attempt, lease))

    async def heartbeat_many(
        self, attempts: Sequence[tuple[int, int]], lease: float
    ) -> dict[tuple[int, int], Heartbeat]:  # pragma: no mutate block
        return await self._run(wops.heartbeat_many(attempts, lease))

    async def _finish(
        self,
        attempts: Sequence[tuple[int, int]],
        status: Status,
        reason: str | None = None,
        error: str | None = None,
        *,
        wait: bool = True,
        traceback: str | None = None,
    ) -> set[int]:  # pragma: no mutate block
        op = wops.finish(attempts, status, reason, error, wait=wait, traceback=traceback)
        return await self._run(op)

    async def complete(self, id: int, attempt: int) -> bool:  # pragma: no mutate block
        return bool(await self._finish([(id, attempt)], Status.SUCCEEDED))

    async def complete_batch(
        self, attempts: Sequence[tuple[int, int]], results: Sequence[str | None] | None = None
    ) -> set[int]:  # pragma: no mutate block
        """Complete many (id, attempt) pairs at once; the ids whose write applied.
        `results`: each one's result as JSON text (None: none), written with its
        Succeeded (work_finish_result_v1); without any, the plain finish.

        Rows another transaction holds are passed over by the batch and completed one
        by one afterwards, so a row an operator holds delays only its own item.
        """
        if results is None or all(r is None for r in results):
            applied = await self._finish(attempts, Status.SUCCEEDED, wait=False)
            for id, attempt in attempts:
                if id not in applied and await self.complete(id, attempt):
                    applied.add(id)
            return applied
        applied = await self._finish_result(attempts, results, wait=False)
        for (id, attempt), result in zip(attempts, results, strict=True):
            if id not in applied and await self._finish_result([(id, attempt)], [result]):
                applied.add(id)
        return applied

    async def _finish_result(
        self,
        attempts: Sequence[tuple[int, int]],
        results: Sequence[str | None],
        *,
        wait: bool = True,
    ) -> set[int]:  # pragma: no mutate block
        return await self._run(wops.finish_result(attempts, results, wait=wait))

    # -- durable steps -----------------------------------------------------------

    async def step(self, id: int, name: str) -> tuple[bool, Any]:  # pragma: no mutate block
        """Whether item `id` has step `name` recorded, and its value."""
        return await self._run(wops.step(id, name))

    async def parent_results(self, id: int) -> dict[int, Any]:  # pragma: no mutate block
        """The results of item `id`'s parents, by id (`Context.parent_results`)."""
        return await self._run(wops.parent_results(id))

    async def record_step(
        self,
        id: int,
        attempt: int,
        name: str,
        result: str | None,
        *,
        until: Callable[[], float] | None = None,
        server_timeout: float | None = None,
    ) -> bool:  # pragma: no mutate block
        """Record step `name`'s value for the attempt in a fenced transaction of its
        own (Lost, SelfStopped as there); False: one was recorded before, and stands."""
        params = {"id": id, "attempt": attempt, "name": name, "result": result}
        async with self.fenced_transaction(
            id, attempt, until=until, server_timeout=server_timeout
        ) as tx:
            rows = await tx.execute(self._sql["record_step"], params)
        recorded = rows[0][0]
        if recorded == "lost":  # pragma: no cover - the row is locked since lock_attempt
            raise Lost(f"item {id} attempt {attempt} no longer owns the item; step not recorded")
        return bool(recorded == "recorded")

    async def fail(
        self,
        id: int,
        attempt: int,
        reason: str,
        error: str | None = None,
        traceback: str | None = None,
    ) -> bool:  # pragma: no mutate block
        """Fail the attempt for good, keeping its reason, error and traceback."""
        return bool(
            await self._finish([(id, attempt)], Status.FAILED, reason, error, traceback=traceback)
        )

    async def cancel_attempt(self, id: int, attempt: int) -> bool:  # pragma: no mutate block
        return bool(await self._finish([(id, attempt)], Status.CANCELLED, "cancel requested"))

    async def _requeue(
        self,
        id: int,
        attempt: int,
        cause: str,
        *,
        delay: float = 0.0,
        error: str | None = None,
        traceback: str | None = None,
    ) -> bool:  # pragma: no mutate block
        op = wops.requeue(id, attempt, cause, delay=delay, error=error, traceback=traceback)
        return await self._run(op)

    async def release(self, id: int, attempt: int) -> bool:  # pragma: no mutate block
        """Back to Queued at its old place in line (or superseded by a dedup sibling)."""
        return await self._requeue(id, attempt, "release")

    async def retry_later(
        self, id: int, attempt: int, delay: float, error: str, traceback: str | None = None
    ) -> bool:  # pragma: no mutate block
        """Back to Queued after a handler error, due again in `delay` seconds."""
        return await self._requeue(
            id, attempt, "retry", delay=delay, error=error, traceback=traceback
        )

    # -- maintenance ----------------------------------------------------------------

    async def recover_expired_leases(
        self, max_stalls: int, *, batch: int = 100
    ) -> list[Recovered]:  # pragma: no mutate block
        """Requeue items whose lease expired (a stall); fail those at max_stalls. One
        whose attempt committed its success in its own transaction ends Succeeded,
        with no stall counted."""
        recovered: list[Recovered] = []
        while True:
            taken = await self._run(wops.recover_expired_leases(max_stalls, batch))
            recovered += taken
            if len(taken) < batch:
                return recovered

    async def held_leases(self, *, batch: int = 100) -> list[HeldLease]:  # pragma: no mutate block
        """Expired items whose row another session has held a whole lease after their
        lease ran out (work_held_leases_v1), the oldest first."""
        return await self._run(wops.held_leases(batch))

    async def settle_noted_scopes(self, *, batch: int = 100) -> int:  # pragma: no mutate block
        """Settle the heads of scopes noted in work_unsettled_scopes; how many."""
        settled = 0
        while True:
            n: int = await self._run(wops.settle_noted_scopes(batch))
            settled += n
            self._scopes_settled += n
            if n < batch:
                return settled

    async def repair_heads(self, *, batch: int = 1000) -> list[str]:  # pragma: no mutate block
        """Find and fix wedged scopes (there should never be any); the scopes fixed."""
        scopes = await self._run(wops.repair_heads(batch))
        self._heads_repaired += len(scopes)
        return scopes

    async def cancel(self, id: int) -> CancelOutcome:  # pragma: no mutate block
        return await self._run(operations.cancel(id))

    async def delete_finished(
        self,
        older_than: dt.timedelta,
        *,
        statuses: Sequence[Status] = FINISHED,
        batch: int = 1000,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> int:  # pragma: no mutate block
        """Delete items of `statuses` (finished ones) that finished longer than
        `older_than` ago, `batch` rows per transaction, oldest first; returns how many.
        Queued and Running items are never touched. `on_batch(rows, seconds)` is told
        about each batch (how long its locks were held)."""
        if not statuses or any(not s.is_terminal for s in statuses):
            raise ValueError("delete_finished deletes finished items only")
        params: dict[str, Any] = {
            "older_than": older_than.total_seconds(),
            "batch": batch,
            "statuses": [s.value for s in statuses],
            "after": dt.datetime.min.replace(tzinfo=dt.UTC),
        }
        deleted = 0
        while True:
            began = trio.current_time()
            finished = await self._run(wops.delete_finished(dict(params)))
            if on_batch is not None:
                on_batch(len(finished), trio.current_time() - began)
            deleted += len(finished)
            if len(finished) < batch:
                return deleted
            params["after"] = max(finished)

    # -- pauses, retries, quiesce ---------------------------------------------------

    async def pause(
        self, *, kind: str | None = None, scope: str | None = None
    ) -> bool:  # pragma: no mutate block
        """Pause a kind or a scope: its Queued items are not claimed (Running ones go
        on). Once a scope's pause returns, no claim can start an item of it. False:
        it was paused already."""
        return await self._run(operations.pause(kind=kind, scope=scope))

    async def resume(
        self, *, kind: str | None = None, scope: str | None = None
    ) -> bool:  # pragma: no mutate block
        """Lift a pause; False: it was not paused."""
        return await self._run(operations.resume(kind=kind, scope=scope))

    async def pauses(self) -> list[Pause]:  # pragma: no mutate block
        return await self._run(operations.pauses())

    async def retry(self, ids: Sequence[int]) -> list[int]:  # pragma: no mutate block
        """Failed or Cancelled items back to Queued with a fresh attempt budget (their
        history kept), due now; the ids retried. Others (not finished, succeeded, or
        whose dedup key a Queued item holds) are left as they are."""
        return await self._run(operations.retry(ids))

    async def failed_items(
        self, *, kind: str | None = None, since: dt.datetime | None = None
    ) -> list[int]:  # pragma: no mutate block
        """Ids of Failed items (of `kind`) that finished at or after `since`, oldest first."""
        return await self._run(operations.failed_items(kind=kind, since=since))

    async def scope_holder(
        self, scope: str
    ) -> tuple[ScopeHolder | None, bool]:  # pragma: no mutate block
        """The scope's first Running item (None: none), and whether it still has a head."""
        holders, heads = await self.scope_holders(scope)
        return (holders[0] if holders else None), heads

    # -- limits (issue 21; docs/design/limits.md) ---------------------------------------

    async def scope_holders(
        self, scope: str
    ) -> tuple[list[ScopeHolder], bool]:  # pragma: no mutate block
        """The scope's Running items, in slot order, and whether it still has a head."""
        return await self._run(wops.scope_holders(scope))

    async def set_limit(
        self,
        *,
        kind: str | None = None,
        scope: str | None = None,
        running: int | None = None,
        rate: Rate | str | None = None,
    ) -> Limit:  # pragma: no mutate block
        """Set a limit of `kind`, of `scope`, or (neither) the default running limit of
        every scope without its own: at most `running` Running at once, at most
        `rate` starts per period (`Rate(10, 1.0)` or "10/s"). None keeps what is set.
        Raises InvalidLimit, writing nothing, for a bad one (zero: `clear_limit`)."""
        change = validate_limit(kind, scope, running, rate)
        return await self._run(wops.set_limit(change))

    async def declare_limit(self, declared: LimitChange) -> Declared:  # pragma: no mutate block
        """Put a kind's declared limit in force (`Registry.handler(limit=, rate=)`): its
        running limit and rate become exactly the declared ones (a part declared None is
        removed), unless the database holds exactly those already."""
        return await self._run(wops.declare_limit(declared))

    async def clear_limit(
        self, *, kind: str | None = None, scope: str | None = None
    ) -> bool:  # pragma: no mutate block
        """Remove the limit of `kind`, `scope` or (neither) the default; False: none."""
        kind, scope = limit_target(kind, scope)
        return await self._run(wops.clear_limit(kind, scope))

    async def limits(self) -> list[Limit]:  # pragma: no mutate block
        """Every limit, with the Running items, rate-window starts and waiting due
        items it holds now."""
        return await self._run(wops.limits())

    # -- schedules ----------------------------------------------------------------------

    async def sync_schedules(
        self, schedules: Sequence[Schedule]
    ) -> None:  # pragma: no mutate block
        """Write the Worker's schedules to the database (a changed one starts afresh)."""
        now = dt.datetime.now(dt.UTC)
        for schedule in schedules:
            await self._run(wops.sync_schedule(schedule, now))

    async def fire_schedules(
        self, schedules: Sequence[Schedule]
    ) -> tuple[list[Fired], float | None]:  # pragma: no mutate block
        """Enqueue the due times of those of `schedules` that are due, one item each for
        its latest due time, in one transaction with moving each on (a schedule another
        Worker is firing is passed over). Returns what was fired, and seconds until
        the next of them is due."""
        by_name = {s.name: s for s in schedules}
        carried = {"names": list(by_name), "specs": [s.spec for s in by_name.values()]}

        async def op(conn: psycopg.AsyncConnection[Any]) -> tuple[list[Fired], float | None]:
            fired: list[Fired] = []
            async with conn.transaction():
                # Ended by the server once its client has been silent longer than the
                # call may last (sessions.py): a host lost in between holds no
                # schedule, nor the lines of the scopes it enqueues into.
                bounds = LINK.fenced(self.call_timeout)
                await conn.execute(set_local(bounds, conn.info.server_version))
                cur = await conn.execute(self._sql["due_schedules"], carried)
                for name, next_due, now in await cur.fetchall():
                    schedule = by_name[name]
                    due, following = plan(schedule, next_due, now)
                    assert due is not None
                    request = schedule_request(schedule, due, now)
                    steps = functools.partial(operations.enqueue_steps, request)
                    enqueued = await drive.run_async(
                        conn, operations.Operation("enqueue", steps), self._sql
                    )
                    await conn.execute(
                        self._sql["fired_schedule"],
                        {"name": name, "next_due": following, "due": due, "item": enqueued.id},
                    )
                    fired.append(Fired(name, due, enqueued.id, enqueued.deduplicated))
                cur = await conn.execute(self._sql["next_schedule_due"], carried)
                row = await cur.fetchone()
            return fired, None if row is None or row[0] is None else max(0.0, row[0])

        return await self._conns.call("fire_schedules", op)

    async def schedules(self) -> list[ScheduleState]:  # pragma: no mutate block
        return await self._run(operations.schedules())

    # -- Workers --------------------------------------------------------------------

    async def advertise(self, worker: WorkerInfo) -> None:  # pragma: no mutate block
        """Record (or refresh) a Worker in the Workers table; ConfigurationError when
        another live Worker holds its id."""
        await self._run(wops.advertise(worker, gone=process_gone))

    async def worker_stopped(self, worker_id: str) -> None:  # pragma: no mutate block
        await self._run(wops.worker_stopped(worker_id))

    async def attempts(self, id: int) -> list[AttemptRecord]:  # pragma: no mutate block
        """How each attempt of item `id` ended (its last 20 that did not succeed, and
        the current one if it is running or succeeded), oldest first."""
        return await self._run(operations.attempts(id))

    async def get_item(self, id: int) -> ItemState | None:  # pragma: no mutate block
        return await self._run(operations.get_item(id))

    async def show(self, id: int) -> ItemDetails | None:  # pragma: no mutate block
        """Item `id` and how its attempts ended; None: no such item."""
        return await self._run(operations.show(id))

    async def queue_counts(self) -> QueueCounts:  # pragma: no mutate block
        return await self._run(operations.queue_counts())

    async def result(
        self,
        id: int,
        *,
        timeout: float | None = None,  # noqa: ASYNC109  issue 34 names it, as Client does
    ) -> Any:  # pragma: no mutate block
        """Wait until item `id` has ended (TimeoutError after `timeout` seconds; None:
        no bound); its result if it Succeeded, else ItemNotSucceeded naming its status
        and error; UnknownItem if there is no such item (`waiting.wait_result`)."""
        op = operations.result_state(id)
        return await wait_result(lambda: self._run(op), id, timeout)

    async def status(self, *, failures: int = 10) -> QueueStatus:  # pragma: no mutate block
        """What `status` shows: counts, Running items, the latest `failures` failures,
        Workers, Queued kinds no live Worker serves, schedules and pauses."""
        return await self._run(operations.status(failures=failures))

    def statistics(self) -> StoreStatistics:  # pragma: no mutate block
        return StoreStatistics(
            race_losses=self._race_losses,
            dedup_hits=self._dedup_hits,
            timeouts=self._conns.timeouts,
            conflict_retries=self._conns.conflict_retries,
            scopes_settled=self._scopes_settled,
            heads_repaired=self._heads_repaired,
        )

    # -- notifications ---------------------------------------------------------------

    async def listen(
        self,
        on_notify: NotifyCallback,
        *,
        on_settle: NotifyCallback | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
        check_every: float = 30.0,
    ) -> None:  # pragma: no mutate block
        """Call `on_notify` for each NOTIFY about new work, and `on_settle` for each
        scope left to be settled, until cancelled (`Connections.listen`)."""
        await self._conns.listen(
            on_notify, on_settle=on_settle, task_status=task_status, check_every=check_every
        )

    def __repr__(self) -> str:
        where = "" if self.schema is None else f", schema={self.schema!r}"
        return f"PostgresStore({redact_dsn(self.dsn)!r}{where})"


def _past(
    until: Callable[[], float], id: int, attempt: int
) -> SelfStopped | None:  # pragma: no mutate block
    """SelfStopped if attempt (`id`, `attempt`)'s self-stop deadline, `until()` on
    Trio's clock, has passed; None while it has not."""
    if trio.current_time() < until():
        return None
    return SelfStopped(
        f"item {id} attempt {attempt}: its self-stop deadline has passed; nothing written"
        " (the item belongs to lease recovery)"
    )


def _connection_of(tx: Transaction | None) -> psycopg.AsyncConnection[Any] | None:
    """The connection of a transaction of this store's (None: none given)."""
    if tx is None:
        return None
    if not isinstance(tx, PostgresTransaction):
        raise TypeError(f"tx must be a transaction of a PostgresStore, not {type(tx).__name__}")
    return tx._conn


@asynccontextmanager
async def open_store(
    dsn: str | None = None,
    *,
    max_connections: int = 10,
    call_timeout: float = 10.0,
    known_kinds: Sequence[str] | None = None,
    application_name: str = "trioworker",
    schema: str | None = None,
    listen_dsn: str | None = None,
) -> AsyncIterator[PostgresStore]:  # pragma: no mutate block
    """Open a PostgresStore (in a Trio task: it needs no asyncio loop). `dsn`: None
    reads $TRIOWORKER_DSN, else libpq's PG* variables decide; `schema`: None reads
    $TRIOWORKER_SCHEMA, else the role's search_path finds the queue."""
    require_trio("open_store")
    store = PostgresStore(
        dsn,
        max_connections=max_connections,
        call_timeout=call_timeout,
        known_kinds=known_kinds,
        application_name=application_name,
        schema=schema,
        listen_dsn=listen_dsn,
    )
    await store.open()
    try:
        yield store
    finally:
        with trio.CancelScope(shield=True):
            await store.close()
