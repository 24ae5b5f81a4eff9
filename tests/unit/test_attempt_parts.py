"""The attempt's parts on their own, on Trio's virtual clock: what a handler raised
walked as data (`raised`), the heartbeat's answers, the completion batcher's drops and
retries, the fail-stop's bounds, and the small edges of the executor's log and writes.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import Sequence
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
    claimed,
    executing,
    gaps,
    messages,
    running,
    sleeping,
)
from trioworker import Context, Registry, RetryPolicy, Settings, Status, WorkItem
from trioworker._core.model import Heartbeat
from trioworker._worker.attempt import Attempt
from trioworker._worker.raised import holds, leaves, only_cancelled

EXECUTOR = "trioworker.executor"
CUT = Settings(lease=12.0, heartbeat=1.0, stop_grace=5.0)


# -- what a handler raised, walked as data -------------------------------------------


class ListsItself(ExceptionGroup):  # type: ignore[type-arg]
    @property
    def exceptions(self) -> Any:  # type: ignore[override]
        return (self, self, ValueError("inside"))


class Endless(ExceptionGroup):  # type: ignore[type-arg]
    @property
    def exceptions(self) -> Any:  # type: ignore[override]
        return (ValueError(str(n)) for n in itertools.count())


class Unreadable(ExceptionGroup):  # type: ignore[type-arg]
    @property
    def exceptions(self) -> Any:  # type: ignore[override]
        raise KeyboardInterrupt


def test_leaves_walks_groups_once_each_and_past_whatever_they_do() -> None:
    """A group listing itself is walked once; an endless one up to the limit; one
    whose `exceptions` raises holds nothing, and the walk goes on past it."""
    itself = ListsItself("g", [ValueError("x")])
    assert [str(e) for e in leaves(itself)] == ["inside"]
    assert sum(1 for _ in leaves(Endless("g", [ValueError("x")]))) == 100_000 - 1
    first = ValueError("first")
    mixed = BaseExceptionGroup("m", [first, Unreadable("u", [ValueError("x")])])
    assert list(leaves(mixed)) == [first]
    assert holds(mixed, first) and not holds(None, first) and not holds(mixed, KeyError())


def test_only_cancelled_is_trios_cancellation_and_nothing_else() -> None:
    cancelled = trio.Cancelled._create(source="explicit")  # type: ignore[call-arg]
    assert only_cancelled(cancelled)
    assert only_cancelled(BaseExceptionGroup("g", [cancelled, cancelled]))
    assert not only_cancelled(BaseExceptionGroup("g", [cancelled, ValueError()]))
    assert not only_cancelled(None) and not only_cancelled(ValueError())


# -- the heartbeat's answers ---------------------------------------------------------


class Unanswered(ScriptedStore):
    """Gives no answer for item 1's rows (another transaction holds them)."""

    async def heartbeat_many(
        self, attempts: Sequence[tuple[int, int]], lease: float
    ) -> dict[tuple[int, int], Heartbeat]:
        answers = await super().heartbeat_many(attempts, lease)
        return {key: answer for key, answer in answers.items() if key[0] != 1}


