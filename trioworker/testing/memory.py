"""An in-memory Store for unit tests on Trio's virtual clock.

`MemoryStore` implements the same protocol as `PostgresStore` and is held to the same
contract tests, so it cannot drift from PostgreSQL. Time is Trio's clock, so a
`MockClock` drives leases and run_after. `writes` records every write after a claim,
applied or not; `calls` every operation, in order. Handlers' SQL is not
run: `statements` records what their fenced transactions committed.
"""

from __future__ import annotations

import collections
import copy
import datetime as dt
import json
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, LiteralString

import attrs
import trio

from trioworker._core.errors import (
    InvalidWorkItem,
    Lost,
    SelfStopped,
    UnknownItem,
)
from trioworker._core.limits import Declared, Limit, LimitChange, Rate, limit_target, validate_limit
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
    StepRecord,
    StoreStatistics,
    WorkerInfo,
    WorkItem,
)
from trioworker._core.schedule import Schedule, first_due, plan, schedule_request
from trioworker._core.validation import (
    EnqueueRequest,
    pause_target,
    result_json,
    validate_enqueue,
    validate_many,
)
from trioworker._store.api import NotifyCallback, Params, Transaction
from trioworker._store.reads import (
    Failure,
    ItemDetails,
    QueueCounts,
    QueueStatus,
    Relative,
    RunningItem,
    WaitFacts,
    WorkerState,
    alive_window,
    counts_by_kind,
    finished_result,
    id_in_use,
    parents_waited_for,
    process_gone,
    waiting_reasons,
)
from trioworker._store.tracing import trace_context_or_current, with_current_trace
from trioworker._store.waiting import wait_result
from trioworker.testing._memory_dependencies import (
    PENDING,
    Dependencies,
    ParentStatus,
    cascade_reason,
    verdict,
)
from trioworker.testing._memory_limits import DEFAULT, MemoryLimits

#: The most children `show` lists, the first by id (as PostgreSQL's `family`).
SHOWN_CHILDREN = 1000


@attrs.frozen
class Write:
    """A write after a claim, as the store saw it."""

    op: str
    id: int
    attempt: int
    applied: bool


@attrs.frozen
class Statement:
    """A statement a fenced transaction ran, recorded once that transaction committed."""

    item_id: int
    attempt: int
    query: str
    params: Params


#: `MemoryStore(respond=...)`: the rows a statement returns, as dicts (column: value),
#: given its query and params.
Respond = Callable[[str, Params], list[dict[str, Any]]]


@attrs.define
class MemoryFencedTransaction:
    """`Context.transaction()` on the in-memory store: the fence and `complete()` work
    as on PostgreSQL. Statements run no SQL: each is held until the commit, when it is
    recorded on the store (`MemoryStore.statements`), and returns the rows the store's
    `respond` gives (none without one). Items enqueued in it exist once it commits."""

    item_id: int
    attempt: int
    completes: bool = False
    result_json: str | None = None
    _store: MemoryStore | None = attrs.field(default=None, repr=False, eq=False)
    #: What the commit applies: the statements run and the items enqueued in it.
    _statements: list[Statement] = attrs.field(factory=list, init=False, repr=False)
    _enqueued: list[tuple[int, EnqueueRequest]] = attrs.field(factory=list, init=False, repr=False)

    async def execute(self, query: LiteralString, params: Params = None) -> list[tuple[Any, ...]]:
        return [tuple(row.values()) for row in await self.rows(query, params)]

    async def rows(self, query: LiteralString, params: Params = None) -> list[dict[str, Any]]:
        self._statements.append(Statement(self.item_id, self.attempt, query, copy.deepcopy(params)))
        if self._store is None:
            return []
        await self._store._enter("execute")
        return self._store._respond_to(query, params)

    def complete(self, result: Any = None) -> None:
        self.result_json = result_json(result)
        self.completes = True


def _no_transactions(tx: object) -> None:
    if tx is not None:
        raise NotImplementedError(
            "MemoryStore has no transactions to enqueue in but a handler's own"
            " (ctx.transaction()): test enqueue(tx=...) in other transactions against"
            " PostgreSQL (docs/guide/testing.md)"
        )


@attrs.define
class _Row:
    id: int
    kind: str
    scope: str | None
    payload: Any
    dedup_key: str | None
    requested_at: dt.datetime
    run_after: dt.datetime
    priority: int = 0
    status: Status = Status.QUEUED
    attempt: int = 0
    stalls: int = 0
    failures: int = 0
    worker_id: str | None = None
    lease_expires_at: dt.datetime | None = None
    heartbeat_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    cancel_requested: bool = False
    reason: str | None = None
    error: str | None = None
    traceback: str | None = None
    trace_context: dict[str, str] | None = None
    #: When the attempt committed its success in its own fenced transaction: the row
    #: stays Running (its scope and kind slots taken) until it is finished Succeeded.
    completed_at: dt.datetime | None = None
    #: A Succeeded item's result, as stored JSON decodes it (None: none).
    result: Any = None

    @property
    def key(self) -> tuple[int, dt.datetime, int]:
        """Claim order: higher priority first, then due time, then id."""
        return (-self.priority, self.run_after, self.id)

    @property
    def line(self) -> tuple[str | None, str, int]:
        return (self.scope, self.kind, self.priority)


