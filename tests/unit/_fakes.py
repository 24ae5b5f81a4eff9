"""Fakes for the executor and Worker unit tests: a scriptable in-memory store, a
recording tracer and event sink. All on Trio's clock; none touches PostgreSQL or the
wall clock."""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from trioworker import Context, Registry, Settings, Worker, WorkItem
from trioworker._core.errors import DatabaseUnavailable, SchemaNotReady, StoreError
from trioworker._core.policy import AttemptOutcome
from trioworker._worker.attempt import Slot, Slots
from trioworker._worker.executor import Executor
from trioworker.testing import MemoryStore

#: A step of a scripted store call: "fail" (DatabaseUnavailable), "refuse" (a
#: StoreError: the database refused the call itself), "unmigrated" (SchemaNotReady),
#: "hang" (no answer ever), seconds to wait before answering, or "ok".
Step = str | float


class ScriptedStore(MemoryStore):
    """The in-memory store, whose calls can be scripted per operation (`script`), and
    which records when each operation was called (`times`)."""

    def __init__(self) -> None:
        super().__init__()
        self.script: dict[str, list[Step]] = collections.defaultdict(list)
        self.times: dict[str, list[float]] = collections.defaultdict(list)
        self.on_notify: Callable[[str | None], None] | None = None
        self.on_settle: Callable[[str | None], None] | None = None

    async def _enter(self, op: str) -> None:
        # A loop that calls the store without letting time pass fails the test (at
        # once, rather than hanging it).
        assert len(self.calls) < 20_000, f"runaway: {op} called again and again"
        self.times[op].append(trio.current_time())
        steps = self.script.get(op)
        step = steps.pop(0) if steps else "ok"
        if step == "fail":
            raise DatabaseUnavailable(f"{op}: down")
        if step == "refuse":
            raise StoreError(f"{op}: refused")
        if step == "unmigrated":
            raise SchemaNotReady(f"{op}: no such table")
        if step == "hang":
            await trio.sleep_forever()
        if isinstance(step, float):
            await trio.sleep(step)
        await super()._enter(op)

    async def listen(
        self,
        on_notify: Callable[[str | None], None],
        *,
        on_settle: Callable[[str | None], None] | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        self.on_notify, self.on_settle = on_notify, on_settle
        await super().listen(on_notify, on_settle=on_settle, task_status=task_status)


@attrs.define
class Trace:
    item: WorkItem
    events: list[tuple[str, str | None]] = attrs.Factory(list)
    ended: list[tuple[str, BaseException | None]] = attrs.Factory(list)

    def event(self, name: str, detail: str | None = None) -> None:
        self.events.append((name, detail))

    def end(self, outcome: AttemptOutcome, error: BaseException | None) -> None:
        self.ended.append((outcome.value, error))


class Tracer:
    def __init__(self) -> None:
        self.traces: list[Trace] = []

    def start(self, item: WorkItem) -> Trace:
        self.traces.append(Trace(item))
        return self.traces[-1]

    def outcomes(self) -> list[str]:
        return [outcome for t in self.traces for outcome, _ in t.ended]


class Sink:
    """An EventSink (the metrics' side) that records every observation."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, float | None]] = []

    def observe(self, event: str, kind: str, value: float | None = None) -> None:
        self.seen.append((event, kind, value))

    def named(self, event: str) -> list[tuple[str, str, float | None]]:
        return [s for s in self.seen if s[0] == event]


class Failstops:
    def __init__(self) -> None:
        self.calls: list[tuple[float, str]] = []

    def __call__(self, message: str) -> None:
        self.calls.append((trio.current_time(), message))


@asynccontextmanager
async def running(
    store: MemoryStore,
    registry: Registry,
    settings: Settings | None = None,
    **kwargs: Any,
) -> AsyncIterator[Worker]:
    """A Worker "w1" running in the block, cancelled (at once) at its end."""
    kwargs.setdefault("fail_stop", Failstops())
    worker = Worker(store, registry, settings or Settings(), worker_id="w1", **kwargs)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.testing.wait_all_tasks_blocked()  # it has claimed what it can
        yield worker
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def executing(executor: Executor) -> AsyncIterator[Executor]:
    """The executor's Worker-level tasks (its heartbeat, completions and fail-stop
    watch) running in the block, as a Worker runs them; at its end, once no attempt
    is in flight (every completion answered), cancelled."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(executor.heartbeats.run)
        nursery.start_soon(executor.completions.run)
        nursery.start_soon(executor.watch_stops)
        yield executor
        await executor.idle()
        nursery.cancel_scope.cancel()


def a_slot() -> Slot:
    """A slot of a Worker of its own (for an executor run without a Worker)."""
    (slot,) = Slots(1, lambda: None).take_free()
    return slot


def sleeping(seconds: float = float("inf")) -> Callable[[WorkItem, Context], Awaitable[None]]:
    """A handler that sleeps (forever, by default)."""

    async def handler(item: WorkItem, ctx: Context) -> None:
        await trio.sleep(seconds)

    return handler


def messages(
    caplog: pytest.LogCaptureFixture, logger: str, level: int = logging.DEBUG
) -> list[str]:
    """The messages `logger` logged at `level` or above, in order."""
    return [r.getMessage() for r in caplog.records if r.name == logger and r.levelno >= level]


def records(caplog: pytest.LogCaptureFixture, start: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(start)]


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]
