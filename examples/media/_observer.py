"""An attempt log kept outside the database: who ran which item of which scope, when.

When $TRIOWORKER_MEDIA_OBSERVER_LOG names a file, every media handler appends one JSON
line as its attempt starts and one as it ends (however it ends), stamped with
`time.monotonic()`, one clock for every process on the machine. The file is opened
with O_APPEND for each line, so lines from many processes never interleave. The demo
reads it back to measure that no scope ever had two attempts at once.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from trioworker import Context, WorkItem

OBSERVER_ENV = "TRIOWORKER_MEDIA_OBSERVER_LOG"

Handler = Callable[[WorkItem, Context], Awaitable[Any]]


def record(path: str, event: str, item: WorkItem, worker_id: str) -> None:
    line = json.dumps(
        {
            "event": event,
            "id": item.id,
            "attempt": item.attempt,
            "kind": item.kind,
            "scope": item.scope,
            "worker": worker_id,
            "pid": os.getpid(),
            "t": time.monotonic(),
        }
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def observed(handler: Handler) -> Handler:
    """The handler, logging its attempt's start and end when the observer log is set."""

    @functools.wraps(handler)
    async def wrapper(item: WorkItem, ctx: Context) -> Any:
        path = os.environ.get(OBSERVER_ENV)
        if not path:
            return await handler(item, ctx)
        record(path, "start", item, ctx.worker_id)
        try:
            return await handler(item, ctx)
        finally:
            # However it ends (returned, raised, cancelled): its file work is over, since
            # file work runs in threads that a cancel waits for.
            record(path, "end", item, ctx.worker_id)

    return wrapper


@attrs.frozen
class Span:
    id: int
    attempt: int
    kind: str | None
    scope: str | None
    worker: str | None
    pid: int
    start: float
    end: float | None  # None: the process died first (or is still running)


def read_spans(path: Path, died_at: Mapping[int, float] | None = None) -> list[Span]:
    """Attempts from the log. An attempt with no end line ends when its process died,
    if `died_at` knows when; otherwise it is still open (end None)."""
    starts: dict[tuple[int, int], dict[str, Any]] = {}
    ends: dict[tuple[int, int], float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            e = json.loads(line)
            key = (e["id"], e["attempt"])
            if e["event"] == "start":
                starts[key] = e
            else:
                ends[key] = e["t"]
    deaths = died_at or {}
    return [
        Span(
            id=e["id"],
            attempt=e["attempt"],
            kind=e.get("kind"),
            scope=e["scope"],
            worker=e.get("worker"),
            pid=e["pid"],
            start=e["t"],
            end=ends.get(key, deaths.get(e["pid"])),
        )
        for key, e in starts.items()
    ]


def overlaps(spans: list[Span]) -> list[tuple[Span, Span]]:
    """Pairs of attempts of one scope whose [start, end] intervals intersect (an open
    attempt lasts forever)."""
    found = []
    by_scope: dict[str, list[Span]] = {}
    for s in spans:
        if s.scope is not None:
            by_scope.setdefault(s.scope, []).append(s)
    for group in by_scope.values():
        group.sort(key=lambda s: s.start)
        latest: Span | None = None  # the attempt reaching furthest so far
        for a, b in itertools.pairwise(group):
            if latest is None or _end(a) > _end(latest):
                latest = a
            if b.start < _end(latest):
                found.append((latest, b))
    return found


def _end(span: Span) -> float:
    return span.end if span.end is not None else float("inf")
