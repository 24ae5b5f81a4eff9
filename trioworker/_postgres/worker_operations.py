"""The Worker's own store calls, as operations (operations.py's shape): the claim, the
heartbeats, the fenced finishes and requeues, the steps a handler reads, lease
recovery and the other passes of maintenance, the Worker's presence and its schedules
and limits. Each yields `Query` and is sent its rows; what it returns is the call's
result. The Trio store runs them by the same driver as the client operations
(drive.py, `PostgresStore._run`); a claim that loses a slot race is run again by the
driver, from a fresh `steps()`, under the store's retry policy (`again`).

Each is one statement, as these calls have always been, so none adds a round trip. A
call whose follow-up must not be run again with it (`complete_and_claim`'s
completions, the batches of lease recovery) is several operations, each its own call.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from trioworker._core.errors import StoreError
from trioworker._core.jsontext import loads_or_mark
from trioworker._core.limits import Declared, Limit, LimitChange
from trioworker._core.model import (
    Heartbeat,
    HeldLease,
    Recovered,
    ScopeHolder,
    Status,
    WorkerInfo,
    WorkItem,
)
from trioworker._core.schedule import Schedule, first_due
from trioworker._postgres.operations import (
    Operation,
    Query,
    Rows,
    Steps,
    claimed_item,
    declared_of,
    limit_of,
)
from trioworker._store.reads import ALIVE_BEATS, ALIVE_WITHIN, id_in_use

T = TypeVar("T")
Attempts = Sequence[tuple[int, int]]

# -- the claim -------------------------------------------------------------------------


def claim_params(
    worker_id: str,
    lease: float,
    limit: int,
    scopes: Sequence[str] | None,
    *,
    unscoped: bool,
    kinds: Sequence[str],
) -> dict[str, Any]:
    """A claim's parameters (`claim`, `finish_and_claim`); ValueError for a Worker that
    serves every scope but not unscoped items."""
    if scopes is None and not unscoped:
        raise ValueError("a Worker serving every scope serves unscoped items too")
    return {
        "worker_id": worker_id,
        "lease": lease,
        "limit": limit,
        "kinds": list(kinds),
        "scopes": None if scopes is None else list(scopes),
        "unscoped": unscoped,
    }


def claim(params: Mapping[str, Any]) -> Operation[list[WorkItem]]:
    """Claim up to `params["limit"]` due items (`claim_params`), by id. Read as stored:
    one row's unreadable time fails only its item (`claimed_item`)."""
    return Operation("claim", lambda: _claim_steps(params))


def _claim_steps(params: Mapping[str, Any]) -> Steps[list[WorkItem]]:
    rows = yield Query("claim", params, as_stored=True)
    return _by_id(claimed_item(row) for row in rows)


def finish_and_claim(
    attempts: Attempts, params: Mapping[str, Any]
) -> Operation[tuple[set[int], list[WorkItem]]]:
    """Complete `attempts` and claim (`claim_params`) in one statement: the ids whose
    completion applied, and the items claimed, by id."""
    values = {**_attempt_params(attempts), **params}
    return Operation("finish_and_claim", lambda: _finish_and_claim_steps(values))


def _finish_and_claim_steps(
    params: Mapping[str, Any],
) -> Steps[tuple[set[int], list[WorkItem]]]:
    rows = yield Query("finish_and_claim", params, as_stored=True)
    applied = {row["finished"] for row in rows if row["finished"] is not None}
    claimed = [
        claimed_item({k: v for k, v in row.items() if k != "finished"})
        for row in rows
        if row["finished"] is None
    ]
    return applied, _by_id(claimed)


def seconds_until_due(
    *, kinds: Sequence[str], scopes: Sequence[str] | None, unscoped: bool
) -> Operation[float | None]:
    """Seconds until the next not-yet-due item a claim could take; None: none."""
    params = {
        "kinds": list(kinds),
        "scopes": None if scopes is None else list(scopes),
        "unscoped": unscoped,
    }
    return Operation("seconds_until_due", lambda: _first("seconds_until_due", params, "seconds"))


# -- heartbeats ------------------------------------------------------------------------


def heartbeat(id: int, attempt: int, lease: float) -> Operation[Heartbeat]:
    params = {"id": id, "attempt": attempt, "lease": lease}
    return Operation("heartbeat", lambda: _heartbeat_steps(params))


def _heartbeat_steps(params: Mapping[str, Any]) -> Steps[Heartbeat]:
    [row] = yield Query("heartbeat", params)
    if row["lost"]:
        return Heartbeat.LOST
    return Heartbeat.CANCEL_REQUESTED if row["cancel_requested"] else Heartbeat.OK


def heartbeat_many(attempts: Attempts, lease: float) -> Operation[dict[tuple[int, int], Heartbeat]]:
    """Each attempt's answer; one the statement says nothing of is left out."""
    params = {**_attempt_params(attempts), "lease": lease}
    return Operation("heartbeat_many", lambda: _heartbeat_many_steps(params))


