"""Each client operation written once, with no I/O: what to send and what the rows mean.

An operation is a generator that yields `Query` (a statement of queries.sql by name,
and its parameters) and is sent back that statement's rows, as dicts; what it returns
is the operation's result. A driver (drive.py) runs it on a connection: the Trio
store's, `Client`'s (psycopg's sync API) or `AsyncClient`'s (psycopg's asyncio API),
each on its own connections or in the caller's transaction. So the Trio store and both
clients validate the same way, send the same statements and read the rows the same
way: there is no second copy of an operation to drift (psycopg's own
`psycopg/generators.py` keeps I/O apart from logic the same way).

An `Operation` checks its input when it is made (a bad one raises InvalidWorkItem and
nothing is sent); its `steps()` makes a fresh generator, so a driver can run it again
after a deadlock or a serialization failure on its own connection.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Generator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import attrs

from trioworker._core.errors import InvalidWorkItem, StoreError, UnknownItem
from trioworker._core.jsontext import UndecodableValue, loads_or_mark
from trioworker._core.limits import Declared, Limit, LimitChange, Rate
from trioworker._core.model import (
    AttemptRecord,
    CancelOutcome,
    Enqueued,
    ItemState,
    NewItem,
    Pause,
    ScheduleState,
    ScopeHolder,
    Status,
    StepRecord,
    WorkItem,
)
from trioworker._core.validation import (
    EnqueueRequest,
    pause_target,
    validate_enqueue,
    validate_many,
)
from trioworker._store.reads import (
    ALIVE_BEATS,
    ALIVE_WITHIN,
    Failure,
    ItemDetails,
    QueueCounts,
    QueueStatus,
    Relative,
    RunningItem,
    WaitFacts,
    WorkerState,
    counts_by_kind,
    finished_result,
    parents_waited_for,
    waiting_reasons,
)
from trioworker._store.tracing import trace_context_or_current, with_current_trace

T = TypeVar("T")
Rows = list[dict[str, Any]]

#: An enqueue whose dedup key keeps changing hands (taken, then claimed, then taken
#: again) gives up after this many rounds.
ENQUEUE_ROUNDS = 5


@attrs.frozen
class Query:
    """One statement to run: its name in queries.sql and its parameters."""

    name: str
    params: Mapping[str, Any]
    #: Its rows are read whatever they hold: a time Python cannot hold comes back as an
    #: UndecodableValue, not as an error for the whole statement (as_stored.py).
    as_stored: bool = False


#: The steps of an operation: yields queries, is sent each one's rows, returns a result.
Steps = Generator[Query, Rows, T]


@attrs.frozen
class Operation(Generic[T]):
    """An operation whose input has been checked, ready for a driver to run."""

    name: str
    steps: Callable[[], Steps[T]]
    #: Its statements must commit together: a driver runs them in one transaction (a
    #: savepoint inside the caller's).
    atomic: bool = False


# -- enqueue ---------------------------------------------------------------------------


def enqueue(
    kind: str,
    *,
    scope: str | None = None,
    payload: Any = None,
    dedup_key: str | None = None,
    run_after: dt.datetime | dt.timedelta | None = None,
    priority: int = 0,
    trace_context: Mapping[str, str] | None = None,
    known_kinds: Collection[str] | None = None,
    after: Sequence[int] | None = None,
) -> Operation[Enqueued]:
    """Queue an item (merged onto the Queued item holding its dedup key, if any), or,
    `after` other items, store it Waiting until they have all Succeeded.
    `trace_context`: None takes the current span's, if the otel extra is installed."""
    request = validate_enqueue(
        kind,
        scope,
        payload,
        dedup_key,
        run_after,
        priority=priority,
        now=dt.datetime.now(dt.UTC),
        known_kinds=known_kinds,
        trace_context=trace_context_or_current(trace_context),
        after=after,
    )
    return Operation("enqueue", lambda: enqueue_steps(request))


