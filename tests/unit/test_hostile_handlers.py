"""What a handler raises or stores never ends its Worker (issue 18), on Trio's virtual
clock with the scripted in-memory store: every exception becomes the item's error by its
policy, a refused write is recorded smaller, an undecodable payload fails its own item,
a completed item ends its attempt, and a lost database link is a stall."""

from __future__ import annotations

import logging
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from tests.support.fakes import (
    ScriptedStore,
    Sink,
    Tracer,
    a_slot,
    always,
    an_executor,
    assert_gave_up,
    claimed,
    executing,
    messages,
    running,
    sleeping,
)
from trioworker import (
    Context,
    DatabaseUnavailable,
    ItemState,
    Lost,
    Registry,
    RetryPolicy,
    Status,
    WorkItem,
)
from trioworker._core.jsontext import UndecodableValue
from trioworker._core.policy import UNSTORABLE_ERROR, Action, Decision

EXECUTOR = "trioworker.executor"
ONCE = RetryPolicy(max_attempts=1)


def writes(store: ScriptedStore) -> list[tuple[str, bool]]:
    return [(w.op, w.applied) for w in store.writes if w.op != "heartbeat"]


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


async def raises_a_child(exc: BaseException) -> None:
    async def child() -> None:
        raise exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(child)
        nursery.start_soon(trio.sleep_forever)


@pytest.mark.parametrize(
    ("raised", "error"),
    [
        (KeyboardInterrupt(), "KeyboardInterrupt"),
        (SystemExit(3), "SystemExit: 3"),
        (BaseException("bare"), "BaseException: bare"),
        (GeneratorExit(), "GeneratorExit"),
        (BrokenStr(), "BrokenStr: <str() of the error raised RuntimeError>"),
        (ValueError("caf\udce9\x00"), "ValueError: caf\\udce9\\x00"),
    ],
)
async def test_whatever_a_handler_raises_fails_its_item_and_the_worker_goes_on(
    autojump_clock: trio.testing.MockClock, raised: BaseException, error: str
) -> None:
    """The item is Failed by its policy with the error's text, storable; the trace ends
    "fail" with the exception; the next item still completes."""
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()

    @registry.handler("Hostile", retry=ONCE)
    async def hostile(item: WorkItem, ctx: Context) -> None:
        await trio.sleep(1)
        raise raised

    registry.handler("Quick")(sleeping(1))
    bad = await store.enqueue("Hostile")
    async with running(store, registry, tracer=tracer) as worker:
        await trio.sleep(5)
        good = await store.enqueue("Quick")
        await trio.sleep(5)
        assert worker.statistics().events == {"claimed": 2, "fail": 1, "complete": 1}
    states = {s.id: s for s in store.items()}
    assert (states[bad.id].status, states[bad.id].error) == (Status.FAILED, error)
    assert states[bad.id].reason == "failed 1 of 1 attempts"
    assert states[good.id].status is Status.SUCCEEDED
    assert tracer.traces[0].ended == [("fail", raised)]


async def test_a_group_from_the_handlers_own_nursery_is_its_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A KeyboardInterrupt in a child task of the handler's nursery comes out as a
    group: it is the handler's error too, retried by its policy."""
    store, registry = ScriptedStore(), Registry()

    @registry.handler("Group", retry=RetryPolicy(max_attempts=2, initial_delay=5, jitter=0))
    async def group(item: WorkItem, ctx: Context) -> None:
        await raises_a_child(KeyboardInterrupt())

    await store.enqueue("Group")
    async with running(store, registry) as worker:
        await trio.sleep(20)
        assert worker.statistics().events == {"claimed": 2, "retry": 1, "fail": 1}
    [state] = store.items()
    assert state.error is not None and state.error.startswith("BaseExceptionGroup: ")


async def test_the_workers_own_cancellation_still_goes_through_a_handlers_group(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelled at once while a handler's child turns its Cancelled into an error: the
    group holds Trio's cancellation, which goes on up (the handler's own error is
    logged, not raised with it); nothing is decided or written for the attempt, which
    is left to lease recovery."""
    caplog.set_level(logging.INFO)
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()

    async def turns_cancel_into_error() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            raise ValueError("cancelled, and cross about it") from None

    @registry.handler("Cross")
    async def cross(item: WorkItem, ctx: Context) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(turns_cancel_into_error)
            await trio.sleep_forever()  # the Worker's Cancelled comes out with the error

    await store.enqueue("Cross")
    async with running(store, registry, tracer=tracer):
        await trio.sleep(5)
    assert messages(caplog, EXECUTOR) == [
        "as the Worker stopped, the handler raised"
        " BaseExceptionGroup: Exceptions from Trio nursery (2 sub-exceptions); ignored"
    ]
    assert tracer.traces[0].ended == [("abandoned", None)]
    assert writes(store) == []


async def test_a_write_the_database_refuses_is_recorded_reduced_not_left_to_stall(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The failure's write is refused (not for want of a connection) twice as it was
    and once cut short: the fixed text is recorded, at once, and the item is Failed by
    its policy rather than stalled."""
    caplog.set_level(logging.INFO)
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()

    @registry.handler("Bad", retry=ONCE)
    async def bad(item: WorkItem, ctx: Context) -> None:
        raise ValueError("x" * 1000)

    store.script["fail"] = ["refuse", "refuse", "refuse"]
    await store.enqueue("Bad")
    async with running(store, registry, tracer=tracer):
        await trio.sleep(5)
    [state] = store.items()
    assert (state.status, state.error, state.traceback) == (
        Status.FAILED,
        UNSTORABLE_ERROR,
        None,
    )
    assert store.times["fail"] == [0.0] * 4
    refused = [m for m in messages(caplog, EXECUTOR) if m.startswith("the database refused")]
    assert refused == [
        "the database refused fail (fail: refused); trying again",
        "the database refused fail (fail: refused); recording it reduced",
        "the database refused fail (fail: refused); recording it reduced",
    ]
    assert tracer.outcomes() == ["fail"]


