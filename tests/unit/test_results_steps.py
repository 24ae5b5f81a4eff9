"""Results and durable steps in the Worker (issue 34), on Trio's virtual clock with the
in-memory store: a handler's return value is its item's result, written with its
Succeeded (or, unstorable, failing the attempt); `ctx.step` runs its function once per
item across attempts, recording it fenced by the attempt and before its deadline."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
import trio
import trio.testing

from tests.support.fakes import ScriptedStore, Sink, Tracer, messages, running
from trioworker import (
    Context,
    DoNotRetry,
    Lost,
    Registry,
    RetryPolicy,
    Settings,
    Status,
    UnstorableResult,
    WorkItem,
)

EXECUTOR = "trioworker.executor"
ONCE = RetryPolicy(max_attempts=1)
TWICE = RetryPolicy(max_attempts=2, initial_delay=1.0, jitter=0.0)


class BatchSpy(ScriptedStore):
    """Records what each complete_batch was given."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[list[tuple[int, int]], list[str | None] | None]] = []

    async def complete_batch(
        self, attempts: Sequence[tuple[int, int]], results: Sequence[str | None] | None = None
    ) -> set[int]:
        self.batches.append((list(attempts), None if results is None else list(results)))
        return await super().complete_batch(attempts, results)


async def test_a_handlers_return_value_is_its_items_result(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """What the handler returns is stored with its Succeeded, in the completion's one
    write; a batch in which no handler returned anything is the plain finish, without
    results."""
    store, registry = BatchSpy(), Registry()

    @registry.handler("Thumb")
    async def thumb(item: WorkItem, ctx: Context) -> Any:
        await trio.sleep(1 if item.payload else 5)
        return {"thumbnail": f"{item.payload}.jpg", "size": [320, 240]} if item.payload else None

    with_result = await store.enqueue("Thumb", payload="a")
    without = await store.enqueue("Thumb")
    async with running(store, registry, Settings(concurrency=2)):
        await trio.sleep(10)
    state = {i.id: i for i in store.items()}
    assert state[with_result.id].status is Status.SUCCEEDED
    assert state[with_result.id].result == {"thumbnail": "a.jpg", "size": [320, 240]}
    assert (state[without.id].status, state[without.id].result) == (Status.SUCCEEDED, None)
    assert store.batches == [
        ([(with_result.id, 1)], ['{"thumbnail":"a.jpg","size":[320,240]}']),
        ([(without.id, 1)], None),
    ]
    assert await store.result(with_result.id, timeout=1) == {
        "thumbnail": "a.jpg", "size": [320, 240],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("returned", "error"),
    [
        (object(), "UnstorableResult: result is not JSON-serialisable: Object of type object"),
        ({1.5: float("nan")}, "UnstorableResult: result is not JSON-serialisable: Out of range"),
        ("x" * 70_000, "UnstorableResult: result is 70002 bytes as JSON; the limit is 65536"),
        (None, None),
    ],
)
async def test_a_result_that_cannot_be_stored_fails_the_attempt_and_stores_nothing(
    autojump_clock: trio.testing.MockClock, returned: Any, error: str | None
) -> None:
    """Not JSON, too big: the attempt fails with UnstorableResult as its error (the
    kind's retry policy applies: here none), and no result is stored."""
    store, registry = ScriptedStore(), Registry()

    @registry.handler("Thumb", retry=ONCE)
    async def thumb(item: WorkItem, ctx: Context) -> Any:
        return returned

    item = await store.enqueue("Thumb")
    async with running(store, registry):
        await trio.sleep(5)
    (state,) = store.items()
    if error is None:
        assert (state.status, state.result) == (Status.SUCCEEDED, None)
        return
    assert (state.status, state.result) == (Status.FAILED, None)
    assert state.error is not None and state.error.startswith(error), state.error
    assert state.reason == "failed 1 of 1 attempts"
    with pytest.raises(Exception, match=f"item {item.id} ended Failed: failed 1 of 1"):
        await store.result(item.id, timeout=1)


async def test_a_result_nested_too_deeply_fails_the_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """65 levels of lists: UnstorableResult, as a payload would be refused."""
    store, registry = ScriptedStore(), Registry()
    deep: list[Any] = []
    for _ in range(64):
        deep = [deep]

    @registry.handler("Thumb", retry=ONCE)
    async def thumb(item: WorkItem, ctx: Context) -> Any:
        return deep

    await store.enqueue("Thumb")
    async with running(store, registry):
        await trio.sleep(5)
    (state,) = store.items()
    assert state.status is Status.FAILED and state.result is None
    assert state.error == "UnstorableResult: result nests deeper than 64 levels (the table's limit)"


async def test_a_result_completed_in_the_handlers_transaction_stands(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`tx.complete(result=...)` stores the result in that commit; what the handler
    returns after it is not stored over it."""
    store, registry = BatchSpy(), Registry()

    @registry.handler("Thumb")
    async def thumb(item: WorkItem, ctx: Context) -> Any:
        async with ctx.transaction() as tx:
            tx.complete(result={"in": "transaction"})
        return "returned after"

    await store.enqueue("Thumb")
    async with running(store, registry):
        await trio.sleep(5)
    (state,) = store.items()
    assert (state.status, state.result) == (Status.SUCCEEDED, {"in": "transaction"})
    assert store.batches == [([(1, 1)], None)]


async def test_a_step_runs_once_across_attempts(autojump_clock: trio.testing.MockClock) -> None:
    """The first attempt runs each step's function and records its value; it then
    fails. The retry gets the recorded values back without calling the functions, and
    runs only the step the first did not reach. Values come back as stored JSON reads
    them (a tuple as a list), on the first attempt too."""
    store, registry = ScriptedStore(), Registry()
    calls: list[tuple[int, str]] = []
    seen: list[Any] = []

    async def scan(folder: str, attempt: int) -> Any:
        calls.append((attempt, folder))
        await trio.sleep(1)
        return (folder, ["a.jpg"])

    @registry.handler("Crawl", retry=TWICE)
    async def crawl(item: WorkItem, ctx: Context) -> None:
        seen.append(await ctx.step("scan /a", scan, "/a", item.attempt))
        seen.append(await ctx.step("scan /b", scan, "/b", item.attempt))
        if item.attempt == 1:
            raise OSError("disk went away")
        seen.append(await ctx.step("scan /c", scan, "/c", item.attempt))

    item = await store.enqueue("Crawl")
    async with running(store, registry):
        await trio.sleep(20)
    assert calls == [(1, "/a"), (1, "/b"), (2, "/c")]
    assert seen == [["/a", ["a.jpg"]], ["/b", ["a.jpg"]]] * 2 + [["/c", ["a.jpg"]]]
    assert store.items()[0].status is Status.SUCCEEDED
    details = await store.show(item.id)
    assert details is not None
    assert [(s.name, s.attempt) for s in details.steps] == [
        ("scan /a", 1), ("scan /b", 1), ("scan /c", 2),
    ]  # fmt: skip


async def test_a_stale_attempts_step_is_refused_and_the_attempt_stops_as_lost(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """While the step's function ran, the item's lease was taken back and another
    Worker claimed it: the record is refused (nothing stored), the handler gets Lost,
    and the attempt stops as lost, writing nothing."""
    caplog.set_level(logging.INFO)
    store, registry, tracer, sink = ScriptedStore(), Registry(), Tracer(), Sink()
    raised: list[BaseException] = []

    async def scan() -> str:
        store.expire_lease(1)
        await store.recover_expired_leases(max_stalls=3)
        assert await store.claim("other", 60.0, kinds=["Crawl"])
        return "scanned"

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        try:
            await ctx.step("scan", scan)
        except Lost as exc:
            raised.append(exc)
            raise

    await store.enqueue("Crawl", scope="7")
    async with running(store, registry, tracer=tracer, metrics=sink) as worker:
        await trio.sleep(5)
    assert len(raised) == 1 and "no longer owns the item" in str(raised[0])
    assert await store.step(1, "scan") == (False, None)
    assert messages(caplog, EXECUTOR) == [
        "lost: another attempt owns the item now; writing nothing"
    ]
    assert tracer.outcomes() == ["lost"]
    assert worker.statistics().events == {"claimed": 1, "lost": 1}
    assert [w.op for w in store.writes if w.op != "heartbeat"] == []


async def test_a_step_is_not_recorded_past_the_attempts_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No heartbeat succeeds; the step's function (shielded) returns after the
    self-stop deadline: its value is not recorded, so a later attempt runs it again."""
    store, registry = ScriptedStore(), Registry()
    store.script["heartbeat"] = ["fail"] * 10
    raised: list[BaseException] = []

    async def slow() -> int:
        with trio.CancelScope(shield=True):
            await trio.sleep(35)
        return 1

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        try:
            await ctx.step("slow", slow)
        except BaseException as exc:
            raised.append(exc)
            raise

    await store.enqueue("Crawl")
    async with running(store, registry, Settings(stop_grace=20.0)):
        await trio.sleep(40)
    assert await store.step(1, "slow") == (False, None)
    assert [type(e).__name__ for e in raised] == ["SelfStopped"]
    assert store.items()[0].status is Status.RUNNING  # lease recovery's now


async def test_a_lost_link_while_recording_a_step_is_a_stall_not_a_failure(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """DatabaseUnavailable from the record: the attempt writes nothing (lease recovery
    requeues it as a stall), as for the handler's own fenced transaction."""
    caplog.set_level(logging.INFO)
    store, registry = ScriptedStore(), Registry()
    store.script["fenced_transaction"] = ["fail"]

    async def scan() -> int:
        return 1

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        await ctx.step("scan", scan)

    await store.enqueue("Crawl")
    async with running(store, registry):
        await trio.sleep(5)
    assert store.items()[0].status is Status.RUNNING
    assert [w.op for w in store.writes if w.op != "heartbeat"] == []
    lines = messages(caplog, EXECUTOR)
    assert any("lost PostgreSQL in the attempt's transaction" in m for m in lines)


@pytest.mark.parametrize("name", ["", 7, "x" * 201])
async def test_a_step_needs_a_name(autojump_clock: trio.testing.MockClock, name: Any) -> None:
    """A step's name is a non-empty string of at most 200 characters: else ValueError,
    before anything runs."""
    store, registry = ScriptedStore(), Registry()
    raised: list[BaseException] = []
    ran: list[int] = []

    async def fn() -> int:
        ran.append(1)
        return 1

    @registry.handler("Crawl", retry=ONCE)
    async def crawl(item: WorkItem, ctx: Context) -> None:
        try:
            await ctx.step(name, fn)
        except ValueError as exc:
            raised.append(exc)
            raise DoNotRetry(str(exc)) from exc

    await store.enqueue("Crawl")
    async with running(store, registry):
        await trio.sleep(5)
    assert ran == [] and len(raised) == 1
    assert "a step's name is a non-empty string of at most 200 characters" in str(raised[0])


async def test_a_steps_value_that_cannot_be_stored_raises_naming_the_step(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """UnstorableResult names the step; nothing is recorded. A step returning None
    records None, and a name of 200 characters is fine. The record is a fenced
    transaction under the Worker's fenced_server_timeout."""
    store, registry = ScriptedStore(), Registry()
    raised: list[BaseException] = []
    got: list[Any] = []
    long_name = "s" * 200

    async def unstorable() -> Any:
        return {"when": object()}

    async def nothing() -> None:
        return None

    @registry.handler("Crawl", retry=ONCE)
    async def crawl(item: WorkItem, ctx: Context) -> None:
        try:
            await ctx.step("bad value", unstorable)
        except UnstorableResult as exc:
            raised.append(exc)
        got.append(await ctx.step(long_name, nothing))
        got.append(await ctx.step(long_name, unstorable))  # recorded: not called

    await store.enqueue("Crawl")
    async with running(store, registry, Settings(lease=40)):
        await trio.sleep(5)
    assert [str(e) for e in raised] == [
        "step 'bad value''s value is not JSON-serialisable: Object of type object is not"
        " JSON serializable"
    ]
    assert got == [None, None]
    assert await store.step(1, "bad value") == (False, None)
    assert await store.step(1, long_name) == (True, None)
    assert store.server_timeouts == [Settings(lease=40).fenced_server_timeout]
    assert store.items()[0].status is Status.SUCCEEDED


async def test_two_tasks_of_one_attempt_in_one_step_get_the_first_recorded_value(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two tasks of the handler run a step of the same name at once: both functions run
    (neither was recorded when they began), the first to record wins, and both tasks
    get its value."""
    store, registry = ScriptedStore(), Registry()
    got: list[Any] = []

    async def value(n: int, delay: float) -> int:
        await trio.sleep(delay)
        return n

    async def take(ctx: Context, n: int, delay: float) -> None:
        got.append(await ctx.step("same", value, n, delay))

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(take, ctx, 1, 1.0)
            nursery.start_soon(take, ctx, 2, 2.0)

    await store.enqueue("Crawl")
    async with running(store, registry):
        await trio.sleep(5)
    assert got == [1, 1]
    assert await store.step(1, "same") == (True, 1)


async def test_a_lost_link_while_reading_parent_results_is_a_stall_not_a_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """DatabaseUnavailable from `ctx.parent_results()` propagating out of the handler:
    the attempt writes nothing (lease recovery requeues it as a stall), as for a step;
    read again on the next try, it gives the parents' results by id."""
    store, registry = ScriptedStore(), Registry()
    store.script["parent_results"] = ["fail"]
    seen: list[dict[int, Any]] = []

    @registry.handler("Thumb")
    async def thumb(item: WorkItem, ctx: Context) -> str:
        return f"thumb {item.id}"

    @registry.handler("Bursts", retry=ONCE)
    async def bursts(item: WorkItem, ctx: Context) -> None:
        seen.append(await ctx.parent_results())

    a = (await store.enqueue("Thumb")).id
    b = (await store.enqueue("Thumb")).id
    child = (await store.enqueue("Bursts", after=[b, a])).id
    async with running(store, registry):
        await trio.sleep(5)
    states = {s.id: s for s in store.items()}
    assert states[child].status is Status.RUNNING and states[child].failures == 0
    assert seen == []
    store.expire_lease(child)
    assert [r.status for r in await store.recover_expired_leases(max_stalls=3)] == [Status.QUEUED]
    async with running(store, registry):
        await trio.sleep(5)
    assert seen == [{a: f"thumb {a}", b: f"thumb {b}"}]
    assert {s.id: s.status for s in store.items()}[child] is Status.SUCCEEDED
