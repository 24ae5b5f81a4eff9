"""What the queue's readers see: typed snapshots of the queue, one definition for the
command line, the dashboard, the metrics and applications (`Client.status()`,
`Client.queue_counts()`, `Client.show()`). Each store fills them from its own data;
the renderers only render them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from trioworker._core.limits import Limit
from trioworker._core.model import AttemptRecord, ItemState, Pause, ScheduleState, Status

#: A Worker whose advertisement is older than this is reported gone, and its kinds
#: unserved.
ALIVE_WITHIN = 180.0

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
    alive: bool  # not stopped, and seen within ALIVE_WITHIN


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
class ItemDetails:
    """One item as `show` shows it: its row and how its attempts ended."""

    item: ItemState
    attempts: Sequence[AttemptRecord]


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
