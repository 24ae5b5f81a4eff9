"""Values that cross the store boundary: closed sets and frozen records."""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import attrs

from trioworker._core.jsontext import UndecodableValue


class Status(enum.Enum):
    #: Enqueued `after` other items, some of which have not Succeeded yet: no claim
    #: takes it; it becomes Queued when they all have (Cancelled if one fails).
    WAITING = "Waiting"
    QUEUED = "Queued"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    @property
    def is_terminal(self) -> bool:
        """Whether the item is finished: Succeeded, Failed or Cancelled."""
        return self in FINISHED


#: The statuses of finished items.
FINISHED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)


class Heartbeat(enum.Enum):
    """What a heartbeat learned about its attempt."""

    OK = "ok"
    LOST = "lost"  # the attempt no longer owns the item: stop, write nothing
    CANCEL_REQUESTED = "cancel-requested"


class CancelOutcome(enum.Enum):
    """What `Client.cancel` did."""

    CANCELLED = "cancelled"  # it was Queued and is now Cancelled
    REQUESTED = "requested"  # it is Running; its next heartbeat reports it
    ALREADY_FINISHED = "already-finished"
    NOT_FOUND = "not-found"


@attrs.frozen
class WorkItem:
    """One claimed attempt of a work item, as a handler sees it."""

    id: int
    kind: str
    scope: str | None
    payload: Any
    attempt: int
    stalls: int = 0
    failures: int = 0
    requested_at: dt.datetime | None = None
    dedup_key: str | None = None
    priority: int = 0
    #: The trace context it was enqueued in (a propagator's carrier: W3C traceparent
    #: and tracestate), or None; `trioworker.otel` makes each attempt's span its child.
    trace_context: Mapping[str, str] | None = None
    #: The stored columns Python could not decode, but the payload (which stands as an
    #: UndecodableValue in `payload`): (column, why), the column's field left None. The
    #: Worker fails such an item without running it: a handler never sees one.
    undecodable: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class Enqueued:
    """What `enqueue` did: the item's id, and whether it was merged onto an item already
    Queued with the same dedup key (that item's id is returned)."""

    id: int
    deduplicated: bool  # True: an item with this dedup key was already Queued


@attrs.frozen
class Recovered:
    """One item lease recovery took back from an attempt whose lease expired."""

    id: int
    kind: str
    scope: str | None
    attempt: int
    stalls: int
    #: Queued again, or Failed as stalled, or Cancelled; Succeeded when the attempt had
    #: committed its success in its own transaction (no stall counted).
    status: Status
    reason: str | None
    #: The Worker whose attempt stopped heartbeating (from the attempt's history).
    worker_id: str | None = None


#: A stored time, or what stands for one Python cannot hold (`ItemState`, `AttemptRecord`).
Time: TypeAlias = dt.datetime | UndecodableValue


@attrs.frozen
class HeldLease:
    """An expired item lease recovery cannot take back: another session has held its
    row for a whole lease after the lease ran out, past every bound the queue sets on
    one (docs/adr/0014-scope-lines-and-heads.md, "Lease recovery and a held row")."""

    id: int
    kind: str
    scope: str | None
    attempt: int
    #: The Worker whose attempt it was.
    worker_id: str | None
    #: Seconds since its lease ran out.
    expired_for: float
    #: The backend (pid) whose transaction holds the row, as the row says; None when
    #: several share the lock.
    holder: int | None