async def test_an_attempt_whose_row_is_held_elsewhere_is_not_renewed_but_others_are(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Item 1's row gets no answer: its deadline stays (self-stop at 30 s) and its trace
    says why; the others beside it are renewed all the same."""
    store, registry, tracer = Unanswered(), Registry(), Tracer()
    deadlines: dict[int, float] = {}

    @registry.handler("A")
    async def a(item: WorkItem, ctx: Context) -> None:
        await trio.sleep(15)
        deadlines[item.id] = ctx.deadline

    for scope in "xyz":
        await store.enqueue("A", scope=scope)
    async with running(store, registry, Settings(concurrency=3), tracer=tracer):
        await trio.sleep(16)
    assert deadlines == {1: 30.0, 2: 40.0, 3: 40.0}
    held = next(t for t in tracer.traces if t.item.id == 1)
    assert held.events == [("heartbeat_failed", "its row is held by a transaction")]


async def test_a_heartbeat_answered_after_its_handler_ended_leaves_no_bound(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The heartbeat sent at 10 s answers at 14 s; the handler ended at 12 s: the
    answer moves nothing, so no stale bound is left for the fail-stop to fire at."""
    store, registry, failstops = ScriptedStore(), Registry(), Failstops()
    registry.handler("A")(sleeping(12))
    store.script["heartbeat"] = [4.0]
    item = await claimed(store, "A")
    executor = an_executor(store, registry, fail_stop=failstops)
    async with executing(executor):
        await executor.run(item, 0.0, a_slot())
        assert executor.stops.earliest == float("inf")
        await trio.sleep(100)
    assert failstops.calls == []
    assert (await store.get_item(item.id)).status is Status.SUCCEEDED  # type: ignore[union-attr]


# -- the completion batcher ----------------------------------------------------------


class SlowThenDown(ScriptedStore):
    """Its first complete_batch takes 2 s and then fails; later ones answer."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[int]] = []

    async def complete_batch(self, attempts: Sequence[tuple[int, int]]) -> set[int]:
        self.batches.append([id for id, _ in attempts])
        if len(self.batches) == 1:
            await trio.sleep(2)
            raise self.down()
        return await super().complete_batch(attempts)

    @staticmethod
    def down() -> Exception:
        from trioworker import DatabaseUnavailable

        return DatabaseUnavailable("complete_batch: down")


async def test_completions_that_arrive_while_a_statement_fails_all_go_out_next(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Item 1's completion goes out at 1 s and fails at 3 s; item 2's, at 2 s, waits:
    the retry carries both, the failed one first."""
    store, registry = SlowThenDown(), Registry()
    registry.handler("One")(sleeping(1))
    registry.handler("Two")(sleeping(2))
    await store.enqueue("One", scope="a")
    await store.enqueue("Two", scope="b")
    async with running(store, registry, Settings(concurrency=2)):
        await trio.sleep(10)
    assert store.batches == [[1], [1, 2]]
    assert [i.status for i in store.items()] == [Status.SUCCEEDED, Status.SUCCEEDED]


async def test_a_completion_past_its_deadline_is_dropped_and_the_batcher_goes_on(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Item 1's completion is refused until past its deadline (6 s: heartbeats fail
    until 3 s) and dropped, said so; item 2, renewed from 4 s and finished at 9 s, is
    still completed once its own refusals are over."""
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()
    registry.handler("One")(sleeping(1))
    registry.handler("Two")(sleeping(9))
    store.script["complete_batch"] = ["refuse"] * 8  # all of item 1's tries, and some
    await store.enqueue("One", scope="a")
    await store.enqueue("Two", scope="b")
    async with running(store, registry, Settings(lease=12.0, heartbeat=1.0, concurrency=2),
                       tracer=tracer):  # fmt: skip
        store.script["heartbeat"] = always("fail")
        await trio.sleep(3)
        del store.script["heartbeat"]
        await trio.sleep(10)
    one, two = store.items()
    assert (one.status, two.status) == (Status.RUNNING, Status.SUCCEEDED)
    assert sorted(tracer.outcomes()) == ["complete", "write_failed"]
    assert (
        "could not record complete before the self-stop deadline; lease recovery will take the item"
    ) in messages(caplog, EXECUTOR)


# -- the executor's edges ------------------------------------------------------------


async def test_a_write_is_retried_with_a_short_capped_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A retry's write through an outage: tries 0.2 s apart, doubling, at most 2 s
    (+/- 20%), until it goes through."""
    store, registry = ScriptedStore(), Registry()

    @registry.handler("Flaky", retry=RetryPolicy(max_attempts=2, initial_delay=100.0))
    async def flaky(item: WorkItem, ctx: Context) -> None:
        raise ValueError("again")

    store.script["retry_later"] = ["fail"] * 6
    await store.enqueue("Flaky")
    async with running(store, registry):
        await trio.sleep(12)
    times = store.times["retry_later"]
    assert len(times) == 7
    for gap, base in zip(gaps(times), [0.2, 0.4, 0.8, 1.6, 2.0, 2.0], strict=True):
        assert base * 0.8 - 1e-9 <= gap <= base * 1.2 + 1e-9


async def test_a_retry_fenced_out_is_said_and_counted_as_lost(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    store, registry, sink = ScriptedStore(), Registry(), Sink()

    @registry.handler("Taken")
    async def taken(item: WorkItem, ctx: Context) -> None:
        store.expire_lease(item.id)
        await store.recover_expired_leases(max_stalls=3)
        raise ValueError("retry me")

    await store.enqueue("Taken")
    async with running(store, registry, metrics=sink):
        await trio.sleep(1)
    assert "retry was fenced out: the attempt had lost the item" in messages(caplog, EXECUTOR)
    assert ("lost", "Taken", None) in sink.seen


async def test_a_completed_attempt_that_self_stopped_says_recovery_will_finish_it(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    store, registry = ScriptedStore(), Registry()

    @registry.handler("Done")
    async def done(item: WorkItem, ctx: Context) -> None:
        async with ctx.transaction() as tx:
            tx.complete()
        store.script["heartbeat"] = always("fail")
        await trio.sleep_forever()

    await store.enqueue("Done")
    async with running(store, registry, CUT):
        await trio.sleep(7)
    assert messages(caplog, EXECUTOR, logging.WARNING)[-1] == (
        "self-stopped: no heartbeat succeeded for 6.0s (half the lease); writing nothing,"
        " lease recovery will finish it as Succeeded"
    )


async def test_a_handler_with_a_timeout_gets_its_item_and_a_logger_of_the_executor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store, registry = ScriptedStore(), Registry()
    seen: list[object] = []

    @registry.handler("Timed", timeout=5.0)
    async def timed(item: WorkItem, ctx: Context) -> None:
        seen.extend([item.id, ctx.log.logger.name])

    await store.enqueue("Timed")
    async with running(store, registry):
        await trio.sleep(1)
    assert seen == [1, "trioworker.executor"]


@pytest.mark.parametrize("ending", ["returns", "lets Cancelled through"])
async def test_a_worker_cancelled_at_once_says_nothing_of_a_handler_that_raised_nothing(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture, ending: str
) -> None:
    """The Worker is cancelled while the handler runs: one that swallows its Cancelled
    and returns, or lets it through, has raised nothing of its own to mention, and
    nothing is written."""
    caplog.set_level(logging.INFO)
    store, registry = ScriptedStore(), Registry()

    @registry.handler("A")
    async def a(item: WorkItem, ctx: Context) -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            if ending == "lets Cancelled through":
                raise

    await store.enqueue("A")
    async with running(store, registry):
        await trio.sleep(1)
    assert messages(caplog, EXECUTOR) == []
    assert [w.op for w in store.writes if w.op != "heartbeat"] == []


async def test_a_timeout_at_the_moment_a_cancel_request_comes_is_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Timeout 10 s, a cancel request read by the heartbeat at 10 s: at the same moment
    the timeout counts (its scope's deadline came first or together), so the attempt is
    the handler's failure, not a cancellation; one read at 10 s with a timeout of 11 s
    is a cancellation."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("Ten", timeout=10.0, retry=RetryPolicy(max_attempts=1))(sleeping())
    registry.handler("Eleven", timeout=11.0, retry=RetryPolicy(max_attempts=1))(sleeping())
    await store.enqueue("Ten", scope="a")
    await store.enqueue("Eleven", scope="b")
    async with running(store, registry, Settings(concurrency=2)):
        await store.cancel(1)
        await store.cancel(2)
        await trio.sleep(15)
    ten, eleven = store.items()
    assert (ten.status, ten.error) == (Status.FAILED, "HandlerTimeout: timed out after 10s")
    assert eleven.status is Status.CANCELLED


async def test_run_asyncio_needs_a_running_worker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An executor run without a Worker has no asyncio loop to offer: a clear error."""
    store, registry, raised = ScriptedStore(), Registry(), []

    @registry.handler("A")
    async def a(item: WorkItem, ctx: Context) -> None:
        try:
            await ctx.run_asyncio(trio.sleep, 0)
        except RuntimeError as exc:
            raised.append(str(exc))

    item = await claimed(store, "A")
    executor = an_executor(store, registry)
    async with executing(executor):
        await executor.run(item, 0.0, a_slot())
    assert raised == ["ctx.run_asyncio needs a running Worker (Worker.run)"]


async def test_run_in_thread_runs_within_the_file_limiter() -> None:
    """Real threads: with `--max-concurrent-files 2`, at most two run at once, each
    with its arguments, and their results come back."""
    store, registry = ScriptedStore(), Registry()
    results: list[int] = []
    peak, now, entered = [0], [0], [0]
    guard = threading.Lock()
    # The first two in wait for each other: two at once, however the threads are
    # scheduled (a limit of one would break the barrier and fail the test).
    first_two = threading.Barrier(2)

    def work(n: int, factor: int) -> int:
        with guard:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
            entered[0] += 1
            meet = entered[0] <= 2
        if meet:
            first_two.wait(timeout=30)
        time.sleep(0.05)  # room for a third to come in, were the limit not kept
        with guard:
            now[0] -= 1
        return n * factor

    @registry.handler("Files")
    async def files(item: WorkItem, ctx: Context) -> None:
        async with trio.open_nursery() as nursery:
            for n in range(5):

                async def one(n: int = n) -> None:
                    results.append(await ctx.run_in_thread(work, n, 10))

                nursery.start_soon(one)

    async with running(store, registry, Settings(max_concurrent_files=2)):
        await store.enqueue("Files")
        with trio.fail_after(60):
            while store.items()[0].status is not Status.SUCCEEDED:  # noqa: ASYNC110  real threads
                await trio.sleep(0.05)
    assert sorted(results) == [0, 10, 20, 30, 40]
    assert peak == [2]


# -- an attempt's slot, handed over ---------------------------------------------------


@pytest.mark.parametrize("released", [False, True])
def test_an_attempt_hands_over_a_slot_it_holds_once_and_never_one_given_back(
    released: bool,
) -> None:
    """The claim along with a completion takes the slot its attempt still holds, once; a
    slot the attempt gave back already (its handler over, the next claim free to take
    it) is not handed over again: a claim never asks for more slots than are free."""
    item = WorkItem(1, "K", None, {}, 1)
    slot = a_slot()
    attempt = Attempt(item, math.inf, slot, Tracer().start(item))
    if released:
        slot.release()
    assert attempt.hand_over_slot() is (None if released else slot)
    assert attempt.hand_over_slot() is None
    attempt.slot.release()  # what the batcher's answer does: gives back nothing
    assert slot.spent is released