def _heartbeat_many_steps(params: Mapping[str, Any]) -> Steps[dict[tuple[int, int], Heartbeat]]:
    answers = {}
    for row in (yield Query("heartbeat_many", params)):
        if row["lost"]:
            answers[row["id"], row["attempt"]] = Heartbeat.LOST
        elif row["cancel_requested"] is not None:
            cancel = row["cancel_requested"]
            answers[row["id"], row["attempt"]] = (
                Heartbeat.CANCEL_REQUESTED if cancel else Heartbeat.OK
            )
    return answers


# -- the fenced finishes ---------------------------------------------------------------


def finish(
    attempts: Attempts,
    status: Status,
    reason: str | None = None,
    error: str | None = None,
    *,
    wait: bool = True,
    traceback: str | None = None,
) -> Operation[set[int]]:
    """End `attempts` with `status` (work_finish_v1); the ids whose write applied.
    `wait=False`: rows another transaction holds are passed over."""
    params = {
        **_attempt_params(attempts),
        "status": status.value,
        "reason": reason,
        "error": error,
        "wait": wait,
        "traceback": traceback,
    }
    return Operation("finish", lambda: _ids("finish", params))


def finish_result(
    attempts: Attempts, results: Sequence[str | None], *, wait: bool = True
) -> Operation[set[int]]:
    """Succeed `attempts`, each with its result as JSON text (work_finish_result_v1);
    the ids whose write applied."""
    params = {**_attempt_params(attempts), "results": list(results), "wait": wait}
    return Operation("finish_result", lambda: _ids("finish_result", params))


def requeue(
    id: int,
    attempt: int,
    cause: str,
    *,
    delay: float = 0.0,
    error: str | None = None,
    traceback: str | None = None,
) -> Operation[bool]:
    """Back to Queued (`cause`: release, retry), due in `delay` seconds; False: the
    attempt no longer owns the item. StoreError while a dedup sibling is being
    enqueued (the statement leaves the item Running)."""
    params = {
        **_attempt_params([(id, attempt)]),
        "cause": cause,
        "delay": delay,
        "error": error,
        "traceback": traceback,
    }
    return Operation("requeue", lambda: _requeue_steps(params))


def _requeue_steps(params: Mapping[str, Any]) -> Steps[bool]:
    rows = yield Query("requeue", params)
    if rows and rows[0]["status"] == Status.RUNNING.value:
        raise StoreError(
            f"{params['cause']}: an item with the same dedup key is being enqueued; try again"
        )
    return bool(rows)


# -- what a handler reads --------------------------------------------------------------


def step(id: int, name: str) -> Operation[tuple[bool, Any]]:
    """Whether item `id` has step `name` recorded, and its value."""
    return Operation("step", lambda: _step_steps({"id": id, "name": name}))


def _step_steps(params: Mapping[str, Any]) -> Steps[tuple[bool, Any]]:
    rows = yield Query("step", params)
    if not rows:
        return False, None
    return True, loads_or_mark(rows[0]["result"])


def parent_results(id: int) -> Operation[dict[int, Any]]:
    """The results of item `id`'s parents, by id."""
    return Operation("parent_results", lambda: _parent_results_steps({"id": id}))


def _parent_results_steps(params: Mapping[str, Any]) -> Steps[dict[int, Any]]:
    rows = yield Query("parent_results", params)
    return {row["id"]: loads_or_mark(row["result"]) for row in rows}


# -- maintenance -----------------------------------------------------------------------


def recover_expired_leases(max_stalls: int, batch: int) -> Operation[list[Recovered]]:
    """One batch of lease recovery (at most `batch` items): those taken back."""
    params = {"max_stalls": max_stalls, "batch": batch}
    return Operation("recover_expired_leases", lambda: _recover_steps(params))


def _recover_steps(params: Mapping[str, Any]) -> Steps[list[Recovered]]:
    rows = yield Query("recover_expired_leases", params)
    return [Recovered(**{**row, "status": Status(row["status"])}) for row in rows]


def held_leases(batch: int) -> Operation[list[HeldLease]]:
    params = {"limit": batch}
    return Operation("held_leases", lambda: _each("held_leases", params, lambda r: HeldLease(**r)))


def settle_noted_scopes(batch: int) -> Operation[int]:
    """One batch of settling noted scopes; how many were settled."""
    params = {"limit": batch}
    return Operation(
        "settle_noted_scopes", lambda: _first("settle_noted_scopes", params, "settled")
    )


def repair_heads(batch: int) -> Operation[list[str]]:
    """The wedged scopes found and fixed (at most `batch`)."""
    params = {"limit": batch}
    return Operation("repair_heads", lambda: _column("repair_heads", params, "scope"))


def delete_finished(params: Mapping[str, Any]) -> Operation[list[dt.datetime]]:
    """One batch of retention: the finished times of the items it deleted."""
    return Operation("delete_finished", lambda: _column("delete_finished", params, "finished_at"))


def scope_holders(scope: str) -> Operation[tuple[list[ScopeHolder], bool]]:
    """The scope's Running items, in slot order, and whether it still has a head."""
    return Operation("scope_holder", lambda: _scope_holders_steps({"scope": scope}))