def enqueue_steps(request: EnqueueRequest) -> Steps[Enqueued]:
    """Insert one checked request; with its dedup key taken, the Queued holder (it may
    be claimed in between, in which case the insert goes through next round)."""
    params = {
        "kind": request.kind,
        "scope": request.scope,
        "payload": request.payload_json,
        "priority": request.priority,
        "dedup_key": request.dedup_key,
        "run_at": request.run_at,
        "delay": request.delay,
        "trace_context": request.trace_context_json,
        "parents": list(request.after) or None,
    }
    yield from _check_parents_exist(request.after)
    for _ in range(ENQUEUE_ROUNDS):
        rows = yield Query("enqueue", params)
        if rows:
            return Enqueued(id=rows[0]["id"], deduplicated=False)
        rows = yield Query("queued_with_dedup_key", params)
        if rows:
            return Enqueued(id=rows[0]["id"], deduplicated=True)
    raise StoreError("enqueue: the dedup key kept changing hands; try again")


def enqueue_many(
    items: Sequence[NewItem], *, known_kinds: Collection[str] | None = None
) -> Operation[list[Enqueued]]:
    """Queue many items in one statement, all or none: each is checked first, and a bad
    one raises InvalidWorkItem naming its index. Results in order; an item whose dedup
    key a Queued item (or an earlier one of the batch) holds is merged onto it."""
    requests = validate_many(
        with_current_trace(items), now=dt.datetime.now(dt.UTC), known_kinds=known_kinds
    )
    return Operation("enqueue_many", lambda: _enqueue_many_steps(requests))


def _enqueue_many_steps(requests: Sequence[EnqueueRequest]) -> Steps[list[Enqueued]]:
    if not requests:
        return []
    unknown = yield from _unknown_items(sorted({id for r in requests for id in r.after}))
    for index, request in enumerate(requests):
        if missing := [id for id in request.after if id in unknown]:
            raise InvalidWorkItem.of_item(index, _no_such_parents(missing))
    rows = yield Query(
        "enqueue_many",
        {
            "kinds": [r.kind for r in requests],
            "scopes": [r.scope for r in requests],
            "payloads": [r.payload_json for r in requests],
            "priorities": [r.priority for r in requests],
            "dedup_keys": [r.dedup_key for r in requests],
            "run_ats": [r.run_at for r in requests],
            "delays": [r.delay for r in requests],
            "trace_contexts": [r.trace_context_json for r in requests],
            "parent_lists": [_array_text(r.after) for r in requests],
        },
    )
    inserted = [(row["id"], row["dedup_key"]) for row in rows]
    merged = match_inserted([r.dedup_key for r in requests], inserted)
    keys = sorted({k for k, e in merged if e is None and k is not None})
    rows = (yield Query("queued_with_dedup_keys", {"dedup_keys": keys})) if keys else []
    holders: dict[str, int] = {row["dedup_key"]: row["id"] for row in rows}
    results = []
    for index, request in enumerate(requests):
        key, result = merged[index]
        if result is None:
            assert key is not None
            if key in holders:
                result = Enqueued(id=holders[key], deduplicated=True)
            else:  # the holder was claimed in between: insert it after all
                result = yield from enqueue_steps(request)
                holders[key] = result.id
        results.append(result)
    return results


def _check_parents_exist(after: Sequence[int]) -> Steps[None]:
    """InvalidWorkItem naming the ids of `after` that name no item, before anything is
    written (so a caller's transaction goes on). The table refuses them too."""
    if unknown := (yield from _unknown_items(after)):
        raise InvalidWorkItem(_no_such_parents(sorted(unknown)))


def _unknown_items(ids: Sequence[int]) -> Steps[set[int]]:
    """Which of `ids` name no item."""
    if not ids:
        return set()
    rows = yield Query("unknown_items", {"ids": list(ids)})
    return {row["id"] for row in rows}


def _no_such_parents(ids: Sequence[int]) -> str:
    return "after names items that do not exist: " + ", ".join(map(str, ids))