@attrs.frozen
class ItemState:
    """A work item's row, as `get_item` reads it. A stored value Python cannot decode (a
    payload past its JSON reader, a time past its datetime) stands as an
    UndecodableValue: why, and the stored text."""

    id: int
    kind: str
    scope: str | None
    payload: Any
    priority: int
    status: Status
    attempt: int
    stalls: int
    failures: int
    worker_id: str | None
    requested_at: Time
    run_after: Time
    started_at: Time | None
    finished_at: Time | None
    heartbeat_at: Time | None
    lease_expires_at: Time | None
    dedup_key: str | None
    cancel_requested: bool
    reason: str | None
    error: str | None
    traceback: str | None = None  # the last failed attempt's (its tail)
    trace_context: Mapping[str, str] | None = None  # as enqueued (WorkItem's)
    #: When its attempt committed its success in its own fenced transaction
    #: (`tx.complete()`): Running still, holding its scope, until the Worker finishes it.
    completed_at: Time | None = None
    #: A Succeeded item's result (its handler's return value), None for none; an
    #: UndecodableValue if Python cannot read what is stored.
    result: Any = None


@attrs.frozen
class AttemptRecord:
    """How one attempt of an item ended, from its history (`Store.attempts`); a time
    Python cannot hold stands as an UndecodableValue, as in ItemState."""

    attempt: int
    worker_id: str | None
    started_at: Time | None
    ended_at: Time | None
    #: failed, retried, released, stalled, cancelled, superseded, succeeded, running, and
    #: operator-retry (an operator put it back in the queue; no Worker ran it)
    outcome: str
    error: str | None = None
    traceback: str | None = None


@attrs.frozen
class StepRecord:
    """A durable step of an item (`ctx.step`): its name, the attempt that recorded it,
    when, and the value its function returned (an UndecodableValue if unreadable)."""

    name: str
    attempt: int
    recorded_at: Time
    result: Any = None


@attrs.frozen
class WorkerInfo:
    """What a Worker advertises about itself in the Workers table."""

    id: str
    host: str
    pid: int
    kinds: tuple[str, ...]
    scopes: tuple[str, ...] | None  # None: every scope
    unscoped: bool
    concurrency: int
    #: How often it advertises itself (seconds); None: it does not say.
    advertise_every: float | None = None


@attrs.frozen
class StoreStatistics:
    """Counters a store keeps about its own calls, for metrics and tests."""

    race_losses: int  # claims that lost the running-scope race on the unique index
    dedup_hits: int  # enqueues merged onto an already Queued item
    timeouts: int  # calls that ran out of time
    conflict_retries: int = 0  # the queue's own writes retried after a deadlock or
    # serialization failure (none is expected: each one is worth a look)
    scopes_settled: int = 0  # scopes settled from work_unsettled_scopes
    heads_repaired: int = 0  # wedged scopes the repair found and fixed (a bug if > 0)


@attrs.frozen
class NewItem:
    """One item for `enqueue_many`: the arguments `enqueue` takes, as a value."""

    kind: str
    scope: str | None = None
    payload: Any = None
    dedup_key: str | None = None
    run_after: dt.datetime | dt.timedelta | None = None
    priority: int = 0
    #: None: the current OpenTelemetry span's, if any (as `enqueue`); {}: none.
    trace_context: Mapping[str, str] | None = None
    #: The ids of the items it runs after (each must Succeed first), as `enqueue`'s.
    after: Sequence[int] | None = None


@attrs.frozen
class Pause:
    """A paused kind or scope (exactly one of the two is set)."""

    kind: str | None
    scope: str | None
    paused_at: dt.datetime


@attrs.frozen
class ScopeHolder:
    """A Running item of a scope (one per slot it holds), as quiesce watches it."""

    id: int
    attempt: int
    kind: str
    worker_id: str | None
    cancel_requested: bool
    #: Seconds until its lease expires by the database's clock (<= 0: expired).
    lease_left: float
    #: The scope slot it holds (1..the scope's running limit).
    slot: int | None = None


@attrs.frozen
class ScheduleState:
    """A periodic item's schedule, as the database holds it."""

    name: str
    kind: str
    scope: str | None
    spec: str
    next_due: dt.datetime
    last_due: dt.datetime | None
    last_item: int | None


@attrs.frozen
class Fired:
    """One due time of a schedule, enqueued. `deduplicated`: the schedule's previous
    item was still Queued, so none was added (`item` is that one)."""

    name: str
    due: dt.datetime
    item: int
    deduplicated: bool = False