def _scope_holders_steps(params: Mapping[str, Any]) -> Steps[tuple[list[ScopeHolder], bool]]:
    rows = yield Query("scope_holder", params)
    holders = [
        ScopeHolder(**{k: v for k, v in row.items() if k != "heads"})
        for row in rows
        if row["id"] is not None
    ]
    return holders, bool(rows[0]["heads"])


# -- limits and schedules ----------------------------------------------------------------


def set_limit(change: LimitChange) -> Operation[Limit]:
    """Write a checked limit (`validate_limit`); the limit as it now stands."""
    params = limit_params(change)
    return Operation("set_limit", lambda: _one("set_limit", params, limit_of))


def declare_limit(declared: LimitChange) -> Operation[Declared]:
    params = limit_params(declared)
    return Operation(
        "declare_limit", lambda: _one("declare_limit", params, lambda r: declared_of(declared, r))
    )


def clear_limit(kind: str | None, scope: str | None) -> Operation[bool]:
    """Remove the limit of `kind`, `scope` or the default (`limit_target`); False: none."""
    params = {"kind": kind, "scope": scope}
    return Operation(
        "clear_limit", lambda: _one("clear_limit", params, lambda r: bool(r["cleared"]))
    )


def limits() -> Operation[list[Limit]]:
    return Operation("limits", lambda: _each("limits", {}, limit_of))


def limit_params(change: LimitChange) -> dict[str, Any]:
    rate = change.rate
    return {
        "kind": change.kind,
        "scope": change.scope,
        "running": change.running,
        "rate": None if rate is None else rate.count,
        "per": None if rate is None else rate.per,
    }


def sync_schedule(schedule: Schedule, now: dt.datetime) -> Operation[None]:
    """Write one of the Worker's schedules (a changed one starts afresh)."""
    params = {
        "name": schedule.name,
        "kind": schedule.kind,
        "scope": schedule.scope,
        "payload": json.dumps({} if schedule.payload is None else schedule.payload),
        "priority": schedule.priority,
        "spec": schedule.spec,
        "next_due": first_due(schedule, now),
    }
    return Operation("sync_schedule", lambda: _nothing("sync_schedule", params))


# -- the Worker's presence -------------------------------------------------------------


def advertise(worker: WorkerInfo, *, gone: Callable[[int], bool]) -> Operation[None]:
    """Record (or refresh) a Worker; ConfigurationError when another live Worker holds
    its id. A holder of this host whose process is `gone` (SIGKILLed, restarted under
    its id by a supervisor) holds it no more: taken over at once."""
    params = {
        "id": worker.id,
        "host": worker.host,
        "pid": worker.pid,
        "kinds": list(worker.kinds),
        "scopes": None if worker.scopes is None else list(worker.scopes),
        "unscoped": worker.unscoped,
        "concurrency": worker.concurrency,
        "advertise_every": worker.advertise_every,
        "alive_beats": ALIVE_BEATS,
        "alive_within": ALIVE_WITHIN,
        "gone_pid": None,
    }
    return Operation("advertise_worker", lambda: _advertise_steps(worker, params, gone))


def _advertise_steps(
    worker: WorkerInfo, params: Mapping[str, Any], gone: Callable[[int], bool]
) -> Steps[None]:
    if (yield Query("advertise_worker", params)):
        return
    holders = yield Query("worker_holding", {"id": worker.id})
    holder = holders[0] if holders else {}
    taken_over = (
        holder.get("host") == worker.host
        and gone(holder["pid"])
        and (yield Query("advertise_worker", {**params, "gone_pid": holder["pid"]}))
    )
    if not taken_over:
        raise id_in_use(worker.id, **holder)


def worker_stopped(worker_id: str) -> Operation[None]:
    return Operation("worker_stopped", lambda: _nothing("worker_stopped", {"id": worker_id}))


# -- small parts -----------------------------------------------------------------------


def _attempt_params(attempts: Attempts) -> dict[str, list[int]]:
    return {"ids": [id for id, _ in attempts], "attempts": [a for _, a in attempts]}


def _by_id(items: Iterable[WorkItem]) -> list[WorkItem]:
    return sorted(items, key=lambda item: item.id)


def _ids(name: str, params: Mapping[str, Any]) -> Steps[set[int]]:
    return {row["id"] for row in (yield Query(name, params))}


def _first(name: str, params: Mapping[str, Any], column: str) -> Steps[Any]:
    """The first row's `column`."""
    rows: Rows = yield Query(name, params)
    return rows[0][column]


def _one(name: str, params: Mapping[str, Any], make: Callable[[dict[str, Any]], T]) -> Steps[T]:
    rows = yield Query(name, params)
    return make(rows[0])


def _column(name: str, params: Mapping[str, Any], column: str) -> Steps[list[Any]]:
    return [row[column] for row in (yield Query(name, params))]


def _each(
    name: str, params: Mapping[str, Any], make: Callable[[dict[str, Any]], T]
) -> Steps[list[T]]:
    return [make(row) for row in (yield Query(name, params))]


def _nothing(name: str, params: Mapping[str, Any]) -> Steps[None]:
    yield Query(name, params)