class MemoryStore:
    """The Store protocol in memory; time is `trio.current_time()`."""

    def __init__(
        self, *, known_kinds: Sequence[str] | None = None, respond: Respond | None = None
    ) -> None:
        """`respond(query, params)`: the rows a fenced transaction's statement returns,
        as a list of dicts (`tx.rows` gives them as they are, `tx.execute` as tuples of
        their values); without it, statements return no rows."""
        self.known_kinds = frozenset(known_kinds) if known_kinds is not None else None
        self.writes: list[Write] = []
        self.calls: list[str] = []
        #: Each fenced transaction's `server_timeout`, in the order they were opened.
        self.server_timeouts: list[float | None] = []
        self._rows: dict[int, _Row] = {}
        self._next_id = 1
        self._listeners: list[NotifyCallback] = []
        self._epoch = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        self._dedup_hits = 0
        #: The live Workers, by id.
        self.workers: dict[str, WorkerInfo] = {}
        #: The Workers table: every Worker advertised, and (started, last seen, stopped).
        self._advertised: dict[str, WorkerInfo] = {}
        self._seen: dict[str, tuple[dt.datetime, dt.datetime, dt.datetime | None]] = {}
        self._attempts: dict[int, dict[int, AttemptRecord]] = {}
        #: Each item's recorded steps, by name, in the order they were recorded.
        self._steps: dict[int, dict[str, StepRecord]] = {}
        #: Set (and replaced) whenever an item ends: what `result` waits on.
        self._ended = trio.Event()
        #: Paused kinds and scopes: ("kind", name) or ("scope", name), when paused.
        self._pauses: dict[tuple[str, str], dt.datetime] = {}
        self._schedules: dict[str, ScheduleState] = {}
        #: The schedules' specs, by name (what the database compares).
        self._specs: dict[str, str] = {}
        self._limits = MemoryLimits()
        #: Each item's `after` as enqueued, and each parent's children.
        self._deps = Dependencies()
        self._respond = respond
        self._statements: list[Statement] = []

    @property
    def statements(self) -> list[Statement]:
        """The statements fenced transactions committed, in commit order (a copy): one
        rolled back (its body raised, its attempt was fenced out or self-stopped) ran
        none, as on PostgreSQL."""
        return list(self._statements)

    def _respond_to(self, query: str, params: Params) -> list[dict[str, Any]]:
        if self._respond is None:
            return []
        rows = self._respond(query, params)
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            raise TypeError(
                f"MemoryStore's respond(query, params) must return a list of dicts"
                f" (column: value), not {rows!r}, for {query!r}"
            )
        return rows

    def _in_fenced(self, tx: Transaction | None) -> MemoryFencedTransaction | None:
        """`tx` when it is one of this store's fenced transactions; None for none."""
        if isinstance(tx, MemoryFencedTransaction) and tx._store is self:
            return tx
        _no_transactions(tx)
        return None

    # -- time and calls ----------------------------------------------------------

    def now(self) -> dt.datetime:
        return self._epoch + dt.timedelta(seconds=trio.current_time())

    async def _enter(self, op: str) -> None:
        """Every operation's first step: noted in `calls`, and a checkpoint (as a real
        call's). tests/support/fakes.py's ScriptedStore scripts faults here."""
        self.calls.append(op)
        await trio.lowlevel.checkpoint()

    def _notify(self, scope: str | None) -> None:
        for listener in list(self._listeners):
            listener(scope or "")

    def _busy(self, scope: str | None) -> bool:
        """Whether the scope runs as many items as its limit allows (1 by default)."""
        return scope is not None and self._running(scope=scope) >= self._limits.scope_limit(scope)

    def _running(self, *, scope: str | None = None, kind: str | None = None) -> int:
        return sum(
            1
            for r in self._rows.values()
            if r.status is Status.RUNNING
            and (scope is None or r.scope == scope)
            and (kind is None or r.kind == kind)
        )

    def _kind_has_room(self, kind: str, now: dt.datetime) -> bool:
        """Whether the kind's running limit and rate let one more start now."""
        kind_limit = self._limits.kind_limit(kind)
        if kind_limit is not None and self._running(kind=kind) >= kind_limit:
            return False
        return self._limits.rate_open(("kind", kind), now)

    def _may_start(self, row: _Row) -> bool:
        """Whether the item's kind and scope limits let it start now."""
        now = self.now()
        if not self._kind_has_room(row.kind, now):
            return False
        return row.scope is None or (
            not self._busy(row.scope) and self._limits.rate_open(("scope", row.scope), now)
        )

    def _queued_with(self, dedup_key: str | None, *, besides: int = -1) -> _Row | None:
        if dedup_key is None:
            return None
        for row in self._rows.values():
            if row.dedup_key == dedup_key and row.status is Status.QUEUED and row.id != besides:
                return row
        return None

    def _fenced(self, id: int, attempt: int, *, completed: bool = True) -> _Row | None:
        """The attempt's Running row (None: it is not the attempt's). With `completed`
        false, not one whose attempt committed its success in its own transaction:
        only finishing it Succeeded applies to that (work_finish_v1)."""
        row = self._rows.get(id)
        if row is None or row.attempt != attempt or row.status is not Status.RUNNING:
            return None
        if not completed and row.completed_at is not None:
            return None
        return row

    def _record(self, op: str, id: int, attempt: int, row: _Row | None) -> bool:
        self.writes.append(Write(op, id, attempt, row is not None))
        return row is not None

    def _finish(self, row: _Row, status: Status, reason: str | None = None) -> None:
        """End the row, and settle its Waiting children (work_items_release_children)."""
        self._end(row, status, reason)
        self._settle(self._deps.children(row.id), ended=(row.id, status))

    def _end(self, row: _Row, status: Status, reason: str | None = None) -> None:
        """End the row Succeeded, Failed or Cancelled (its children left as they are)."""
        self._ended.set()
        self._ended = trio.Event()
        row.status = status
        row.finished_at = self.now()
        row.lease_expires_at = None
        if reason is not None:
            row.reason = reason
        self._notify_if_freed(row.scope)

    def _note(
        self, row: _Row, outcome: str, error: str | None = None, traceback: str | None = None
    ) -> None:
        """How the row's current attempt ended; the item's last 20 notes are kept."""
        notes = self._attempts.setdefault(row.id, {})
        notes.setdefault(
            row.attempt,
            AttemptRecord(
                row.attempt, row.worker_id, row.started_at, self.now(), outcome, error, traceback
            ),
        )
        for old in [a for a in notes if a <= row.attempt - 20]:
            del notes[old]

    def _requeue(self, row: _Row, run_after: dt.datetime | None = None) -> None:
        """Back to Queued (due at `run_after`, None: when it was), unless a Queued
        sibling holds its dedup key."""
        sibling = self._queued_with(row.dedup_key, besides=row.id)
        row.worker_id = None
        if sibling is not None:
            self._finish(row, Status.CANCELLED, f"superseded by queued item {sibling.id}")
            return
        if run_after is not None:
            row.run_after = run_after
        row.lease_expires_at = None
        row.status = Status.QUEUED
        row.reason = None
        row.finished_at = None
        self._notify_if_freed(row.scope)

    def _arrive(self, row: _Row) -> None:
        """Queued, in its scope's line, as an enqueue arrives (announced when it is due
        and its scope free)."""
        row.status = Status.QUEUED
        if row.run_after <= self.now() and not self._busy(row.scope):
            self._notify(row.scope)

    def _notify_if_freed(self, scope: str | None) -> None:
        if not self._busy(scope) and any(
            r.scope == scope and r.status is Status.QUEUED and r.run_after <= self.now()
            for r in self._rows.values()
        ):
            self._notify(scope)

    # -- dependencies (migrations/0003.dependencies.sql) ----------------------------

    def _unknown_parents(
        self, request: EnqueueRequest, fenced: MemoryFencedTransaction | None
    ) -> str | None:
        """Why the request's parents are refused: the ids that name no item (None: all
        do); an item enqueued earlier in the same transaction is one. Checked before
        anything is written."""
        pending = {id for id, _ in fenced._enqueued} if fenced is not None else set()
        unknown = [id for id in request.after if id not in self._rows and id not in pending]
        if not unknown:
            return None
        return "after names items that do not exist: " + ", ".join(map(str, unknown))

    def _parent_states(self, id: int) -> list[tuple[int, ParentStatus]]:
        """Item `id`'s parents as it was enqueued after them: (id, status), None for one
        that no longer exists."""
        return [(p, r.status if (r := self._rows.get(p)) else None) for p in self._deps.after(id)]

    def _parents(self, id: int) -> list[_Row]:
        """Item `id`'s parents that still exist, by id."""
        return [self._rows[p] for p in self._deps.after(id) if p in self._rows]

    def _waiting(self, ids: Iterable[int]) -> list[_Row]:
        """The Waiting items of `ids`, by id."""
        rows = (self._rows.get(id) for id in set(ids))
        return sorted((r for r in rows if r and r.status is Status.WAITING), key=lambda r: r.id)

    def _commit_waiting(self, ids: Iterable[int]) -> None:
        """At the commit that wrote them (their enqueue, a retry), settle the items made
        Waiting, one by one in the order written (work_items_wait_for_parents)."""
        for id in ids:
            self._settle([id])

    def _settle(self, ids: Iterable[int], *, ended: tuple[int, Status] | None = None) -> None:
        """Settle the Waiting items of `ids` (work_settle_waiting): each whose parents
        have all Succeeded arrives Queued; each with a parent Failed, Cancelled or gone
        is Cancelled, naming it, and so are its Waiting descendants, level by level, each
        naming its lowest parent cancelled at the level above; the rest wait. A level's
        verdicts are all read before any is written. `ended`: the parent whose last
        transition settles them (id, status), the only one whose end cancels them."""
        verdicts = [
            (row, verdict(self._parent_states(row.id), ended=ended)) for row in self._waiting(ids)
        ]
        for row, decided in verdicts:
            if decided.status is Status.QUEUED:
                self._arrive(row)
        doomed = [
            (row, decided.reason) for row, decided in verdicts if decided.status is Status.CANCELLED
        ]
        while doomed:
            for row, reason in doomed:
                self._end(row, Status.CANCELLED, reason)
            frontier = {row.id for row, _ in doomed}
            below = self._waiting(c for p in frontier for c in self._deps.children(p))
            doomed = [
                (row, cascade_reason(frontier.intersection(self._deps.after(row.id))))
                for row in below
            ]

    def _needed(self, id: int) -> bool:
        """Whether a child still needs item `id` (work_items_keep_needed_parents)."""
        return any(self._rows[c].status in PENDING for c in self._deps.children(id))

    # -- the protocol ---------------------------------------------------------------

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
    ) -> Enqueued:
        fenced = self._in_fenced(tx)
        now = self.now()
        request = validate_enqueue(
            kind,
            scope,
            payload,
            dedup_key,
            run_after,
            priority=priority,
            now=now,
            known_kinds=self.known_kinds,
            trace_context=trace_context_or_current(trace_context),
            after=after,
        )
        await self._enter("enqueue")
        if refused := self._unknown_parents(request, fenced):
            raise InvalidWorkItem(refused)
        enqueued = self._insert(request, now, fenced)
        if fenced is None:
            self._commit_waiting([enqueued.id])
        return enqueued

    def _insert(
        self,
        request: EnqueueRequest,
        now: dt.datetime,
        fenced: MemoryFencedTransaction | None = None,
        id: int | None = None,
    ) -> Enqueued:
        """Insert the item now (Queued, or Waiting for the parents it names, which the
        caller settles at its commit), or (`fenced`) take its id now and insert it with
        `id` when that transaction commits."""
        holder = self._queued_with(request.dedup_key)
        if holder is not None:
            self._dedup_hits += 1
            return Enqueued(id=holder.id, deduplicated=True)
        if fenced is not None and request.dedup_key is not None:
            # An item enqueued earlier in the same transaction holds the key, as its
            # row would on PostgreSQL.
            for pending_id, pending in fenced._enqueued:
                if pending.dedup_key == request.dedup_key:
                    self._dedup_hits += 1
                    return Enqueued(id=pending_id, deduplicated=True)
        if id is None:
            id = self._next_id
            self._next_id += 1
        if fenced is not None:
            fenced._enqueued.append((id, request))
            return Enqueued(id=id, deduplicated=False)
        row = _Row(
            id=id,
            kind=request.kind,
            scope=request.scope,
            payload=_json_roundtrip(request.payload_json),
            dedup_key=request.dedup_key,
            requested_at=now,
            run_after=request.run_at or now + dt.timedelta(seconds=request.delay),
            priority=request.priority,
            status=Status.WAITING,
            trace_context=(
                None
                if request.trace_context_json is None
                else _json_roundtrip(request.trace_context_json)
            ),
        )
        self._rows[row.id] = row
        if request.after:
            self._deps.add(row.id, request.after)
        else:
            self._arrive(row)
        return Enqueued(id=row.id, deduplicated=False)

    async def enqueue_many(
        self, items: Sequence[NewItem], *, tx: Transaction | None = None
    ) -> list[Enqueued]:
        fenced = self._in_fenced(tx)
        now = self.now()
        requests = validate_many(with_current_trace(items), now=now, known_kinds=self.known_kinds)
        await self._enter("enqueue_many")
        for index, request in enumerate(requests):
            if refused := self._unknown_parents(request, fenced):
                raise InvalidWorkItem.of_item(index, refused)
        enqueued = [self._insert(request, now, fenced) for request in requests]
        if fenced is None:
            self._commit_waiting(e.id for e in enqueued)
        return enqueued

    async def claim(
        self,
        worker_id: str,
        lease: float,
        scopes: Sequence[str] | None = None,
        *,
        unscoped: bool = True,
        kinds: Sequence[str],
    ) -> WorkItem | None:
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
    ) -> list[WorkItem]:
        if scopes is None and not unscoped:
            raise ValueError("a Worker serving every scope serves unscoped items too")
        await self._enter("claim")
        claimed: list[WorkItem] = []
        # Rounds of one item a free scope, as on PostgreSQL, until the batch is full or
        # a round takes nothing: a short claim means nothing more could start.
        while len(claimed) < limit:
            before = len(claimed)
            for row in self._claimable(scopes, unscoped=unscoped, kinds=kinds):
                if len(claimed) == limit:
                    break
                if self._may_start(row):
                    claimed.append(self._claim_one(row, worker_id, lease))
            if len(claimed) == before:
                break
        return sorted(claimed, key=_by_id)

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
    ) -> tuple[set[int], list[WorkItem]]:
        applied = await self.complete_batch(attempts)
        claimed = await self.claim_batch(
            worker_id, lease, limit, scopes, unscoped=unscoped, kinds=kinds
        )
        return applied, claimed

    def _claimable(
        self, scopes: Sequence[str] | None, *, unscoped: bool, kinds: Sequence[str]
    ) -> list[_Row]:
        """Due Queued items of `kinds` in claim order, at most one per free scope. A
        kind that is paused or has no room is not read (as on PostgreSQL, where each
        (scope, kind, priority) is a line of its own): a scope's item of another kind
        goes instead."""
        now = self.now()
        open_kinds = {
            k for k in kinds if ("kind", k) not in self._pauses and self._kind_has_room(k, now)
        }

        def eligible(row: _Row) -> bool:
            if row.status is not Status.QUEUED or row.run_after > now:
                return False
            if row.kind not in open_kinds:
                return False
            if row.scope is None:
                return unscoped
            if scopes is not None and row.scope not in scopes:
                return False
            return not self._busy(row.scope) and ("scope", row.scope) not in self._pauses

        candidates = sorted((r for r in self._rows.values() if eligible(r)), key=lambda r: r.key)
        firsts: list[_Row] = []
        taken: set[str] = set()
        for row in candidates:
            if row.scope is None or row.scope not in taken:
                firsts.append(row)
                if row.scope is not None:
                    taken.add(row.scope)
        return firsts

    def _claim_one(self, row: _Row, worker_id: str, lease: float) -> WorkItem:
        now = self.now()
        row.status = Status.RUNNING
        row.attempt += 1
        row.worker_id = worker_id
        row.lease_expires_at = now + dt.timedelta(seconds=lease)
        row.heartbeat_at = now
        row.started_at = now
        self._limits.started(row.kind, row.scope, now)
        return WorkItem(
            id=row.id,
            kind=row.kind,
            scope=row.scope,
            payload=copy.deepcopy(row.payload),
            attempt=row.attempt,
            stalls=row.stalls,
            failures=row.failures,
            requested_at=row.requested_at,
            dedup_key=row.dedup_key,
            priority=row.priority,
            trace_context=copy.deepcopy(row.trace_context),
        )

    async def seconds_until_due(
        self,
        *,
        kinds: Sequence[str],
        scopes: Sequence[str] | None = None,
        unscoped: bool = True,
    ) -> float | None:
        """Until the first item of a line (or an unscoped item) falls due."""
        await self._enter("seconds_until_due")
        now = self.now()
        firsts: dict[tuple[str | None, str, int] | int, _Row] = {}
        for row in self._rows.values():
            if row.status is not Status.QUEUED or row.kind not in kinds:
                continue
            if ("kind", row.kind) in self._pauses:
                continue
            if row.scope is None:
                if unscoped:
                    firsts[row.id] = row
                continue
            if (scopes is not None and row.scope not in scopes) or self._busy(row.scope):
                continue
            if ("scope", row.scope) in self._pauses:
                continue
            first = firsts.get(row.line)
            if first is None or (row.run_after, row.id) < (first.run_after, first.id):
                firsts[row.line] = row
        waiting = [
            (r.run_after - now).total_seconds() for r in firsts.values() if r.run_after > now
        ]
        for key in self._limits.rated():  # a rate window holding due work back
            reopens = self._limits.reopens(key, now)
            if reopens is not None and any(
                r.run_after <= now
                and (r.kind == key[1] if key[0] == "kind" else r.scope == key[1])
                and (key[0] == "scope" or r.kind in kinds)
                for r in firsts.values()
            ):
                waiting.append((reopens - now).total_seconds())
        return min(waiting, default=None)

    async def heartbeat(self, id: int, attempt: int, lease: float) -> Heartbeat:
        await self._enter("heartbeat")
        row = self._fenced(id, attempt)
        self._record("heartbeat", id, attempt, row)
        if row is None:
            return Heartbeat.LOST
        row.lease_expires_at = self.now() + dt.timedelta(seconds=lease)
        row.heartbeat_at = self.now()
        if row.cancel_requested and row.completed_at is None:  # else its success is kept
            return Heartbeat.CANCEL_REQUESTED
        return Heartbeat.OK

    async def heartbeat_many(
        self, attempts: Sequence[tuple[int, int]], lease: float
    ) -> dict[tuple[int, int], Heartbeat]:
        await self._enter("heartbeat")
        answers = {}
        for id, attempt in attempts:
            row = self._fenced(id, attempt)
            self._record("heartbeat", id, attempt, row)
            if row is None:
                answers[id, attempt] = Heartbeat.LOST
                continue
            row.lease_expires_at = self.now() + dt.timedelta(seconds=lease)
            row.heartbeat_at = self.now()
            # A cancel asked of a completed item is moot: its success is durable.
            cancel = row.cancel_requested and row.completed_at is None
            answers[id, attempt] = Heartbeat.CANCEL_REQUESTED if cancel else Heartbeat.OK
        return answers

    async def complete(self, id: int, attempt: int) -> bool:
        await self._enter("complete")
        row = self._fenced(id, attempt)
        if row is not None:
            self._finish(row, Status.SUCCEEDED)
        return self._record("complete", id, attempt, row)

    async def complete_batch(
        self, attempts: Sequence[tuple[int, int]], results: Sequence[str | None] | None = None
    ) -> set[int]:
        await self._enter("complete_batch")
        applied = set()
        if results is None:
            results = [None] * len(attempts)
        for (id, attempt), result in zip(attempts, results, strict=True):
            row = self._fenced(id, attempt)
            if row is not None:
                if result is not None:
                    row.result = _json_roundtrip(result)
                self._finish(row, Status.SUCCEEDED)
                applied.add(id)
            self._record("complete", id, attempt, row)
        return applied

    # -- durable steps -------------------------------------------------------------

    async def step(self, id: int, name: str) -> tuple[bool, Any]:
        await self._enter("step")
        record = self._steps.get(id, {}).get(name)
        return (False, None) if record is None else (True, copy.deepcopy(record.result))

    async def parent_results(self, id: int) -> dict[int, Any]:
        """The results of item `id`'s parents, by id (`Context.parent_results`)."""
        await self._enter("parent_results")
        return {p.id: copy.deepcopy(p.result) for p in self._parents(id)}

    async def record_step(
        self,
        id: int,
        attempt: int,
        name: str,
        result: str | None,
        *,
        until: Callable[[], float] | None = None,
        server_timeout: float | None = None,
    ) -> bool:
        """Fenced as `fenced_transaction` (Lost, SelfStopped); False: recorded before."""
        async with self.fenced_transaction(id, attempt, until=until, server_timeout=server_timeout):
            pass
        # The commit's checks have passed (nothing checkpoints after them): record it.
        steps = self._steps.setdefault(id, {})
        if name in steps:
            return False
        value = None if result is None else _json_roundtrip(result)
        steps[name] = StepRecord(name, attempt, self.now(), value)
        self.writes.append(Write("record_step", id, attempt, True))
        return True

    async def fail(
        self,
        id: int,
        attempt: int,
        reason: str,
        error: str | None = None,
        traceback: str | None = None,
    ) -> bool:
        await self._enter("fail")
        row = self._fenced(id, attempt, completed=False)
        if row is not None:
            row.error = error
            row.traceback = traceback
            row.failures += 1
            self._finish(row, Status.FAILED, reason)
            self._note(row, "failed", error, traceback)
        return self._record("fail", id, attempt, row)

    async def cancel_attempt(self, id: int, attempt: int) -> bool:
        await self._enter("cancel")
        row = self._fenced(id, attempt, completed=False)
        if row is not None:
            self._finish(row, Status.CANCELLED, "cancel requested")
            self._note(row, "cancelled")
        return self._record("cancel", id, attempt, row)

    async def release(self, id: int, attempt: int) -> bool:
        await self._enter("release")
        row = self._fenced(id, attempt, completed=False)
        if row is not None:
            self._note(row, "released")
            self._requeue(row)
        return self._record("release", id, attempt, row)

    async def retry_later(
        self, id: int, attempt: int, delay: float, error: str, traceback: str | None = None
    ) -> bool:
        await self._enter("retry_later")
        row = self._fenced(id, attempt, completed=False)
        if row is not None:
            self._note(row, "retried", error, traceback)
            row.error = error
            row.traceback = traceback if traceback is not None else row.traceback
            row.failures += 1
            self._requeue(row, run_after=self.now() + dt.timedelta(seconds=delay))
        return self._record("retry_later", id, attempt, row)

    async def recover_expired_leases(self, max_stalls: int, *, batch: int = 100) -> list[Recovered]:
        await self._enter("recover_expired_leases")
        now = self.now()
        expired = sorted(
            (
                r
                for r in self._rows.values()
                if r.status is Status.RUNNING
                and r.lease_expires_at is not None
                and r.lease_expires_at < now
            ),
            key=lambda r: (r.lease_expires_at, r.id),
        )
        recovered = []
        for row in expired:
            stalled_on = row.worker_id
            if row.completed_at is not None:
                # Its success was committed: finished as such, no stall; its Worker
                # stays on the row, which its history reads as `succeeded`.
                self._finish(row, Status.SUCCEEDED)
            else:
                self._note(row, "stalled", "lease expired")
                row.stalls += 1
                if row.stalls >= max_stalls:
                    self._finish(row, Status.FAILED, "stalled")
                elif row.cancel_requested:
                    self._finish(row, Status.CANCELLED, "cancel requested")
                else:
                    self._requeue(row)
                row.worker_id = None
            recovered.append(
                Recovered(
                    id=row.id,
                    kind=row.kind,
                    scope=row.scope,
                    attempt=row.attempt,
                    stalls=row.stalls,
                    status=row.status,
                    reason=row.reason,
                    worker_id=stalled_on,
                )
            )
        return recovered

    @asynccontextmanager
    async def fenced_transaction(
        self,
        id: int,
        attempt: int,
        *,
        until: Callable[[], float] | None = None,
        server_timeout: float | None = None,
    ) -> AsyncIterator[MemoryFencedTransaction]:
        """Fenced like PostgreSQL's: Lost unless the attempt owns its Running item, at
        the start and again at the commit; SelfStopped once `trio.current_time()` has
        reached `until()`, at the start (nothing opened) and as the last thing before
        the commit (nothing applied). A completing commit notes the attempt's success
        (`completed_at`); the row stays Running until it is finished. Nothing here
        outlives its caller, so `server_timeout` is only noted (`server_timeouts`)."""
        self.server_timeouts.append(server_timeout)
        _refuse_past(until, id, attempt)
        await self._enter("fenced_transaction")
        if until is not None and trio.current_time() >= until():
            raise Lost(f"item {id} attempt {attempt} is past its self-stop deadline")
        if self._fenced(id, attempt) is None:
            raise Lost(f"item {id} attempt {attempt} no longer owns the item; nothing written")
        tx = MemoryFencedTransaction(id, attempt, store=self)
        yield tx
        await self._enter("commit")
        row = self._fenced(id, attempt)
        if row is None:  # pragma: no cover - PostgreSQL's row lock makes this impossible
            raise Lost(f"item {id} attempt {attempt} lost its item before the commit")
        _refuse_past(until, id, attempt)
        # The commit: nothing checkpoints from here on, so it applies whole.
        self._statements.extend(tx._statements)
        for new_id, request in tx._enqueued:
            self._insert(request, self.now(), id=new_id)
        self._commit_waiting(new_id for new_id, _ in tx._enqueued)
        if tx.completes:
            row.completed_at = row.completed_at or self.now()
            if tx.result_json is not None:
                row.result = _json_roundtrip(tx.result_json)
            self._record("complete_in_transaction", id, attempt, row)

    async def held_leases(self, *, batch: int = 100) -> list[HeldLease]:
        """None: no session holds a row here (recovery takes every expired item)."""
        await self._enter("held_leases")
        return []

    async def settle_noted_scopes(self, *, batch: int = 100) -> int:
        """Nothing to settle: the in-memory claim reads the lines themselves."""
        await self._enter("settle_noted_scopes")
        return 0

    async def repair_heads(self, *, batch: int = 1000) -> list[str]:
        await self._enter("repair_heads")
        return []

    async def advertise(self, worker: WorkerInfo) -> None:
        await self._enter("advertise")
        now = self.now()
        held = self._advertised.get(worker.id)
        started, seen, stopped = self._seen.get(worker.id, (now, now, None))
        other = held is not None and (held.host, held.pid) != (worker.host, worker.pid)
        gone = held is not None and held.host == worker.host and process_gone(held.pid)
        age = (now - seen).total_seconds()
        if (
            held is not None
            and other
            and stopped is None
            and age < alive_window(held.advertise_every)
            and not gone
        ):
            raise id_in_use(worker.id, held.host, held.pid, age)
        if held is None or other or stopped is not None:
            started = now  # a Worker back under its id starts afresh
        self.workers[worker.id] = worker
        self._seen[worker.id] = (started, now, None)
        self._advertised[worker.id] = worker

    async def worker_stopped(self, worker_id: str) -> None:
        await self._enter("worker_stopped")
        self.workers.pop(worker_id, None)
        if worker_id in self._seen:
            started, seen, _ = self._seen[worker_id]
            self._seen[worker_id] = (started, seen, self.now())

    async def cancel(self, id: int) -> CancelOutcome:
        await self._enter("request_cancel")
        row = self._rows.get(id)
        if row is None:
            return CancelOutcome.NOT_FOUND
        if row.status in (Status.QUEUED, Status.WAITING):
            row.cancel_requested = True
            self._finish(row, Status.CANCELLED, "cancelled before it ran")
            return CancelOutcome.CANCELLED
        if row.status is Status.RUNNING and row.completed_at is None:
            row.cancel_requested = True
            return CancelOutcome.REQUESTED
        return CancelOutcome.ALREADY_FINISHED  # its success committed, if still Running

    async def delete_finished(
        self,
        older_than: dt.timedelta,
        *,
        statuses: Sequence[Status] = FINISHED,
        batch: int = 1000,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> int:
        if not statuses or any(not s.is_terminal for s in statuses):
            raise ValueError("delete_finished deletes finished items only")
        cutoff = self.now() - older_than
        doomed = sorted(
            (
                r
                for r in self._rows.values()
                if r.status in statuses
                and r.finished_at is not None
                and r.finished_at < cutoff
                and not self._needed(r.id)
            ),
            key=lambda r: (r.finished_at, r.id),
        )
        for start in range(0, len(doomed) + 1, batch):
            await self._enter("delete_finished")
            chunk = doomed[start : start + batch]
            for row in chunk:
                del self._rows[row.id]
                self._attempts.pop(row.id, None)
                self._steps.pop(row.id, None)
                self._deps.forget(row.id)
            if on_batch is not None:
                on_batch(len(chunk), 0.0)
            if len(chunk) < batch:
                break
        return len(doomed)

    # -- pauses, retries, quiesce ---------------------------------------------------

    async def pause(self, *, kind: str | None = None, scope: str | None = None) -> bool:
        target = _pause_key(kind, scope)
        await self._enter("pause")
        if target in self._pauses:
            return False
        self._pauses[target] = self.now()
        return True

    async def resume(self, *, kind: str | None = None, scope: str | None = None) -> bool:
        target = _pause_key(kind, scope)
        await self._enter("resume")
        if self._pauses.pop(target, None) is None:
            return False
        if kind is not None:
            self._notify(None)
        else:
            self._notify_if_freed(scope)
        return True

    async def pauses(self) -> list[Pause]:
        await self._enter("pauses")
        return [
            Pause(name if what == "kind" else None, name if what == "scope" else None, at)
            for (what, name), at in sorted(self._pauses.items(), key=lambda p: p[1])
        ]

    async def retry(self, ids: Sequence[int]) -> list[int]:
        await self._enter("retry")
        retried = []
        for id in sorted(set(ids)):
            row = self._rows.get(id)
            if row is None or row.status not in (Status.FAILED, Status.CANCELLED):
                continue
            if self._queued_with(row.dedup_key) is not None:
                continue
            # Queued, or Waiting again while a parent has not Succeeded (settled below).
            ready = verdict(self._parent_states(id)).status is Status.QUEUED
            row.status = Status.QUEUED if ready else Status.WAITING
            row.run_after = self.now()
            row.finished_at = None
            row.failures = row.stalls = 0
            row.cancel_requested = False
            row.worker_id = None
            row.lease_expires_at = None
            # In the history, as PostgreSQL notes it: an attempt number of its own.
            row.reason = f"retried by an operator after attempt {row.attempt}"
            row.attempt += 1
            self._attempts.setdefault(row.id, {})[row.attempt] = AttemptRecord(
                row.attempt, None, None, self.now(), "operator-retry"
            )
            retried.append(id)
            self._notify_if_freed(row.scope)
        self._commit_waiting(retried)
        return retried

    async def failed_items(
        self, *, kind: str | None = None, since: dt.datetime | None = None
    ) -> list[int]:
        await self._enter("failed_items")
        rows = [
            r
            for r in self._rows.values()
            if r.status is Status.FAILED
            and (kind is None or r.kind == kind)
            and r.finished_at is not None
            and (since is None or r.finished_at >= since)
        ]
        return [r.id for r in sorted(rows, key=lambda r: (r.finished_at, r.id))]

    async def scope_holder(self, scope: str) -> tuple[ScopeHolder | None, bool]:
        holders, heads = await self.scope_holders(scope)
        return (holders[0] if holders else None), heads

    # -- limits ----------------------------------------------------------------------

    async def scope_holders(self, scope: str) -> tuple[list[ScopeHolder], bool]:
        await self._enter("scope_holder")
        holders = []
        running = sorted(
            (r for r in self._rows.values() if r.scope == scope and r.status is Status.RUNNING),
            key=lambda r: (r.started_at, r.id),
        )
        for slot, r in enumerate(running, start=1):
            assert r.lease_expires_at is not None
            left = (r.lease_expires_at - self.now()).total_seconds()
            holders.append(
                ScopeHolder(r.id, r.attempt, r.kind, r.worker_id, r.cancel_requested, left, slot)
            )
        return holders, False

    async def set_limit(
        self,
        *,
        kind: str | None = None,
        scope: str | None = None,
        running: int | None = None,
        rate: Rate | str | None = None,
    ) -> Limit:
        change = validate_limit(kind, scope, running, rate)
        await self._enter("set_limit")
        limit = self._limits.set(change, self.now())
        self._notify(None)
        return limit

    async def declare_limit(self, declared: LimitChange) -> Declared:
        await self._enter("declare_limit")
        assert declared.kind is not None and declared.scope is None
        before = self._limits.held(declared.kind, None)
        wanted = (declared.running, declared.rate)
        if before == wanted:
            return Declared(declared, before, written=False)
        self._limits.clear(declared.kind, None)
        self._limits.set(declared, self.now())
        self._notify(None)
        return Declared(declared, before, written=True)

    async def clear_limit(self, *, kind: str | None = None, scope: str | None = None) -> bool:
        kind, scope = limit_target(kind, scope)
        await self._enter("clear_limit")
        cleared = self._limits.clear(kind, scope)
        if cleared:
            self._notify(None)
        return cleared

    async def limits(self) -> list[Limit]:
        await self._enter("limits")
        now = self.now()
        own = {name for (what, name), lim in self._limits.all() if what == "scope" and lim.running}
        out = []
        for key, limit in self._limits.all():
            what, name = key
            if key == DEFAULT:
                in_use = sum(
                    1
                    for r in self._rows.values()
                    if r.status is Status.RUNNING and r.scope is not None and r.scope not in own
                )
            else:
                in_use = self._running(**{what: name})
            due = sum(
                1
                for r in self._rows.values()
                if r.status is Status.QUEUED
                and r.run_after <= now
                and (r.kind if what == "kind" else r.scope) == name
            )
            out.append(self._limits.with_usage(key, limit, in_use, due, now))
        return out

    # -- schedules ----------------------------------------------------------------------

    async def sync_schedules(self, schedules: Sequence[Schedule]) -> None:
        await self._enter("sync_schedules")
        now = self.now()
        for schedule in schedules:
            known = self._schedules.get(schedule.name)
            fresh = known is None or self._specs[schedule.name] != schedule.spec
            self._schedules[schedule.name] = ScheduleState(
                schedule.name,
                schedule.kind,
                schedule.scope,
                schedule.spec,
                first_due(schedule, now) if fresh or known is None else known.next_due,
                None if known is None else known.last_due,
                None if known is None else known.last_item,
            )
            self._specs[schedule.name] = schedule.spec

    async def fire_schedules(
        self, schedules: Sequence[Schedule]
    ) -> tuple[list[Fired], float | None]:
        await self._enter("fire_schedules")
        now = self.now()
        carried = [
            s for s in schedules if s.name in self._schedules and self._specs[s.name] == s.spec
        ]
        fired = []
        for schedule in sorted(carried, key=lambda s: self._schedules[s.name].next_due):
            state = self._schedules[schedule.name]
            due, following = plan(schedule, state.next_due, now)
            if due is None:
                continue
            enqueued = self._insert(schedule_request(schedule, due, now), now)
            self._schedules[schedule.name] = attrs.evolve(
                state, next_due=following, last_due=due, last_item=enqueued.id
            )
            fired.append(Fired(schedule.name, due, enqueued.id, enqueued.deduplicated))
        waits = [(self._schedules[s.name].next_due - now).total_seconds() for s in carried]
        return fired, max(0.0, min(waits)) if waits else None

    async def schedules(self) -> list[ScheduleState]:
        await self._enter("schedules")
        return sorted(self._schedules.values(), key=lambda s: s.name)

    async def attempts(self, id: int) -> list[AttemptRecord]:
        await self._enter("attempts")
        notes = dict(self._attempts.get(id, {}))
        row = self._rows.get(id)
        current = row is not None and row.attempt > 0 and row.attempt not in notes
        if row is not None and current and row.status in (Status.SUCCEEDED, Status.RUNNING):
            outcome = "succeeded" if row.status is Status.SUCCEEDED else "running"
            notes[row.attempt] = AttemptRecord(
                row.attempt, row.worker_id, row.started_at, row.finished_at, outcome
            )
        return [notes[a] for a in sorted(notes)]

    async def get_item(self, id: int) -> ItemState | None:
        await self._enter("get_item")
        row = self._rows.get(id)
        if row is None:
            return None
        return ItemState(
            **{k: copy.deepcopy(v) for k, v in attrs.asdict(row, recurse=False).items()}
        )

    async def listen(
        self,
        on_notify: NotifyCallback,
        *,
        on_settle: NotifyCallback | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
        check_every: float = 30.0,
    ) -> None:
        self._listeners.append(on_notify)
        try:
            task_status.started()
            await trio.sleep_forever()
        finally:
            self._listeners.remove(on_notify)

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(race_losses=0, dedup_hits=self._dedup_hits, timeouts=0)

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        _no_transactions(True)
        raise AssertionError("unreachable")  # pragma: no cover

    async def show(self, id: int) -> ItemDetails | None:
        item = await self.get_item(id)
        if item is None:
            return None
        steps = copy.deepcopy(list(self._steps.get(id, {}).values()))
        parents = [Relative(r.id, r.kind, r.status) for r in self._parents(id)]
        waiting: list[str] = []
        if item.status is Status.QUEUED:
            waiting = waiting_reasons(self._wait_facts(self._rows[id]), item.kind, item.scope)
        elif item.status is Status.WAITING:
            waiting = parents_waited_for(parents)
        return ItemDetails(
            item,
            await self.attempts(id),
            steps,
            waiting,
            parents=parents,
            children=[
                Relative(r.id, r.kind, r.status)
                for r in map(self._rows.__getitem__, self._deps.children(id)[:SHOWN_CHILDREN])
            ],
        )

    def _alive(self, worker: WorkerInfo, now: dt.datetime) -> bool:
        """Whether an advertised Worker is alive, as `workers` says on PostgreSQL."""
        _, seen, stopped = self._seen[worker.id]
        return stopped is None and (now - seen).total_seconds() < alive_window(
            worker.advertise_every
        )

    def _wait_facts(self, row: _Row) -> WaitFacts:
        """As PostgreSQL's `wait_facts`, from the rows, pauses, limits and Workers."""
        now = self.now()

        def serves(w: WorkerInfo) -> bool:
            where = w.unscoped if row.scope is None else w.scopes is None or row.scope in w.scopes
            return self._alive(w, now) and row.kind in w.kinds and where

        ahead = sum(
            1
            for r in self._rows.values()
            if r.scope is not None
            and r.scope == row.scope
            and r.status is Status.QUEUED
            and r.run_after <= now
            and r.id != row.id
            and r.key < row.key
        )
        rate_open = self._limits.rate_open
        return WaitFacts(
            due_in=(row.run_after - now).total_seconds(),
            kind_paused=("kind", row.kind) in self._pauses,
            scope_paused=row.scope is not None and ("scope", row.scope) in self._pauses,
            served=any(serves(w) for w in self._advertised.values()),
            scope_running=0 if row.scope is None else self._running(scope=row.scope),
            scope_limit=1 if row.scope is None else self._limits.scope_limit(row.scope),
            kind_running=self._running(kind=row.kind),
            kind_limit=self._limits.kind_limit(row.kind),
            rate_spent=not rate_open(("kind", row.kind), now)
            or (row.scope is not None and not rate_open(("scope", row.scope), now)),
            ahead=min(ahead, 10_000),
        )

    async def result(
        self,
        id: int,
        *,
        timeout: float | None = None,  # noqa: ASYNC109  issue 34 names it, as Client does
    ) -> Any:
        """As PostgreSQL's: wait until item `id` has ended; its result, or
        ItemNotSucceeded; UnknownItem; TimeoutError after `timeout` seconds."""

        async def read() -> tuple[bool, Any]:
            await self._enter("result_state")
            row = self._rows.get(id)
            if row is None:
                raise UnknownItem(f"no item {id} (never enqueued, or deleted by retention)")
            result = copy.deepcopy(row.result)
            return finished_result(id, row.status.value, result, row.error, row.reason)

        return await wait_result(read, id, timeout, lambda: self._ended)

    async def queue_counts(self) -> QueueCounts:
        await self._enter("queue_counts")
        rows = collections.Counter((r.kind, r.status.value) for r in self._rows.values())
        counts = counts_by_kind(
            {"kind": k, "status": s, "n": n} for (k, s), n in sorted(rows.items())
        )
        busy = len({r.scope for r in self._rows.values() if r.status is Status.RUNNING and r.scope})
        return QueueCounts(counts, busy)

    async def status(self, *, failures: int = 10) -> QueueStatus:
        """As PostgreSQL's: the same records from the rows in memory."""
        now = self.now()
        rows = sorted(self._rows.values(), key=lambda r: r.id)
        running = sorted((r for r in rows if r.status is Status.RUNNING),
                         key=lambda r: (r.started_at or now, r.id))  # fmt: skip
        failed = sorted((r for r in rows if r.status is Status.FAILED),
                        key=lambda r: r.finished_at or now, reverse=True)[:failures]  # fmt: skip
        workers = [
            WorkerState(
                id=w.id, host=w.host, pid=w.pid, started_at=started, last_seen=seen,
                stopped_at=stopped, kinds=w.kinds, scopes=w.scopes, unscoped=w.unscoped,
                concurrency=w.concurrency, alive=self._alive(w, now),
            )
            for w in self._advertised.values()
            for started, seen, stopped in [self._seen[w.id]]
        ]  # fmt: skip
        workers.sort(key=lambda w: (w.stopped_at is not None, -w.last_seen.timestamp()))
        served = {k for w in workers if w.alive for k in w.kinds}
        queued = collections.Counter(r.kind for r in rows if r.status is Status.QUEUED)
        return QueueStatus(
            counts=await self.queue_counts(),
            running=[
                RunningItem(
                    r.id,
                    r.kind,
                    r.scope,
                    r.attempt,
                    r.worker_id,
                    r.started_at,
                    ((r.lease_expires_at or now) - now).total_seconds(),
                )
                for r in running
            ],
            recent_failures=[
                Failure(r.id, r.kind, r.scope, r.attempt, r.finished_at, r.reason, r.error)
                for r in failed
            ],
            workers=workers,
            unserved_kinds={k: n for k, n in sorted(queued.items()) if k not in served},
            schedules=await self.schedules(),
            pauses=await self.pauses(),
            limits=await self.limits(),
        )

    # -- test helpers -----------------------------------------------------------------

    def expire_lease(self, id: int) -> None:
        """Make a Running item's lease run out now (as if its Worker went quiet)."""
        row = self._rows[id]
        row.lease_expires_at = self.now() - dt.timedelta(seconds=1)

    def items(self) -> list[ItemState]:
        """Every row, as get_item would read it (synchronous, for assertions)."""
        return [
            ItemState(**{k: copy.deepcopy(v) for k, v in attrs.asdict(r, recurse=False).items()})
            for r in sorted(self._rows.values(), key=lambda r: r.id)
        ]


def _refuse_past(until: Callable[[], float] | None, id: int, attempt: int) -> None:
    """Raise SelfStopped once the attempt's self-stop deadline `until()` has passed."""
    if until is not None and trio.current_time() >= until():
        raise SelfStopped(
            f"item {id} attempt {attempt}: its self-stop deadline has passed; nothing written"
            " (the item belongs to lease recovery)"
        )


def _pause_key(kind: str | None, scope: str | None) -> tuple[str, str]:
    kind, scope = pause_target(kind, scope)
    return ("kind", kind) if kind is not None else ("scope", scope)  # type: ignore[return-value]


def _json_roundtrip(text: str) -> Any:
    return json.loads(text)


def _by_id(item: WorkItem) -> int:
    return item.id