async def test_a_write_refused_in_every_form_is_retried_until_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Nothing left to cut (a completion has no text): it is retried with backoff until
    the self-stop deadline, then left to lease recovery."""
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()
    registry.handler("Crawl")(sleeping(1))
    item = await claimed(store, "Crawl")
    store.script["complete_batch"] = always("refuse")
    executor = an_executor(store, registry, tracer=tracer)
    with trio.fail_after(100):
        async with executing(executor):
            await executor.run(item, 0.0, a_slot())
    assert store.times["complete_batch"][0] == 1.0
    assert 30.0 - 2.4 <= store.times["complete_batch"][-1] < 30.0 <= trio.current_time()
    assert tracer.outcomes() == ["write_failed"]


async def run_undecodable(**changes: Any) -> tuple[Decision, ItemState]:
    """A claimed Quick item with `changes` (what could not be read back) run by the
    executor; its decision and the item's state after it. The handler never ran, and
    the attempt was traced and counted as a fail."""
    store, registry, tracer, sink = ScriptedStore(), Registry(), Tracer(), Sink()
    ran: list[WorkItem] = []

    @registry.handler("Quick")
    async def quick(item: WorkItem, ctx: Context) -> None:
        ran.append(item)

    item = await claimed(store, "Quick")
    executor = an_executor(store, registry, tracer=tracer, events=sink)
    with trio.fail_after(100):
        decision = await executor.run(attrs.evolve(item, **changes), 0.0, a_slot())
    assert ran == []
    assert tracer.outcomes() == ["fail"]
    assert sink.named("fail") == [("fail", "Quick", None)]
    [state] = store.items()
    return decision, state


async def test_an_item_whose_payload_cannot_be_decoded_is_failed_without_running(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """What PostgreSQL stores but Python cannot read back comes as an UndecodableValue:
    its item fails at once with the reason; the handler never sees it."""
    decision, state = await run_undecodable(payload=UndecodableValue("nested too deeply", "[[["))
    assert decision == Decision(
        Action.FAIL,
        reason="payload cannot be decoded",
        error="UndecodablePayload: the payload nested too deeply",
    )
    assert (state.status, state.reason) == (Status.FAILED, "payload cannot be decoded")
    assert messages(caplog, EXECUTOR) == [
        "the payload cannot be decoded (nested too deeply): failing the item without running it"
    ]


async def test_an_item_whose_time_cannot_be_decoded_is_failed_without_running(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A claimed item whose requested_at psycopg could not load (the store names it in
    `undecodable`) fails at once, through the one write of any failure, naming the
    column and why; the handler never sees it."""
    why = "cannot be decoded: timestamp too large (after year 10K): 'infinity'"
    decision, state = await run_undecodable(
        requested_at=None, undecodable=(("requested_at", why), ("run_after", why))
    )
    assert decision == Decision(
        Action.FAIL,
        reason="requested_at, run_after cannot be decoded",
        error=f"UndecodableValue: requested_at {why}; run_after {why}",
    )
    assert (state.status, state.reason) == (
        Status.FAILED,
        "requested_at, run_after cannot be decoded",
    )
    assert messages(caplog, EXECUTOR) == [
        f"a stored value cannot be decoded (requested_at {why}; run_after {why}): failing"
        " the item without running it"
    ]


