"""What the queue's readers see: typed snapshots of the queue, one definition for the
command line, the dashboard, the metrics and applications (`Client.status()`,
`Client.queue_counts()`, `Client.show()`). Each store fills them from its own data;
the renderers only render them."""

from __future__ import annotations

import datetime as dt
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from trioworker._core.errors import ConfigurationError, ItemNotSucceeded
from trioworker._core.limits import Limit
from trioworker._core.model import (
    AttemptRecord,
    ItemState,
    Pause,
    ScheduleState,
    Status,
    StepRecord,
)

#: A Worker is alive while its advertisement is younger than this many of its own
#: advertisement intervals (`Settings.recovery_every`, a quarter lease): a SIGKILLed
#: Worker is reported gone, and its kinds unserved, within 45 s by default.
ALIVE_BEATS = 3
#: The window for a Worker that did not say its interval (an earlier version's).
ALIVE_WITHIN = 180.0


def id_in_use(
    worker_id: str, host: str = "?", pid: int = 0, seen_ago: float = 0.0
) -> ConfigurationError:
    """The error of a Worker whose id a live Worker holds."""
    return ConfigurationError(
        f"worker id {worker_id!r} is in use by a live Worker (host {host}, pid {pid},"
        f" seen {seen_ago:.1f}s ago): give each Worker its own --worker-id"
    )


def process_gone(pid: int) -> bool:
    """Whether no process `pid` runs on this host (one that runs as another user, or a
    new process that reused the number, counts as running; one that has ended and
    waits to be reaped does not: a Worker whose supervisor was SIGKILLed is reaped by
    init, which some take seconds to do)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return pid <= 0 or _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether process `pid` has ended but is not reaped yet (Linux; elsewhere False)."""
    if sys.platform != "linux":
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[-1].split()
    except FileNotFoundError:  # reaped meanwhile
        return True
    return fields[:1] in ([b"Z"], [b"X"])


def alive_window(advertise_every: float | None) -> float:
    """How long after its last advertisement a Worker still counts as alive."""
    return ALIVE_WITHIN if advertise_every is None else ALIVE_BEATS * advertise_every


STATUS_ORDER = tuple(s.value for s in Status)


