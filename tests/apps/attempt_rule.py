"""A test app for the attempt rule on real processes (issue 31): handlers that outlive
their deadline, reach for their scope, clean up after completing their item, or raise
what no handler should; each notes what it did in the observer log ($TW_OBSERVER_LOG,
see tests/apps/recording.py), the outside view the tests judge by.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import trio
import trio.lowlevel

from tests.apps.recording import (
    heartbeats_stopped,
    monotonic_deadline,
    note,
    record,
    record_attempt,
)
from trioworker import Context, Registry, RetryPolicy, WorkItem

registry = Registry()
registry.handler("Record")(record_attempt)


@registry.handler("Outwaits")
async def outwaits(item: WorkItem, ctx: Context) -> None:
    """Runs until payload["until"] exists (the test's sign that other items are done),
    recording its start and end."""
    record("start", item, ctx)
    until = trio.Path(item.payload["until"])
    while not await until.exists():  # noqa: ASYNC110  another process's sign
        await trio.sleep(0.05)
    record("end", item, ctx)


ONCE = RetryPolicy(max_attempts=1)
#: The kind TimedOut's timeout: shorter than half the tests' lease, so it comes first.
TIMEOUT = 2.5


async def outlives_its_deadline(item: WorkItem, ctx: Context) -> None:
    """Attempt 1 waits to be cancelled (by its kind's timeout, or the shutdown), then
    cleans up, shielded, until its heartbeats have stopped getting through (notes its
    self-stop deadline then), and on until payload["healed"] exists (the test heals
    the link past that deadline) and payload["after_heal"] seconds more. Later
    attempts just run."""
    record("start", item, ctx)
    if item.attempt > 1:
        record("end", item, ctx)
        return
    try:
        await trio.sleep_forever()
    except trio.Cancelled:
        note("cancelled", item, ctx)
        with trio.CancelScope(shield=True):
            deadline = await heartbeats_stopped(ctx, float(item.payload["heartbeat"]))
            note("cleanup", item, ctx, deadline=deadline)
            healed = trio.Path(item.payload["healed"])
            while not await healed.exists():  # noqa: ASYNC110  another process's sign
                await trio.sleep(0.02)
            await trio.sleep(float(item.payload["after_heal"]))
        record("end", item, ctx)
        raise


registry.handler("TimedOut", retry=ONCE, timeout=TIMEOUT)(outlives_its_deadline)
registry.handler("ShutDown", retry=ONCE)(outlives_its_deadline)


@registry.handler("ReachesForItsScope", retry=ONCE)
async def reaches_for_its_scope(item: WorkItem, ctx: Context) -> None:
    """Moves its scope's deadline away (payload["how"] "move") or cancels it ("cancel"),
    as 0.1 let a handler."""
    record("start", item, ctx)
    if item.payload["how"] == "move":
        ctx.cancel_scope.deadline = math.inf  # type: ignore[assignment]  # as 0.1 let it
    else:
        ctx.cancel_scope.cancel()
    await trio.sleep(0.1)
    record("end", item, ctx)


@registry.handler("Defiant")
async def defiant(item: WorkItem, ctx: Context) -> None:
    """On the Worker payload["holder"] names: tries to switch its self-stop off (moving
    its scope's deadline away), catches its cancel, and goes on shielded, noting a
    tick (with its self-stop deadline) every 0.1 s, forever. Elsewhere it just runs."""
    record("start", item, ctx)
    if ctx.worker_id == item.payload["holder"]:
        with contextlib.suppress(AttributeError):
            ctx.cancel_scope.deadline = math.inf  # type: ignore[assignment]  # as 0.1 let it
        try:
            while True:
                note("tick", item, ctx, deadline=monotonic_deadline(ctx))
                await trio.sleep(0.1)
        except trio.Cancelled:
            note("cancelled", item, ctx)
        with trio.CancelScope(shield=True):
            while True:
                note("tick", item, ctx, deadline=monotonic_deadline(ctx))
                await trio.sleep(0.1)
    record("end", item, ctx)


@registry.handler("CleansUp")
async def cleans_up(item: WorkItem, ctx: Context) -> None:
    """Completes its item in its fenced transaction, then cleans up (removing its
    temporary folder, say) for payload["seconds"], shielded as Trio cleanup is: its
    end line is written once that is over, however the handler ends."""
    record("start", item, ctx)
    try:
        async with ctx.transaction() as tx:
            tx.complete()
    finally:
        with trio.CancelScope(shield=True):
            await trio.sleep(float(item.payload["seconds"]))
        record("end", item, ctx)


def raising(error: type[BaseException]) -> Callable[[object], str]:
    def method(self: object) -> str:
        raise error

    return method


def hostile(method: str, error: type[BaseException]) -> Exception:
    """An exception whose `method` (__str__ or __repr__) raises `error`."""
    made: Exception = type("Hostile", (Exception,), {method: raising(error)})()
    return made


async def forged_cancelled() -> trio.Cancelled:
    """A real trio.Cancelled, caught from a scope of the handler's own: raised again
    outside it, it is no cancellation of anything."""
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled as exc:
            return exc
    raise AssertionError("not cancelled")


def nested(depth: int) -> ExceptionGroup[Exception]:
    group: ExceptionGroup[Exception] = ExceptionGroup("deeper", [ValueError("at the bottom")])
    for _ in range(depth - 1):
        group = ExceptionGroup("deeper", [group])
    return group


@registry.handler("Hostile", retry=ONCE)
async def hostile_handler(item: WorkItem, ctx: Context) -> None:
    """Raises what payload["raise"] names, 0.1 s after it starts; "repr raises
    KeyboardInterrupt after a cancel request" waits for the cancel instead, and raises
    it from its `finally`."""
    what = item.payload["raise"]
    record("start", item, ctx)
    if what != "repr raises KeyboardInterrupt after a cancel request":
        await trio.sleep(0.1)
    if what == "forged Cancelled":
        raise await forged_cancelled()
    if what == "forged Cancelled in a group":
        raise BaseExceptionGroup("forged", [await forged_cancelled()])
    if what == "ExceptionGroup nested 2,000 deep":
        raise nested(2_000)
    if what == "repr raises KeyboardInterrupt after a cancel request":
        try:
            await trio.sleep_forever()
        finally:
            raise hostile("__repr__", KeyboardInterrupt)
    method, error = {
        "str raises KeyboardInterrupt": ("__str__", KeyboardInterrupt),
        "str raises SystemExit": ("__str__", SystemExit),
        "str raises BaseException": ("__str__", BaseException),
    }[what]
    raise hostile(method, error)
