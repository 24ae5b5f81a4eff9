"""Fakes for the executor and Worker unit tests, and the one way they run a Worker: a
scriptable in-memory store (the tests' only way of injecting faults), a recording tracer
and event sink, and `running`. All on Trio's clock; none touches PostgreSQL or the wall
clock."""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import attrs
import pytest
import trio
import trio.testing

from trioworker import Context, Registry, Settings, Worker, WorkItem
from trioworker._core.errors import DatabaseUnavailable, SchemaNotReady, StoreError
from trioworker._core.policy import AttemptOutcome
from trioworker._store.api import Store
from trioworker._worker.attempt import Slot, Slots
from trioworker._worker.executor import Executor, FailStop
from trioworker.testing import MemoryStore

#: What one call of a store operation does: "fail" (DatabaseUnavailable: the database
#: cannot be reached), "refuse" (a StoreError: the database refused the call itself),
#: "unmigrated" (SchemaNotReady), "hang" (no answer ever), seconds to wait before
#: answering, or "ok" (answer at once).
Step = Literal["fail", "refuse", "unmigrated", "hang", "ok"] | float

#: The script's key for every operation without a script of its own.
EVERY = "*"


def always(step: Step) -> Iterator[Step]:
    """A script that does `step` on every call, until it is replaced or deleted."""
    return itertools.repeat(step)


class Script:
    """What each store operation does, call by call: `script[op] = [...]` (any iterable
    of steps) scripts the next calls of `op`, one step each; `script[EVERY]` the calls of
    operations whose own script is spent or missing. Once both are spent, a call is "ok".
    """

    def __init__(self) -> None:
        self._steps: dict[str, Iterator[Step]] = {}

    def __setitem__(self, op: str, steps: Iterable[Step]) -> None:
        self._steps[op] = iter(steps)

    def __delitem__(self, op: str) -> None:
        del self._steps[op]

    def next_step(self, op: str) -> Step:
        for key in (op, EVERY):
            step = next(self._steps.get(key, iter(())), None)
            if step is not None:
                return step
        return "ok"


class ScriptedStore(MemoryStore):
    """The in-memory store, whose calls can be scripted per operation (`script`), and
    which records when each operation was called (`times`: every call, answered or
    not; MemoryStore's `calls` has only the answered ones)."""

    def __init__(self) -> None:
        super().__init__()
        self.script = Script()
        self.times: dict[str, list[float]] = collections.defaultdict(list)
        self.on_notify: Callable[[str | None], None] | None = None
        self.on_settle: Callable[[str | None], None] | None = None
        self._entered = 0

    async def _enter(self, op: str) -> None:
        # A loop that calls the store without letting time pass fails the test (at
        # once, rather than hanging it).
        self._entered += 1
        assert self._entered < 20_000, f"runaway: {op} called again and again"
        self.times[op].append(trio.current_time())
        step = self.script.next_step(op)
        if step == "fail":
            await trio.lowlevel.checkpoint()
            raise DatabaseUnavailable(f"{op}: down")
        if step == "refuse":
            await trio.lowlevel.checkpoint()
            raise StoreError(f"{op}: refused")
        if step == "unmigrated":
            await trio.lowlevel.checkpoint()
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
    #: When (Trio's clock) each `end` came.
    ended_at: list[float] = attrs.Factory(list)

    def event(self, name: str, detail: str | None = None) -> None:
        self.events.append((name, detail))

    def end(self, outcome: AttemptOutcome, error: BaseException | None) -> None:
        self.ended.append((outcome.value, error))
        self.ended_at.append(trio.current_time())


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
    store: Store,
    registry: Registry,
    settings: Settings | None = None,
    *,
    worker_id: str = "w1",
    fail_stop: FailStop | None = None,
    **kwargs: Any,
) -> AsyncIterator[Worker]:
    """A Worker running in the block: started (`run` said so), and every task blocked
    (it has claimed what it can). At the block's end a Worker the block stopped
    (`worker.stop()`) is waited for, its items drained as a stopping process drains
    them; any other is cancelled at once. `kwargs` go to the Worker (scopes, metrics,
    tracer, watchdog); `fail_stop` is a `Failstops` unless given."""
    worker = Worker(
        store,
        registry,
        settings,
        worker_id=worker_id,
        fail_stop=Failstops() if fail_stop is None else fail_stop,
        **kwargs,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.testing.wait_all_tasks_blocked()
        yield worker
        if not worker._stopping.is_set():  # stop() was not called: end it at once
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


def an_executor(
    store: Store,
    registry: Registry | None = None,
    settings: Settings | None = None,
    **kwargs: Any,
) -> Executor:
    """The executor of a Worker "w1", made without the Worker (`executing` runs its
    Worker-level tasks). `kwargs` go to the Executor (tracer, events); `fail_stop` is a
    `Failstops` unless given."""
    kwargs.setdefault("fail_stop", Failstops())
    return Executor(store, registry or Registry(), settings or Settings(), worker_id="w1", **kwargs)


async def claimed(store: MemoryStore, kind: str, scope: str | None = None) -> WorkItem:
    """An item of `kind` enqueued, and claimed by Worker "w1" (lease 60 s)."""
    await store.enqueue(kind, scope=scope)
    (item,) = await store.claim_batch("w1", 60.0, 1, kinds=[kind])
    return item


def assert_gave_up(store: ScriptedStore, tracer: Tracer, op: str, deadline: float) -> None:
    """The write `op` was tried until its `deadline`, the last try before it and within
    the longest backoff (2.4 s) of it, and then given up: the one attempt traced ended
    write_failed at that last try."""
    last = store.times[op][-1]
    assert deadline - 2.4 <= last < deadline, store.times[op]
    (trace,) = tracer.traces
    assert (trace.ended, trace.ended_at) == ([("write_failed", None)], [last])


def a_slot() -> Slot:
    """A slot of a Worker of its own (for an executor run without a Worker)."""
    (slot,) = Slots(1, lambda: None).take_free()
    return slot


def sleeping(
    seconds: float = float("inf"), started: list[float] | None = None
) -> Callable[[WorkItem, Context], Awaitable[None]]:
    """A handler that sleeps (forever, by default), noting in `started` when each call
    began."""

    async def handler(item: WorkItem, ctx: Context) -> None:
        if started is not None:
            started.append(trio.current_time())
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