def _array_text(ids: Sequence[int]) -> str | None:
    """An array's text for PostgreSQL ('{1,2}'); None for none."""
    return "{" + ",".join(map(str, ids)) + "}" if ids else None


def match_inserted(
    keys: Sequence[str | None], inserted: Sequence[tuple[int, str | None]]
) -> list[tuple[str | None, Enqueued | None]]:
    """Pair a batch's dedup keys with the rows its INSERT returned (in the batch's order;
    a row is skipped when its dedup key is taken). For each item: its key and what it
    became, None where a Queued item from before holds its key (looked up next)."""
    rows = iter(inserted)
    pending = next(rows, None)
    first_with: dict[str, int] = {}
    out: list[tuple[str | None, Enqueued | None]] = []
    for key in keys:
        if key is not None and key in first_with:
            out.append((key, Enqueued(id=first_with[key], deduplicated=True)))
        elif pending is not None and pending[1] == key:
            out.append((key, Enqueued(id=pending[0], deduplicated=False)))
            if key is not None:
                first_with[key] = pending[0]
            pending = next(rows, None)
        elif key is None:
            raise StoreError("enqueue_many: the inserted rows came back out of order")
        else:
            out.append((key, None))
    if pending is not None:
        raise StoreError("enqueue_many: more rows came back than were asked for")
    return out


# -- cancel, retry, pause --------------------------------------------------------------


def cancel(id: int) -> Operation[CancelOutcome]:
    """Cancel a Queued item now, or ask a Running one to stop at its next heartbeat."""
    return Operation("cancel", lambda: _cancel_steps(id))


def _cancel_steps(id: int) -> Steps[CancelOutcome]:
    rows = yield Query("request_cancel", {"id": id})
    status = rows[0]["status"]
    if status == Status.CANCELLED.value:
        return CancelOutcome.CANCELLED
    if status == Status.RUNNING.value:
        return CancelOutcome.REQUESTED
    found = yield Query("status_of", {"id": id})
    return CancelOutcome.ALREADY_FINISHED if found else CancelOutcome.NOT_FOUND


def retry(ids: Sequence[int]) -> Operation[list[int]]:
    """Failed or Cancelled items back to Queued with a fresh attempt budget (their
    history kept), due now; the ids retried. Others (not finished, succeeded, or whose
    dedup key a Queued item holds) are left as they are. Each retry is noted in the
    item's history (`operator-retry`, an attempt number of its own), by the same
    statement."""
    params = {"ids": sorted(set(ids))}
    return Operation("retry", lambda: _column("retry_items", params, "id"))


def failed_items(
    *, kind: str | None = None, since: dt.datetime | None = None
) -> Operation[list[int]]:
    """Ids of Failed items (of `kind`) that finished at or after `since`, oldest first."""
    params = {"kind": kind, "since": since or dt.datetime.min.replace(tzinfo=dt.UTC)}
    return Operation("failed_items", lambda: _column("failed_items", params, "id"))


def pause(*, kind: str | None = None, scope: str | None = None) -> Operation[bool]:
    """Pause a kind or a scope: its Queued items are not claimed (Running ones go on).
    False: it was paused already."""
    kind, scope = pause_target(kind, scope)
    params = {"kind": kind, "scope": scope}
    return Operation("pause", lambda: _changed("pause", params))


def resume(*, kind: str | None = None, scope: str | None = None) -> Operation[bool]:
    """Lift a pause; False: it was not paused."""
    kind, scope = pause_target(kind, scope)
    params = {"kind": kind, "scope": scope}
    return Operation("resume", lambda: _changed("resume", params))


def pauses() -> Operation[list[Pause]]:
    return Operation("pauses", lambda: _each("pauses", Pause))


# -- reads -----------------------------------------------------------------------------


def get_item(id: int) -> Operation[ItemState | None]:
    return Operation("get_item", lambda: _get_item_steps(id))