def counts_by_kind(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Rows of (kind, status, n) as {kind: {status: n}}, every status present (zero
    when a kind has none), statuses in `Status` order."""
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        by_status = counts.setdefault(row["kind"], dict.fromkeys(STATUS_ORDER, 0))
        by_status[row["status"]] = int(row["n"])
    return counts


@attrs.frozen
class QueueCounts:
    """How many items each kind has in each status, and how many scopes are busy."""

    by_kind: Mapping[str, Mapping[str, int]]  # {kind: {status: n}}, every status present
    busy_scopes: int  # scopes with a Running item

    @property
    def totals(self) -> dict[str, int]:
        return {s: sum(k[s] for k in self.by_kind.values()) for s in STATUS_ORDER}


@attrs.frozen
class RunningItem:
    id: int
    kind: str
    scope: str | None
    attempt: int
    worker_id: str | None
    started_at: dt.datetime | None
    lease_left: float  # seconds, by the database's clock (<= 0: expired)


@attrs.frozen
class Failure:
    id: int
    kind: str
    scope: str | None
    attempt: int
    finished_at: dt.datetime | None
    reason: str | None
    error: str | None


@attrs.frozen
class WorkerState:
    """A Worker as the Workers table shows it."""

    id: str
    host: str
    pid: int
    started_at: dt.datetime
    last_seen: dt.datetime
    stopped_at: dt.datetime | None
    kinds: tuple[str, ...]
    scopes: tuple[str, ...] | None
    unscoped: bool
    concurrency: int
    alive: bool  # not stopped, and seen within alive_window(its interval)


@attrs.frozen
class QueueStatus:
    """Everything `status` shows, read at one moment."""

    counts: QueueCounts
    running: Sequence[RunningItem]
    recent_failures: Sequence[Failure]
    workers: Sequence[WorkerState]
    unserved_kinds: Mapping[str, int]  # Queued kinds no live Worker serves: {kind: n}
    schedules: Sequence[ScheduleState]
    pauses: Sequence[Pause]
    #: Concurrency and rate limits, with what each holds now (docs/design/limits.md).
    limits: Sequence[Limit] = ()

    def to_json(self) -> dict[str, Any]:
        """The JSON `status --json` prints (times as ISO 8601 text)."""
        return {
            "counts": {k: dict(v) for k, v in self.counts.by_kind.items()},
            "totals": self.counts.totals,
            "running": [_jsonable(r) for r in self.running],
            "busy_scopes": self.counts.busy_scopes,
            "recent_failures": [_jsonable(f) for f in self.recent_failures],
            "workers": [_jsonable(w) for w in self.workers],
            "unserved_kinds": dict(self.unserved_kinds),
            "schedules": [_jsonable(s) for s in self.schedules],
            "pauses": [_jsonable(p) for p in self.pauses],
            "limits": [limit_json(lim) for lim in self.limits],
        }


@attrs.frozen
class WaitFacts:
    """What may hold a Queued item back, read in one go (`waiting_reasons` words it)."""

    #: Seconds until it falls due (0 or less: due).
    due_in: float
    kind_paused: bool
    scope_paused: bool
    #: Whether a live Worker serves its kind (and its scope, or unscoped items).
    served: bool
    #: Its scope's Running items and running limit (0 and 1 for an unscoped item).
    scope_running: int
    scope_limit: int
    #: Its kind's Running items and running limit (None: none).
    kind_running: int
    kind_limit: int | None
    #: Whether a rate of its kind or scope has no start left in its window.
    rate_spent: bool
    #: Due Queued items of its scope that come before it (up to 10,000).
    ahead: int


def waiting_reasons(facts: WaitFacts, kind: str, scope: str | None) -> list[str]:
    """Why a Queued item is not running, each reason a line; one line saying nothing
    holds it when nothing does."""
    reasons = []
    if facts.due_in == math.inf:
        reasons.append("never due: its run_after is infinity")
    elif facts.due_in > 0:
        reasons.append(f"not due for another {facts.due_in:.0f}s (its run_after)")
    if facts.kind_paused:
        reasons.append(f"kind {kind} is paused")
    if facts.scope_paused:
        reasons.append(f"scope {scope} is paused")
    if not facts.served:
        where = "" if scope is None else f" in scope {scope}"
        reasons.append(f"no live Worker serves kind {kind}{where}")
    if scope is not None and facts.scope_running >= facts.scope_limit:
        reasons.append(
            f"scope {scope} is full: {facts.scope_running} of {facts.scope_limit} Running"
        )
    if facts.kind_limit is not None and facts.kind_running >= facts.kind_limit:
        reasons.append(f"kind {kind} is full: {facts.kind_running} of {facts.kind_limit} Running")
    if facts.rate_spent:
        reasons.append("a rate of its kind or scope has no start left in its window")
    if facts.ahead:
        reasons.append(f"{facts.ahead} due item(s) of scope {scope} come before it")
    return reasons or ["nothing holds it back: a Worker should take it within its poll"]


@attrs.frozen
class ItemDetails:
    """One item as `show` shows it: its row, how its attempts ended, its recorded
    steps, its parents and children, and for a Queued item why it is not running
    (`waiting_reasons`), for a Waiting one which parents it waits for
    (`parents_waited_for`)."""

    item: ItemState
    attempts: Sequence[AttemptRecord]
    steps: Sequence[StepRecord] = ()
    waiting: Sequence[str] = ()
    #: The items it was enqueued after, and the first 1,000 enqueued after it, by id.
    parents: Sequence[Relative] = ()
    children: Sequence[Relative] = ()


@attrs.frozen
class Relative:
    """A parent or child of an item (`after=`), as `show` lists it."""

    id: int
    kind: str
    status: Status


#: The most parents `parents_waited_for` names; the rest are counted.
NAMED_PARENTS = 10


def parents_waited_for(parents: Sequence[Relative]) -> list[str]:
    """Why a Waiting item is not Queued yet, from its parents (`ItemDetails.parents`):
    the ones that have not Succeeded, by id, with their kinds and statuses. Once a
    parent has Failed or been Cancelled, or every one has Succeeded, the schema
    settles the item at once, unless another transaction held it then: a Worker's
    settle pass does it later, and these say so."""
    if not parents:
        return []
    ended = [p for p in parents if p.status in (Status.FAILED, Status.CANCELLED)]
    if ended:
        return [
            f"parent {ended[0].id} ({ended[0].kind}, {ended[0].status.value}) will not"
            " succeed: a Worker's next settle pass cancels it"
        ]
    undone = [p for p in parents if p.status is not Status.SUCCEEDED]
    if not undone:
        return ["every parent has Succeeded: a Worker's next settle pass queues it"]
    named = ", ".join(f"parent {p.id} ({p.kind}, {p.status.value})" for p in undone[:NAMED_PARENTS])
    more = len(undone) - NAMED_PARENTS
    return [f"for {named}" + (f" and {more} more" if more > 0 else "")]


def finished_result(
    id: int, status: str, result: Any, error: str | None, reason: str | None
) -> tuple[bool, Any]:
    """What waiting for item `id`'s result makes of its row: (False, None) while it
    has not ended; (True, its result) once Succeeded; ItemNotSucceeded, naming the
    status and why, once Failed or Cancelled."""
    if status == Status.SUCCEEDED.value:
        return True, result
    if status in (Status.FAILED.value, Status.CANCELLED.value):
        raise ItemNotSucceeded(id, status, error, reason)
    return False, None


#: Waiting for a result polls the item this often at first, doubling up to
#: RESULT_POLL_MAX: a notification (`trioworker_result`) ends a wait sooner where the
#: client listens for one.
RESULT_POLL_FIRST = 0.05
RESULT_POLL_MAX = 0.5


def next_poll(interval: float) -> float:
    """The interval after `interval` while waiting for a result."""
    return min(interval * 2, RESULT_POLL_MAX)


def limit_json(limit: Limit) -> dict[str, Any]:
    """A limit as `status --json` and `limit --json` print it (a rate as its text)."""
    return {**_jsonable(limit), "rate": None if limit.rate is None else str(limit.rate)}


def _jsonable(record: Any) -> dict[str, Any]:
    return {k: _json_value(v) for k, v in attrs.asdict(record, recurse=False).items()}


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, tuple):
        return list(value)
    return value
