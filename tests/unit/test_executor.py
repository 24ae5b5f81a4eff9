"""The executor on Trio's virtual clock, with a scripted in-memory store: what an
operator sees of each attempt (its log lines, events, trace) and the write that follows.

Defaults throughout: lease 60 s, heartbeat every 10 s, self-stop 30 s after the last
heartbeat that succeeded (the claim counts as the first), stop grace 15 s. The claim and
the handler's start are at virtual time 0.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import trio
import trio.testing

from tests.support.fakes import (
    Failstops,
    ScriptedStore,
    Sink,
    Tracer,
    a_slot,
    always,
    an_executor,
    assert_gave_up,
    claimed,
    executing,
    gaps,
    messages,
    records,
    running,
    sleeping,
)
from trioworker import Context, Registry, RetryPolicy, Settings, Status, WorkItem
from trioworker._core.policy import Action, Decision
from trioworker._store.api import HANDLER_STORE_METHODS, HandlerStore, WorkerStore
from trioworker._worker.executor import too_late

EXECUTOR = "trioworker.executor"
NO_JITTER = RetryPolicy(max_attempts=2, initial_delay=10.0, jitter=0.0)


def writes(store: ScriptedStore) -> list[tuple[str, bool]]:
    return [(w.op, w.applied) for w in store.writes if w.op != "heartbeat"]


async def test_failing_heartbeats_are_logged_and_traced_until_the_self_stop(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Each failed heartbeat says how long until the self-stop; the self-stop at 30 s
    is logged, counted and traced, and no heartbeat follows it."""
    caplog.set_level(logging.INFO)
    store, registry, tracer, sink = ScriptedStore(), Registry(), Tracer(), Sink()
    registry.handler("Crawl")(sleeping())
    store.script["heartbeat"] = ["fail"] * 10
    item = await store.enqueue("Crawl", scope="7")
    async with running(store, registry, tracer=tracer, metrics=sink) as worker:
        await trio.sleep(40)
    assert store.times["heartbeat"] == [10.0, 20.0]
    assert messages(caplog, EXECUTOR) == [
        "heartbeat of 1 attempt(s) failed (heartbeat: down); the first self-stops in 20.0s"
        " unless one succeeds",
        "heartbeat of 1 attempt(s) failed (heartbeat: down); the first self-stops in 10.0s"
        " unless one succeeds",
        "self-stopped: no heartbeat succeeded for 30.0s (half the lease);"
        " writing nothing, lease recovery will requeue it",
    ]
    stopped = records(caplog, "self-stopped")[0]
    assert (stopped.item_id, stopped.worker_id, stopped.kind) == (item.id, "w1", "Crawl")  # type: ignore[attr-defined]
    (trace,) = tracer.traces
    assert trace.item.id == item.id
    assert trace.events == [
        ("heartbeat_failed", "heartbeat: down"),
        ("heartbeat_failed", "heartbeat: down"),
        ("self_stopped", None),
    ]
    assert trace.ended == [("self_stopped", None)]
    assert worker.statistics().events == {"claimed": 1, "self_stopped": 1}
    assert ("self_stopped", "Crawl", None) in sink.seen
    assert writes(store) == []