def _get_item_steps(id: int) -> Steps[ItemState | None]:
    rows = yield Query("get_item", {"id": id}, as_stored=True)
    if not rows:
        return None
    row = decoded(rows[0])
    return ItemState(
        **{**row, "status": Status(row["status"]), "result": loads_or_mark(row.get("result"))}
    )


def attempts(id: int) -> Operation[list[AttemptRecord]]:
    """How each attempt of item `id` ended (its last 20 that did not succeed, and the
    current one if it is running or succeeded), oldest first."""
    return Operation("attempts", lambda: _attempts_steps(id))


def show(id: int) -> Operation[ItemDetails | None]:
    """Item `id` and how its attempts ended; None: no such item."""
    return Operation("show", lambda: _show_steps(id))


def _show_steps(id: int) -> Steps[ItemDetails | None]:
    item = yield from _get_item_steps(id)
    if item is None:
        return None
    history = yield from _attempts_steps(id)
    steps = yield from _steps_steps(id)
    waiting: list[str] = []
    if item.status is Status.QUEUED:
        params = {"id": id, "alive_beats": ALIVE_BEATS, "alive_within": ALIVE_WITHIN}
        rows = yield Query("wait_facts", params)
        if rows:  # (none if it left Queued in between: nothing to say)
            waiting = waiting_reasons(WaitFacts(**rows[0]), item.kind, item.scope)
    family = yield Query("family", {"id": id})
    relatives = {
        relation: [
            Relative(row["id"], row["kind"], Status(row["status"]))
            for row in family
            if row["relation"] == relation
        ]
        for relation in ("parent", "child")
    }
    if item.status is Status.WAITING:
        waiting = parents_waited_for(relatives["parent"])
    return ItemDetails(
        item, history, steps, waiting, parents=relatives["parent"], children=relatives["child"]
    )


def _steps_steps(id: int) -> Steps[list[StepRecord]]:
    """Item `id`'s recorded steps (`ctx.step`), in the order they were recorded."""
    rows = yield Query("steps", {"id": id}, as_stored=True)
    return [StepRecord(**{**row, "result": loads_or_mark(row.get("result"))}) for row in rows]


def result_state(id: int) -> Operation[tuple[bool, Any]]:
    """Whether item `id` has ended, and its result if it Succeeded (`finished_result`:
    ItemNotSucceeded if it ended otherwise, UnknownItem if there is no such item)."""
    return Operation("result_state", lambda: _result_state_steps(id))


def _result_state_steps(id: int) -> Steps[tuple[bool, Any]]:
    rows = yield Query("result_state", {"id": id})
    if not rows:
        raise UnknownItem(f"no item {id} (never enqueued, or deleted by retention)")
    row = rows[0]
    return finished_result(
        id, row["status"], loads_or_mark(row["result"]), row["error"], row["reason"]
    )


def _attempts_steps(id: int) -> Steps[list[AttemptRecord]]:
    rows = yield Query("attempts", {"id": id}, as_stored=True)
    return [AttemptRecord(**row) for row in rows]


def queue_counts() -> Operation[QueueCounts]:
    return Operation("queue_counts", _queue_counts_steps)


def _queue_counts_steps() -> Steps[QueueCounts]:
    counts = yield Query("counts_by_kind_and_status", {})
    busy = yield Query("busy_scopes", {})
    return QueueCounts(counts_by_kind(counts), int(busy[0]["n"]))


def schedules() -> Operation[list[ScheduleState]]:
    return Operation("schedules", lambda: _each("schedules", ScheduleState))


def status(*, failures: int = 10) -> Operation[QueueStatus]:
    """What `status` shows: counts, Running items, the latest `failures` failures,
    Workers, Queued kinds no live Worker serves, schedules and pauses."""
    return Operation("status", lambda: _status_steps(failures))