async def test_a_handler_that_goes_on_after_completing_its_item_keeps_its_scope(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Once the completing transaction commits, the item's success is durable, but the
    handler is not cancelled: it goes on (its cleanup, say) with the scope still its
    own, and whatever it raises then changes nothing: the item is finished Succeeded
    once it has returned, and the log says what was ignored."""
    caplog.set_level(logging.INFO)
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()
    after: list[str] = []

    @registry.handler("GoesOn")
    async def goes_on(item: WorkItem, ctx: Context) -> None:
        async with ctx.transaction() as tx:
            tx.complete()
        after.append("sync code runs")
        await trio.sleep(1)
        after.append("and so does the rest")
        raise ValueError("cleanup broke")

    @registry.handler("Returns")
    async def returns(item: WorkItem, ctx: Context) -> None:
        async with ctx.transaction() as tx:
            tx.complete()

    await store.enqueue("GoesOn", scope="s")
    await store.enqueue("Returns", scope="t")
    async with running(store, registry, tracer=tracer) as worker:
        await trio.sleep(5)
        assert worker.statistics().events == {"claimed": 2, "succeeded_in_transaction": 2}
    assert after == ["sync code runs", "and so does the rest"]
    assert messages(caplog, EXECUTOR, logging.INFO) == [
        "after completing its item the handler raised ValueError: cleanup broke; ignored"
    ]
    assert tracer.outcomes() == ["succeeded_in_transaction"] * 2
    assert {s.status for s in store.items()} == {Status.SUCCEEDED}


async def test_a_lost_database_link_in_the_attempts_transaction_is_a_stall(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """ctx.transaction() raises DatabaseUnavailable and the handler lets it go: even at
    max_attempts=1 the attempt writes nothing (no failure counted), lease recovery
    requeues it as a stall, and the next attempt completes."""
    caplog.set_level(logging.INFO)
    store, registry, tracer, sink = ScriptedStore(), Registry(), Tracer(), Sink()

    @registry.handler("Blip", retry=ONCE)
    async def blip(item: WorkItem, ctx: Context) -> None:
        async with ctx.transaction() as tx:
            tx.complete()

    store.script["fenced_transaction"] = ["fail"]
    await store.enqueue("Blip")
    async with running(store, registry, tracer=tracer, metrics=sink) as worker:
        await trio.sleep(120)
        assert worker.statistics().events["database_lost"] == 1
    [state] = store.items()
    assert (state.status, state.failures, state.stalls) == (Status.SUCCEEDED, 0, 1)
    assert tracer.outcomes() == ["database_lost", "succeeded_in_transaction"]
    assert writes(store) == [("complete_in_transaction", True), ("complete", True)]
    assert sink.named("database_lost") == [("database_lost", "Blip", None)]
    assert [m for m in messages(caplog, EXECUTOR) if m.startswith("lost PostgreSQL")] == [
        "lost PostgreSQL in the attempt's transaction (DatabaseUnavailable:"
        " fenced_transaction: down);"
        " writing nothing, lease recovery will requeue it as a stall"
    ]


@pytest.mark.parametrize("grouped", [False, True])
async def test_a_lost_link_the_handler_passes_on_in_a_group_is_still_a_stall(
    autojump_clock: trio.testing.MockClock, grouped: bool
) -> None:
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()

    async def transact(ctx: Context) -> None:
        async with ctx.transaction():
            pass

    @registry.handler("Blip", retry=ONCE)
    async def blip(item: WorkItem, ctx: Context) -> None:
        if not grouped:
            await transact(ctx)
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(transact, ctx)

    store.script["fenced_transaction"] = ["fail"]
    await store.enqueue("Blip")
    async with running(store, registry, tracer=tracer):
        await trio.sleep(5)
    assert tracer.outcomes() == ["database_lost"]
    assert writes(store) == []


async def test_a_handler_that_turns_a_lost_link_into_its_own_error_has_failed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Only the transaction's own DatabaseUnavailable is the Worker's problem: a
    handler that raises something else instead, or a DatabaseUnavailable of its own,
    has failed."""
    store, registry = ScriptedStore(), Registry()

    @registry.handler("Rewraps", retry=ONCE)
    async def rewraps(item: WorkItem, ctx: Context) -> None:
        try:
            async with ctx.transaction():
                pass
        except DatabaseUnavailable:
            raise RuntimeError("gave up") from None

    @registry.handler("Own", retry=ONCE)
    async def own(item: WorkItem, ctx: Context) -> None:
        raise DatabaseUnavailable("my own")

    store.script["fenced_transaction"] = ["fail"]
    await store.enqueue("Rewraps", scope="a")
    await store.enqueue("Own", scope="b")
    async with running(store, registry):
        await trio.sleep(5)
    assert sorted((s.kind, s.status, s.error) for s in store.items()) == [
        ("Own", Status.FAILED, "DatabaseUnavailable: my own"),
        ("Rewraps", Status.FAILED, "RuntimeError: gave up"),
    ]


async def test_failing_an_undecodable_item_gives_up_at_the_self_stop_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """That failure, too, is retried through an outage until half a lease after the
    claim (sent at 2 s), then left to lease recovery."""
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()
    registry.handler("Quick")(sleeping(0))
    await trio.sleep(2)
    item = await claimed(store, "Quick")
    poisoned = attrs.evolve(item, payload=UndecodableValue("too deep", "[[["))
    store.script["fail"] = always("fail")
    executor = an_executor(store, registry, tracer=tracer)
    with trio.fail_after(100):
        await executor.run(poisoned, 2.0, a_slot())
    assert_gave_up(store, tracer, "fail", 32.0)


async def test_a_handler_that_raises_lost_writes_nothing_and_is_traced_as_lost(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()

    @registry.handler("Gone")
    async def gone(item: WorkItem, ctx: Context) -> None:
        raise Lost("the item was taken back")

    await store.enqueue("Gone")
    async with running(store, registry, tracer=tracer):
        await trio.sleep(5)
    assert [outcome for outcome, _ in tracer.traces[0].ended] == ["lost"]
    assert writes(store) == []