async def test_a_heartbeat_without_an_answer_is_cut_off_and_the_next_one_still_runs(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat sent at 10 s hangs: it is given up at 20 s (one interval), logged
    and traced; the one sent at 20 s succeeds, so the handler (35 s long) completes."""
    caplog.set_level(logging.INFO)
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()
    registry.handler("Crawl")(sleeping(35))
    store.script["heartbeat"] = ["hang"]
    await store.enqueue("Crawl", scope="7")
    async with running(store, registry, tracer=tracer):
        await trio.sleep(40)
    assert store.times["heartbeat"] == [10.0, 20.0, 30.0]
    assert messages(caplog, EXECUTOR, logging.WARNING) == [
        "heartbeat of 1 attempt(s) failed (no answer within 10s); the first self-stops in"
        " 10.0s unless one succeeds",
    ]
    (trace,) = tracer.traces
    assert trace.events == [("heartbeat_failed", "no answer within 10s")]
    assert trace.ended == [("complete", None)]
    assert store.items()[0].status is Status.SUCCEEDED


async def test_a_slow_heartbeat_reports_its_round_trip_and_counts_from_its_send_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A heartbeat answered after 4 s reports a 4 s round trip, and the self-stop
    deadline runs from when it was sent (10 + 30 = 40 s), not from its answer."""
    store, registry, sink = ScriptedStore(), Registry(), Sink()
    cancelled: list[float] = []

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.append(trio.current_time())

    store.script["heartbeat"] = [4.0, "fail", "fail", "fail"]
    await store.enqueue("Crawl", scope="7")
    async with running(store, registry, metrics=sink):
        await trio.sleep(50)
    assert sink.named("heartbeat_rtt") == [("heartbeat_rtt", "", 4.0)]
    assert cancelled == [40.0]


async def test_a_handler_that_will_not_stop_after_a_self_stop_fail_stops_the_process(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Self-stop at 30 s, stop grace 15 s: at 45 s the Worker fail-stops, saying why."""
    store, registry, failstops = ScriptedStore(), Registry(), Failstops()

    @registry.handler("Stubborn")
    async def stubborn(item: WorkItem, ctx: Context) -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(1000)

    store.script["heartbeat"] = always("fail")
    await store.enqueue("Stubborn")
    async with running(store, registry, fail_stop=failstops):
        await trio.sleep(50)
    message = (
        "handler of item 1 (attempt 1, kind Stubborn) did not stop within 15s of being"
        " cancelled (self_stop); its file side effects cannot be trusted to stop, so the"
        " Worker stops"
    )
    assert failstops.calls == [(45.0, message)]
    critical = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert [r.getMessage() for r in critical] == [message]
    assert critical[0].item_id == 1  # type: ignore[attr-defined]


async def test_the_fail_stop_names_the_reason_of_the_cancel(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A cancel request reaches the handler at the 10 s heartbeat; a handler that
    ignores it fail-stops the process at 10 + 15 s, naming the cancel request."""
    store, registry, failstops = ScriptedStore(), Registry(), Failstops()

    @registry.handler("Stubborn")
    async def stubborn(item: WorkItem, ctx: Context) -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(1000)

    await store.enqueue("Stubborn")
    async with running(store, registry, fail_stop=failstops):
        await store.cancel(1)
        await trio.sleep(30)
    ((at, message),) = failstops.calls
    assert at == 25.0
    assert "did not stop within 15s of being cancelled (cancel_requested)" in message


async def test_a_lost_attempt_is_logged_counted_and_traced_as_lost(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat at 10 s finds another attempt owns the item: the handler is
    cancelled, the attempt writes nothing and says it was lost."""
    caplog.set_level(logging.INFO)
    store, registry, tracer, sink = ScriptedStore(), Registry(), Tracer(), Sink()
    registry.handler("Crawl")(sleeping())
    await store.enqueue("Crawl", scope="7")
    async with running(store, registry, tracer=tracer, metrics=sink) as worker:
        store.expire_lease(1)
        await store.recover_expired_leases(max_stalls=3)
        assert await store.claim("other", 60.0, kinds=["Crawl"])
        await trio.sleep(12)
    assert messages(caplog, EXECUTOR) == [
        "lost: another attempt owns the item now; writing nothing"
    ]
    assert tracer.traces[0].ended == [("lost", None)]
    assert tracer.traces[0].events == []
    assert worker.statistics().events == {"claimed": 1, "lost": 1}
    assert ("lost", "Crawl", None) in sink.seen
    assert writes(store) == []


async def test_an_attempt_the_worker_abandons_ends_its_trace_and_writes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The Worker is cancelled outright (a second signal) mid-attempt: its trace still
    ends, "abandoned", with the Cancelled that ended it; nothing is written."""
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()
    registry.handler("Crawl")(sleeping())
    await store.enqueue("Crawl")
    async with running(store, registry, tracer=tracer):
        await trio.sleep(5)
    assert tracer.traces[0].ended == [("abandoned", None)]
    assert writes(store) == []


async def test_an_attempt_ended_by_a_bug_ends_its_trace_with_the_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A store that raises something no store should (not a StoreError) when the
    attempt writes: the error propagates (Trio's rule), and the trace ends "abandoned"
    with it."""
    boom = RuntimeError("a bug in a store")

    class BrokenStore(ScriptedStore):
        async def retry_later(self, *args: object, **kwargs: object) -> bool:
            raise boom

    @registry_with("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        raise ValueError("retry me")

    store, tracer = BrokenStore(), Tracer()
    item = await claimed(store, "Crawl")
    executor = an_executor(store, crawl.registry, tracer=tracer)
    with pytest.raises(RuntimeError) as raised:
        await executor.run(item, trio.current_time(), a_slot())
    assert raised.value is boom
    assert tracer.traces[0].ended == [("abandoned", boom)]
    assert executor.in_flight == 0 and not executor.running


async def test_a_cancel_request_writes_cancelled_and_notes_what_the_handler_raised(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """After a cancel request the handler raising is noted (and ignored): the item is
    Cancelled, and the trace ends "cancel" with the error."""
    caplog.set_level(logging.INFO)
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()
    oops = ValueError("oops")

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            raise oops from None

    await store.enqueue("Crawl")
    async with running(store, registry, tracer=tracer) as worker:
        await store.cancel(1)
        await trio.sleep(12)
    assert messages(caplog, EXECUTOR) == [
        "stopped (cancel_requested)",
        "after the cancel the handler raised ValueError: oops; ignored",
    ]
    assert tracer.traces[0].ended == [("cancel", oops)]
    assert worker.statistics().events == {"claimed": 1, "cancel": 1}
    assert writes(store) == [("cancel", True)]


async def test_a_failing_handler_is_retried_then_failed_with_its_traceback(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The retry and the final failure are logged with the handler's traceback, and the
    item keeps it; the traces end "retry", then "fail", each with the error."""
    caplog.set_level(logging.INFO)
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()
    errors: list[OSError] = []
    tracebacks: list[str | None] = []
    kept: list[str | None] = []

    @registry.handler("Flaky", retry=NO_JITTER)
    async def flaky(item: WorkItem, ctx: Context) -> None:
        state = await ctx.store.get_item(item.id)
        assert state is not None
        tracebacks.append(state.traceback)
        kept.append(state.error)
        errors.append(OSError("disk on fire"))
        raise errors[-1]

    await store.enqueue("Flaky")
    async with running(store, registry, tracer=tracer) as worker:
        await trio.sleep(20)
    assert messages(caplog, EXECUTOR) == [
        "handler failed (OSError: disk on fire); retrying in 10.0s",
        "handler failed for good: failed 2 of 2 attempts (OSError: disk on fire)",
    ]
    retried, failed = records(caplog, "handler failed")
    assert (retried.levelno, failed.levelno) == (logging.WARNING, logging.ERROR)
    for record in (retried, failed):  # as text: never formatted again from the exception
        assert record.exc_info is None
        assert record.traceback.startswith("Traceback")  # type: ignore[attr-defined]
        assert record.traceback.endswith("OSError: disk on fire\n")  # type: ignore[attr-defined]
    assert [t.ended for t in tracer.traces] == [[("retry", errors[0])], [("fail", errors[1])]]
    assert tracebacks[0] is None
    assert kept == [None, "OSError: disk on fire"]
    assert tracebacks[1] is not None and "OSError: disk on fire" in tracebacks[1]
    state = store.items()[0]
    assert (state.status, state.reason) == (Status.FAILED, "failed 2 of 2 attempts")
    assert state.traceback is not None and state.traceback.startswith("Traceback")
    assert worker.statistics().events == {"claimed": 2, "retry": 1, "fail": 1}


async def test_a_kinds_timeout_cancels_the_handler_and_counts_as_a_failure(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """timeout=25: the handler is cancelled 25 s after it started (heartbeats went
    well), and the attempt is a handler failure, retried by the kind's policy, then
    failed."""
    caplog.set_level(logging.INFO)
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()
    cancelled: list[float] = []
    started: list[float] = []

    @registry.handler("Slow", retry=NO_JITTER, timeout=25)
    async def slow(item: WorkItem, ctx: Context) -> None:
        started.append(trio.current_time())
        try:
            await trio.sleep_forever()
        finally:
            cancelled.append(trio.current_time())

    await store.enqueue("Slow")
    async with running(store, registry, tracer=tracer):
        await trio.sleep(70)
    assert started == [0.0, 35.0]
    assert cancelled == [25.0, 60.0]
    assert messages(caplog, EXECUTOR) == [
        "handler failed (HandlerTimeout: timed out after 25s); retrying in 10.0s",
        "handler failed for good: failed 2 of 2 attempts (HandlerTimeout: timed out after 25s)",
    ]
    assert tracer.outcomes() == ["retry", "fail"]
    state = store.items()[0]
    assert (state.status, state.error) == (Status.FAILED, "HandlerTimeout: timed out after 25s")


async def test_a_handler_within_its_timeout_completes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A handler that finishes inside its timeout is neither cancelled nor failed."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("Quick", timeout=5)(sleeping(4))
    await store.enqueue("Quick")
    async with running(store, registry):
        await trio.sleep(10)
    assert store.items()[0].status is Status.SUCCEEDED


async def test_the_handler_gets_its_item_and_the_workers_context(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The handler sees its claimed item, the Worker's id, the attempt's deadline and
    whether it must stop (never its scope), the file limiter, a logger carrying the
    item's fields, and the store."""
    store, registry = ScriptedStore(), Registry()
    seen: list[object] = []

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        seen.extend([item.id, item.attempt, item.kind, ctx.item.id, ctx.worker_id])
        seen.extend([ctx.deadline, ctx.stopping, ctx.completed_in_transaction])
        seen.extend([ctx.limiter.total_tokens, ctx.store.enqueue.__self__ is store])  # type: ignore[attr-defined]
        seen.append(ctx.log.extra)
        assert ctx.log is ctx.log  # made once
        await trio.sleep(12)  # the heartbeat at 10 s moves the deadline
        seen.append(ctx.deadline)

    await store.enqueue("Crawl", scope="7")
    async with running(store, registry, Settings(max_concurrent_files=3)):
        await trio.sleep(15)
    assert seen == [
        1, 1, "Crawl", 1, "w1", 30.0, False, False, 3, True,
        {"item_id": 1, "attempt": 1, "kind": "Crawl", "scope": "7", "worker_id": "w1"},
        40.0,
    ]  # fmt: skip


async def test_a_handler_cannot_reach_the_attempts_scope(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`ctx.cancel_scope` is gone, with an error saying what to read instead; nothing
    a handler holds moves or cancels the attempt's deadline, and the deadline cancels a
    handler that opens wider scopes of its own inside (a cut link: heartbeats fail)."""
    store, registry = ScriptedStore(), Registry()
    errors: list[str] = []
    cancelled: list[float] = []

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        try:
            ctx.cancel_scope.deadline = math.inf
        except AttributeError as exc:
            errors.append(str(exc))
        with pytest.raises(AttributeError):
            ctx.deadline = math.inf  # type: ignore[misc]
        try:
            with trio.CancelScope(deadline=math.inf):
                await trio.sleep(1000)
        finally:
            cancelled.append(trio.current_time())

    store.script["heartbeat"] = always("fail")
    await store.enqueue("Crawl")
    async with running(store, registry):
        await trio.sleep(40)
    assert errors == [
        "ctx.cancel_scope is gone: the attempt's cancel scope belongs to the Worker. Read"
        " ctx.deadline and ctx.stopping; for a time limit of the handler's own, open a"
        " scope inside it (with trio.move_on_after(...): ...)"
    ]
    assert cancelled == [30.0]
    assert writes(store) == []


async def test_a_completion_goes_through_the_workers_batcher(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A Worker's completions are batched (one complete_batch call), and retried with
    a short, capped backoff through an outage: 0.2 s, doubling, at most 2 s (+/- 20%)."""
    caplog.set_level(logging.INFO)
    store, registry, tracer, sink = ScriptedStore(), Registry(), Tracer(), Sink()
    registry.handler("Crawl")(sleeping(1))
    store.script["complete_batch"] = ["fail"] * 6
    await store.enqueue("Crawl")
    async with running(store, registry, tracer=tracer, metrics=sink) as worker:
        await trio.sleep(20)
    assert "complete" not in store.calls
    times = store.times["complete_batch"]
    assert times[0] == 1.0 and len(times) == 7
    for gap, base in zip(gaps(times), [0.2, 0.4, 0.8, 1.6, 2.0, 2.0], strict=True):
        assert base * 0.8 - 1e-9 <= gap <= base * 1.2 + 1e-9
    assert [m.rpartition(" in ")[0] for m in messages(caplog, EXECUTOR)] == [
        "could not record 1 completion(s) (complete_batch: down); retrying"
    ] * 6
    assert tracer.outcomes() == ["complete"]
    assert worker.statistics().events == {"claimed": 1, "complete": 1}
    assert ("complete", "Crawl", None) in sink.seen
    assert ("handler_duration", "Crawl", 1.0) in sink.seen


async def test_a_write_that_keeps_failing_gives_up_at_the_self_stop_deadline(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A cancel request stops the handler at the 10 s heartbeat (which moved the
    deadline to 40 s); the Cancelled write fails until then: the last try is before
    the deadline, the next would be at or after it, so the write gives up, leaving the
    item to lease recovery."""
    caplog.set_level(logging.INFO)
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()
    registry.handler("Crawl")(sleeping())
    await store.enqueue("Crawl")
    store.script["cancel"] = always("fail")
    async with running(store, registry, tracer=tracer):
        await store.cancel(1)
        await trio.sleep(50)
    times = store.times["cancel"]
    # It keeps trying from 10 s, with the write's backoff (0.2 s doubling to 2 s, +/- 20%)...
    assert times[0] == 10.0
    for n, gap in enumerate(gaps(times), start=1):
        base = min(2.0, 0.2 * 2 ** (n - 1))
        assert base * 0.8 - 1e-9 <= gap <= base * 1.2 + 1e-9, (n, gap)
    # ...until the next try would come at or after the deadline (40 s): the last one is
    # before it, within the longest delay (2.4 s), and the write gives up right there.
    assert 40.0 - 2.4 <= times[-1] < 40.0
    (trace,) = tracer.traces
    assert (trace.ended, trace.ended_at) == ([("write_failed", None)], [times[-1]])
    tries = messages(caplog, EXECUTOR, logging.WARNING)
    assert tries[:-1] == ["could not record cancel (cancel: down); retrying"] * (len(times) - 1)
    assert tries[-1] == (
        "could not record cancel before the self-stop deadline; lease recovery will take the item"
    )
    assert records(caplog, "could not record")[-1].levelno == logging.ERROR
    # Nothing written: the item is still this attempt's, Running, for lease recovery.
    assert writes(store) == []
    (state,) = store.items()
    assert (state.status, state.attempt, state.worker_id) == (Status.RUNNING, 1, "w1")


def test_a_retry_at_or_after_the_deadline_is_too_late() -> None:
    """The write gives up when its next try would come at or after the deadline."""
    assert too_late(10.0, 5.0, 15.0)
    assert too_late(10.0, 5.5, 15.0)
    assert not too_late(10.0, 4.5, 15.0)
    assert not too_late(0.0, 1.0, 15.0)


async def test_a_write_fenced_out_is_logged_and_counted_as_lost(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The item is taken over while the handler runs (no heartbeat noticed): the
    completion is fenced out, logged, and counted as lost."""
    caplog.set_level(logging.INFO)
    store, registry, tracer, sink = ScriptedStore(), Registry(), Tracer(), Sink()

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        store.expire_lease(item.id)
        await store.recover_expired_leases(max_stalls=3)
        assert await store.claim("other", 60.0, kinds=["Crawl"])

    await store.enqueue("Crawl")
    async with running(store, registry, tracer=tracer, metrics=sink) as worker:
        await trio.sleep(5)
    assert messages(caplog, EXECUTOR) == ["complete was fenced out: the attempt had lost the item"]
    assert tracer.outcomes() == ["fenced_out"]
    assert worker.statistics().events == {"claimed": 1, "lost": 1}
    assert ("lost", "Crawl", None) in sink.seen


async def test_a_completion_inside_the_handlers_transaction_holds_the_scope_until_it_returns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """tx.complete() makes the success durable with the handler's writes, but the item
    stays Running, holding its scope, while the handler's cleanup runs (it is not
    cancelled); once the handler has returned, the Worker finishes it Succeeded and
    the scope's next item runs."""
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()
    seen: list[tuple[float, str, Status | None]] = []

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        if item.payload == "second":
            seen.append((trio.current_time(), "second starts", None))
            return
        try:
            async with ctx.transaction() as tx:
                tx.complete()
            await trio.sleep(3)  # a cleanup that checkpoints: not cancelled
        finally:
            state = await ctx.store.get_item(item.id)
            seen.append((trio.current_time(), "cleanup done", state and state.status))

    await store.enqueue("Crawl", scope="7")
    await store.enqueue("Crawl", scope="7", payload="second")
    async with running(store, registry, Settings(concurrency=2), tracer=tracer) as worker:
        await trio.sleep(5)
    assert seen == [
        (3.0, "cleanup done", Status.RUNNING),
        (3.0, "second starts", None),
    ]
    assert tracer.outcomes() == ["succeeded_in_transaction", "complete"]
    assert worker.statistics().events == {
        "claimed": 2, "succeeded_in_transaction": 1, "complete": 1,
    }  # fmt: skip
    assert [i.status for i in store.items()] == [Status.SUCCEEDED, Status.SUCCEEDED]


def registry_with(kind: str, **options: object) -> Any:
    """A decorator registering a handler of `kind` on a registry of its own, reachable
    as the handler's `.registry`."""

    def register(handler: Any) -> Any:
        handler.registry = Registry()
        handler.registry.handler(kind, **options)(handler)
        return handler

    return register


# -- the executor on its own ---------------------------------------------------------


async def test_an_item_of_a_kind_without_a_handler_is_released(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A claimed item the registry has no handler for goes back, untouched."""
    store, tracer = ScriptedStore(), Tracer()
    item = await claimed(store, "Mystery")
    executor = an_executor(store, tracer=tracer)
    with trio.fail_after(100):
        assert await executor.run(item, 0.0, a_slot()) == Decision(Action.RELEASE)
    assert messages(caplog, EXECUTOR) == [
        "claimed an item of kind 'Mystery', which has no handler here"
    ]
    assert records(caplog, "claimed an item")[0].worker_id == "w1"  # type: ignore[attr-defined]
    assert tracer.traces[0].item == item
    assert tracer.traces[0].ended == [("release", None)]
    assert writes(store) == [("release", True)]
    assert executor.in_flight == 0


async def test_releasing_an_unknown_kind_gives_up_at_the_deadline(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """That release, too, is retried until half a lease after the claim (sent at 2 s)."""
    store, tracer = ScriptedStore(), Tracer()
    await trio.sleep(2)
    item = await claimed(store, "Mystery")
    store.script["release"] = always("fail")
    executor = an_executor(store, tracer=tracer)
    with trio.fail_after(100):
        await executor.run(item, 2.0, a_slot())
    assert_gave_up(store, tracer, "release", 32.0)


async def test_a_write_is_never_sent_once_the_deadline_has_passed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An item claimed 31 s ago (its deadline passed before it ran) that must be
    released: nothing is sent at all, the first try included."""
    store, tracer = ScriptedStore(), Tracer()
    await trio.sleep(31)
    item = await claimed(store, "Mystery")
    executor = an_executor(store, tracer=tracer)
    assert await executor.run(item, 0.0, a_slot()) == Decision(Action.RELEASE)
    assert "release" not in store.calls
    assert tracer.outcomes() == ["write_failed"]


async def test_stop_bounds_are_published_as_deadlines_move(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`on_earliest_stop` is told when the handler must have ended (deadline + stop
    grace 15 s) when the attempt starts, at each heartbeat that moves the deadline, and
    when it ends (inf)."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("Crawl")(sleeping(25))
    item = await claimed(store, "Crawl")
    seen: list[float] = []
    executor = an_executor(store, registry, on_earliest_stop=seen.append)
    assert executor.stops.earliest == math.inf
    with trio.fail_after(100):
        async with executing(executor):
            await executor.run(item, 0.0, a_slot())
    assert seen == [45.0, 55.0, 65.0, math.inf]


async def test_attempts_that_share_a_bound_keep_it_published_until_the_last_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two attempts claimed together share a bound (45 s) and a third, claimed at 2 s,
    has its own (47 s); each heartbeat renews all of them at once: the earliest stays
    the first two's until both have ended or moved, and is published once a change."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("Short")(sleeping(5))
    registry.handler("Long")(sleeping(25))
    registry.handler("Later")(sleeping(9))
    short, long, later = [await claimed(store, k) for k in ("Short", "Long", "Later")]
    seen: list[tuple[float, float]] = []

    def published(at: float) -> None:
        seen.append((trio.current_time(), at))

    executor = an_executor(store, registry, on_earliest_stop=published)
    with trio.fail_after(100):
        async with executing(executor), trio.open_nursery() as nursery:
            nursery.start_soon(executor.run, short, 0.0, a_slot())
            nursery.start_soon(executor.run, long, 0.0, a_slot())
            await trio.sleep(2)
            nursery.start_soon(executor.run, later, 2.0, a_slot())
    assert seen == [
        (0.0, 45.0),  # both start (the second adds to the same bound)
        (10.0, 55.0),  # the heartbeat renews both (the short one ended at 5 s)
        (20.0, 65.0),  # the later one ended at 11 s; the long one is renewed again
        (25.0, math.inf),  # the long one ends
    ]


async def test_after_shutdown_a_starting_attempt_is_released_at_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """An attempt that starts once the shutdown grace is over is cancelled and released."""
    caplog.set_level(logging.INFO)
    store, registry = ScriptedStore(), Registry()
    registry.handler("Crawl")(sleeping())
    item = await claimed(store, "Crawl")
    executor = an_executor(store, registry)
    executor.shut_down()
    with trio.fail_after(100):
        assert await executor.run(item, 0.0, a_slot()) == Decision(Action.RELEASE)
    assert trio.current_time() == 0.0
    assert messages(caplog, EXECUTOR) == ["stopped (shutdown)"]
    assert writes(store) == [("release", True)]


async def test_a_shutdown_during_a_self_stopped_handlers_cleanup_writes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Self-stop at 30 s; the handler cleans up for 5 s; the shutdown's cancel at 31 s
    does not turn the self-stop into a release: the attempt still writes nothing."""
    store, registry = ScriptedStore(), Registry()

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(5)

    item = await claimed(store, "Crawl")
    store.script["heartbeat"] = always("fail")
    executor = an_executor(store, registry)
    decisions: list[Decision] = []

    async def run() -> None:
        decisions.append(await executor.run(item, 0.0, a_slot()))

    with trio.fail_after(100):
        async with executing(executor), trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await trio.sleep(31)
            executor.shut_down()
    assert decisions == [Decision(Action.NOTHING)]
    assert writes(store) == []


class SpawnedTasks(trio.abc.Instrument):
    """The names of the tasks spawned while it is installed."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.names.append(task.name.rpartition(".")[2])


async def test_an_attempt_spawns_no_task_of_its_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Heartbeats, timeouts and the fail-stop are the Worker's, not an attempt's: a
    handler that runs past heartbeats and one that times out start no task; the
    heartbeats still come on time (10 s and 20 s), and the timeout too (3 s)."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("Slow", timeout=100.0)(sleeping(25.0))
    registry.handler("TimedOut", timeout=3.0)(sleeping(50.0))
    executor = an_executor(store, registry)
    decisions: dict[str, Action] = {}
    async with executing(executor):
        for kind in ("Slow", "TimedOut"):
            item = await claimed(store, kind)
            tasks = SpawnedTasks()
            trio.lowlevel.add_instrument(tasks)
            started = trio.current_time()
            try:
                decisions[kind] = (await executor.run(item, started, a_slot())).action
            finally:
                trio.lowlevel.remove_instrument(tasks)
            assert tasks.names == [], kind
            ended = trio.current_time() - started
            assert ended == (25.0 if kind == "Slow" else 3.0), kind
    assert store.times["heartbeat"] == [10.0, 20.0]
    assert decisions == {"Slow": Action.COMPLETE, "TimedOut": Action.RETRY}


async def test_one_heartbeat_statement_renews_every_attempt_a_worker_holds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """64 attempts held: one heartbeat statement an interval, whatever the concurrency,
    carrying all 64; an attempt claimed between two beats is renewed at the next."""
    asked: list[int] = []

    class Counting(ScriptedStore):
        async def heartbeat_many(self, attempts: Any, lease: float) -> Any:
            asked.append(len(attempts))
            return await super().heartbeat_many(attempts, lease)

    store, registry = Counting(), Registry()
    registry.handler("Crawl")(sleeping(45))
    for _ in range(65):
        await store.enqueue("Crawl")
    items = await store.claim_batch("w1", 60.0, 65, kinds=["Crawl"])
    executor = an_executor(store, registry)
    with trio.fail_after(100):
        async with executing(executor), trio.open_nursery() as nursery:
            for item in items[:64]:
                nursery.start_soon(executor.run, item, 0.0, a_slot())
            await trio.sleep(15)
            nursery.start_soon(executor.run, items[64], 15.0, a_slot())
    assert asked == [64, 65, 65, 65, 1, 1]  # 10, 20, 30, 40 s; the last alone at 50, 60 s
    assert [i.status for i in store.items()] == [Status.SUCCEEDED] * 65


async def test_a_handler_gets_the_handler_face_and_nothing_of_the_workers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`ctx.store` offers exactly the HandlerStore interface: no claim, heartbeat,
    fenced write, recovery or advertisement a handler could call behind its Worker's
    back."""
    store, registry = ScriptedStore(), Registry()
    offered: list[set[str]] = []

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        offered.append({n for n in dir(ctx.store) if not n.startswith("_")})

    await store.enqueue("Crawl")
    async with running(store, registry):
        await trio.sleep(1)
    client = {n for n in vars(HandlerStore) if not n.startswith("_")}
    worker = {n for n in vars(WorkerStore) if not n.startswith("_")} - {"statistics"}
    assert offered == [client] and set(HANDLER_STORE_METHODS) == client
    assert not offered[0] & worker
    assert {"claim", "claim_batch", "complete", "fail", "cancel_attempt", "release",
            "recover_expired_leases", "heartbeat_many", "fenced_transaction"} <= worker  # fmt: skip


async def test_an_executor_survives_running_the_same_attempt_twice_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """After a failover lost a claim with the old primary, the new primary can hand
    this Worker the same item again (even the same attempt number) while its first
    run goes on: each run is tracked on its own, the first to end leaves the other's
    bound in place, and both end without error (issue 22's KeyError)."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("Crawl")(sleeping(5))
    item = await claimed(store, "Crawl")
    executor = an_executor(store, registry)
    decisions: list[Decision] = []

    async def run(at: float) -> None:
        await trio.sleep_until(at)
        decisions.append(await executor.run(item, at, a_slot()))

    with trio.fail_after(100):
        async with executing(executor), trio.open_nursery() as nursery:
            nursery.start_soon(run, 0.0)
            nursery.start_soon(run, 2.0)
            await trio.sleep(3)
            assert len(executor.running) == 2
            assert executor.stops.earliest == 45.0
            await trio.sleep(3)  # the first run is over at 5 s
            assert len(executor.running) == 1
            assert executor.stops.earliest == 47.0
            await trio.sleep(3)
            assert executor.in_flight == 0
    assert len(executor.running) == 0
    assert decisions == [Decision(Action.COMPLETE), Decision(Action.COMPLETE)]
    assert writes(store) == [("complete", True), ("complete", False)]


async def test_the_log_copies_no_more_of_a_handlers_error_than_the_item_keeps(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A 20-million-character exception message (retried, failed, and raised again
    after a cancel) writes at most the stored error and traceback's bounds to the log,
    in text and JSON alike: not 40 MB."""
    from trioworker._core.policy import ERROR_LIMIT, TRACEBACK_LIMIT
    from trioworker._worker.logging import JsonFormatter, TextFormatter

    caplog.set_level(logging.INFO)
    store, registry = ScriptedStore(), Registry()
    huge = "x" * 20_000_000

    @registry.handler("Huge", retry=NO_JITTER)
    async def fails(item: WorkItem, ctx: Context) -> None:
        raise RuntimeError(huge)

    @registry.handler("Stubborn")
    async def raises_after_the_cancel(item: WorkItem, ctx: Context) -> None:
        try:
            await trio.sleep_forever()
        finally:
            raise RuntimeError(huge)

    await store.enqueue("Huge")
    stubborn = await store.enqueue("Stubborn")
    async with running(store, registry):
        await trio.sleep(5)
        await store.cancel(stubborn.id)
        await trio.sleep(20)
    logged = [r for r in caplog.records if r.name.startswith("trioworker")]
    assert sum("handler failed" in r.getMessage() for r in logged) == 2
    assert any("after the cancel the handler raised" in r.getMessage() for r in logged)
    bound = ERROR_LIMIT + TRACEBACK_LIMIT + 1000
    for formatter in (TextFormatter(), JsonFormatter()):
        sizes = [len(formatter.format(r)) for r in logged]
        assert max(sizes) < bound, (type(formatter).__name__, sizes)