def _status_steps(failures: int) -> Steps[QueueStatus]:
    alive = {"alive_beats": ALIVE_BEATS, "alive_within": ALIVE_WITHIN}
    workers = yield Query("workers", alive)
    failed = yield Query("recent_failures", {"limit": failures})
    unserved = yield Query("unserved_kinds", alive)
    counts = yield from _queue_counts_steps()
    running = yield Query("running_items", {})
    return QueueStatus(
        counts=counts,
        running=[RunningItem(**r) for r in running],
        recent_failures=[Failure(**r) for r in failed],
        workers=[
            WorkerState(**{**w, "kinds": tuple(w["kinds"]), "scopes": _tuple(w["scopes"])})
            for w in workers
        ],
        unserved_kinds={r["kind"]: r["n"] for r in unserved},
        schedules=(yield from _each("schedules", ScheduleState)),
        pauses=(yield from _each("pauses", Pause)),
        limits=[limit_of(row) for row in (yield Query("limits", {}))],
    )


def scope_holder(scope: str) -> Operation[tuple[ScopeHolder | None, bool]]:
    """The scope's Running item (None: none), and whether it still has a head."""
    return Operation("scope_holder", lambda: _scope_holder_steps(scope))


def _scope_holder_steps(scope: str) -> Steps[tuple[ScopeHolder | None, bool]]:
    rows = yield Query("scope_holder", {"scope": scope})
    row = rows[0]
    holder = None if row["id"] is None else ScopeHolder(**{k: row[k] for k in row if k != "heads"})
    return holder, bool(row["heads"])


# -- small parts -----------------------------------------------------------------------


def limit_of(row: dict[str, Any]) -> Limit:
    """A row of the `limits` or `set_limit` query as a Limit."""
    row = dict(row)
    rate, per = row.pop("rate"), row.pop("per")
    return Limit(**row, rate=None if rate is None else Rate(rate, per))


def declared_of(declared: LimitChange, row: Mapping[str, Any]) -> Declared:
    """The `declare_limit` query's row as a Declared."""
    running, rate, per = row["running"], row["rate"], row["per"]
    before = None
    if running is not None or rate is not None:
        before = (running, None if rate is None else Rate(rate, per))
    return Declared(declared, before, bool(row["written"]))


def _column(name: str, params: Mapping[str, Any], column: str) -> Steps[list[Any]]:
    rows = yield Query(name, params)
    return [row[column] for row in rows]


def _changed(name: str, params: Mapping[str, Any]) -> Steps[bool]:
    rows = yield Query(name, params)
    return bool(rows[0]["changed"])


def _each(
    name: str, make: Callable[..., T], params: Mapping[str, Any] | None = None
) -> Steps[list[T]]:
    rows = yield Query(name, params or {})
    return [make(**row) for row in rows]


def _tuple(values: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)


def decoded(row: dict[str, Any]) -> dict[str, Any]:
    """A row read with its payload and trace context as text, those decoded: a payload
    Python cannot decode becomes an UndecodableValue (a claimed one fails its item), a
    trace context that cannot be decoded is dropped."""
    trace_context = loads_or_mark(row["trace_context"])
    return {
        **row,
        "payload": loads_or_mark(row["payload"]),
        "trace_context": None if isinstance(trace_context, UndecodableValue) else trace_context,
    }


def claimed_item(row: dict[str, Any]) -> WorkItem:
    """A claimed row (read `as_stored`, its payload and trace context as text) as the
    Worker takes it. Decoded on its own, so nothing in it can fail the batch: a payload
    Python cannot decode stands as an UndecodableValue, and a column that could not be
    loaded (a time Python cannot hold) is named in `undecodable` and left None. The
    Worker fails such an item, through the same finish as any failure, fenced by its
    (id, attempt); the other items of the batch run."""
    values = decoded(row)
    if UndecodableValue not in map(type, values.values()):  # every value read: at once
        return WorkItem(**values)
    undecodable = tuple(
        (column, value.reason)
        for column, value in values.items()
        if column != "payload" and isinstance(value, UndecodableValue)
    )
    values.update((column, None) for column, _ in undecodable)
    return WorkItem(**values, undecodable=undecodable)
