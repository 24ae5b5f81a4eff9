"""The attempt held by structure (issue 31), on Trio's virtual clock: once its self-stop
deadline has passed, an attempt writes nothing, whatever stopped it first; a handler
cannot move or cancel the attempt's scope; a failover's duplicate claim neither leaks
nor steals a slot; whatever a handler raises is data.

The cut-off cases use lease 12 s, heartbeat 1 s: the self-stop comes 6 s after the last
heartbeat that succeeded, and heartbeats fail from the first one on (a cut link), until
the link heals after the deadline, before the handler ends.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

from tests.support.fakes import Failstops, ScriptedStore, Tracer, always, messages, running
from trioworker import Context, Registry, RetryPolicy, Settings, Status, WorkItem

EXECUTOR = "trioworker.executor"
CUT = Settings(lease=12.0, heartbeat=1.0, stop_grace=5.0, shutdown_grace=0.5)
ONCE = RetryPolicy(max_attempts=1)


def writes(store: ScriptedStore) -> list[str]:
    return [w.op for w in store.writes if w.op != "heartbeat"]


async def cleans_up_until(seconds: float) -> None:
    """A handler's cleanup after its cancel, shielded, until `seconds` on the clock."""
    with trio.CancelScope(shield=True):
        await trio.sleep_until(seconds)


@pytest.mark.parametrize("first", ["timeout", "cancel request", "shutdown", "completed"])
async def test_once_the_deadline_has_passed_nothing_is_written_whatever_came_first(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture, first: str
) -> None:
    """The handler is stopped first by its kind's timeout, a cancel request, the
    shutdown, or completes its item in its transaction; then the link is cut, its
    deadline passes while its cleanup runs, the link heals (6.6 s) and the handler ends
    (7 s): the attempt writes nothing at all (max_attempts=1 would have failed it), and
    says it self-stopped. The item is left to lease recovery."""
    caplog.set_level(logging.INFO)
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()
    beats_fail_from = 0.5 if first != "cancel request" else 1.5
    deadline = 7.0 if first == "cancel request" else 6.0

    @registry.handler("Crawl", retry=ONCE, timeout=3.0 if first == "timeout" else None)
    async def crawl(item: WorkItem, ctx: Context) -> None:
        try:
            if first == "completed":
                async with ctx.transaction() as tx:
                    tx.complete()
            await trio.sleep_forever()
        finally:
            await cleans_up_until(deadline + 1.0)

    await store.enqueue("Crawl", scope="7")
    async with running(store, registry, CUT, tracer=tracer) as worker:
        if first == "cancel request":
            await store.cancel(1)  # read by the beat at 1 s: the deadline moves to 7 s
        await trio.sleep(beats_fail_from)
        store.script["heartbeat"] = always("fail")
        if first == "shutdown":
            worker.stop()  # the shutdown grace (0.5 s) ends before the deadline
        await trio.sleep_until(deadline + 0.6)
        del store.script["heartbeat"]  # the database answers again: a write would go through
        await trio.sleep_until(deadline + 5.0)
    assert writes(store) == ([] if first != "completed" else ["complete_in_transaction"])
    assert tracer.outcomes() == ["self_stopped"]
    assert messages(caplog, EXECUTOR, logging.WARNING)[-1].startswith("self-stopped:")
    (state,) = store.items()
    assert (state.status, state.failures) == (Status.RUNNING, 0)


async def test_a_completed_item_past_its_deadline_is_finished_by_recovery_as_succeeded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Completed in its transaction, then self-stopped during its cleanup: the Worker
    writes nothing, and lease recovery finishes the item Succeeded (no stall)."""
    store, registry = ScriptedStore(), Registry()

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        async with ctx.transaction() as tx:
            tx.complete()
        store.script["heartbeat"] = always("fail")
        await cleans_up_until(7.0)  # its deadline is 6 s

    await store.enqueue("Crawl", scope="7")
    async with running(store, registry, CUT):
        await trio.sleep(8)
        del store.script["heartbeat"]
        await trio.sleep(CUT.lease + CUT.recovery_every)
    (state,) = store.items()
    assert (state.status, state.stalls, state.failures) == (Status.SUCCEEDED, 0, 0)


@pytest.mark.parametrize("opened", ["before the deadline", "after the deadline"])
async def test_a_fenced_transaction_past_the_deadline_commits_nothing(
    autojump_clock: trio.testing.MockClock, opened: str
) -> None:
    """A shielded handler whose link is cut completes its item in a transaction past
    its deadline (6 s): opened before and committed after, the commit is refused;
    opened after, the opening is. Nothing is committed, the handler's error is not a
    failure (it has self-stopped), and the Worker writes nothing either."""
    store, registry, tracer = ScriptedStore(), Registry(), Tracer()
    reached: list[str] = []

    @registry.handler("Late")
    async def late(item: WorkItem, ctx: Context) -> None:
        store.script["heartbeat"] = always("fail")
        with trio.CancelScope(shield=True):
            if opened == "after the deadline":
                await trio.sleep_until(6.5)
            async with ctx.transaction() as tx:
                reached.append("opened")
                await trio.sleep_until(6.5)
                tx.complete()
            reached.append("committed")

    await store.enqueue("Late", scope="a")
    async with running(store, registry, CUT, tracer=tracer):
        await trio.sleep(10)
    assert reached == (["opened"] if opened == "before the deadline" else [])
    assert [w for w in store.writes if w.op != "heartbeat"] == []
    assert tracer.outcomes() == ["self_stopped"]
    (state,) = store.items()
    assert (state.status, state.error) == (Status.RUNNING, None)


class DuplicatingStore(ScriptedStore):
    """Hands its first claimed item out twice, as a new primary can after a failover
    lost the old one's claim: the same (id, attempt) twice at once."""

    def __init__(self) -> None:
        super().__init__()
        self.duplicated = False

    async def claim_batch(
        self, worker_id: str, lease: float, limit: int, *args: Any, **kwargs: Any
    ) -> list[WorkItem]:
        twice = not self.duplicated and limit == 2
        claimed = await super().claim_batch(
            worker_id, lease, 1 if twice else limit, *args, **kwargs
        )
        if claimed and twice:
            self.duplicated = True
            return [claimed[0], claimed[0]]
        return claimed


async def test_a_duplicate_claim_neither_leaks_nor_steals_a_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Concurrency 2: the first item comes twice at 5 s (both slots); both runs end at
    6 s, each giving back its own slot, so the next two items start together at 6 s
    (with one slot lost they would start at 6 s and 7 s) and a third at 7 s."""
    store, registry = DuplicatingStore(), Registry()
    started: list[tuple[int, float]] = []

    @registry.handler("A")
    async def a(item: WorkItem, ctx: Context) -> None:
        started.append((item.id, trio.current_time()))
        await trio.sleep(1)

    async with running(store, registry, Settings(concurrency=2)) as worker:
        await trio.sleep(5)
        for _ in range(4):
            await store.enqueue("A")
        await trio.sleep(5)
        assert worker.statistics().running == 0
    assert sorted(started) == [(1, 5.0), (1, 5.0), (2, 6.0), (3, 6.0), (4, 7.0)]


async def test_ctx_stopping_tells_each_reason(autojump_clock: trio.testing.MockClock) -> None:
    """`ctx.stopping` is False while the attempt runs freely and True once it has been
    asked to stop: by its deadline, a cancel request, or its kind's timeout."""
    store, registry = ScriptedStore(), Registry()
    seen: dict[str, list[bool]] = {}

    def handler(kind: str, timeout: float | None = None) -> None:
        async def run(item: WorkItem, ctx: Context) -> None:
            seen[kind] = [ctx.stopping]
            try:
                await trio.sleep_forever()
            finally:
                seen[kind].append(ctx.stopping)

        registry.handler(kind, timeout=timeout)(run)

    handler("Deadline")
    handler("Requested")
    handler("Timeout", timeout=2.0)
    for kind in ("Deadline", "Requested", "Timeout"):
        await store.enqueue(kind, scope=kind)
    async with running(store, registry, Settings(concurrency=3)):
        await store.cancel(2)  # read by the heartbeat at 10 s
        await trio.sleep(10.5)
        store.script["heartbeat"] = always("fail")  # self-stop at 40 s
        await trio.sleep(35)
    assert seen == {"Deadline": [False, True], "Requested": [False, True], "Timeout": [False, True]}


async def test_the_fail_stop_watch_counts_from_the_first_stop_of_a_handler(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A cancel request read at 10 s starts the stop grace (15 s) there, though later
    heartbeats keep renewing the lease: a handler that ignores it fail-stops at 25 s;
    one that ignores its kind's timeout (5 s) at 20 s."""
    store, registry, failstops = ScriptedStore(), Registry(), Failstops()

    async def stubborn(item: WorkItem, ctx: Context) -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(1000)

    registry.handler("Requested")(stubborn)
    registry.handler("Timeout", timeout=5.0)(stubborn)
    await store.enqueue("Requested", scope="a")
    await store.enqueue("Timeout", scope="b")
    async with running(store, registry, Settings(concurrency=2), fail_stop=failstops):
        await store.cancel(1)
        await trio.sleep(40)
    assert [(at, message.split(" (attempt")[0]) for at, message in failstops.calls] == [
        (20.0, "handler of item 2"),
        (25.0, "handler of item 1"),
    ]
    assert "(timeout)" in failstops.calls[0][1]
    assert "(cancel_requested)" in failstops.calls[1][1]


async def test_no_deadline_is_moved_once_it_has_passed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Heartbeat every 2 s, claimed at 0.5 s (deadline 6.5 s): the beats at 2 and 4 s
    fail; the one sent at 6 s is answered at 7 s, after the deadline. It does not
    revive the attempt: its handler was cancelled at 6.5 s and its deadline stays."""
    store, registry = ScriptedStore(), Registry()
    seen: list[tuple[float, float]] = []

    @registry.handler("Crawl")
    async def crawl(item: WorkItem, ctx: Context) -> None:
        try:
            await trio.sleep_forever()
        finally:
            seen.append((trio.current_time(), ctx.deadline))
            await cleans_up_until(ctx.deadline + 2.0)
            seen.append((trio.current_time(), ctx.deadline))

    store.script["heartbeat"] = ["fail", "fail", 1.0]
    async with running(store, registry, Settings(lease=12.0, heartbeat=2.0)):
        await trio.sleep(0.5)
        await store.enqueue("Crawl")
        await trio.sleep(12)
    assert store.times["heartbeat"] == [2.0, 4.0, 6.0]
    assert seen == [(6.5, 6.5), (8.5, 6.5)]
    assert [w.op for w in store.writes if w.applied] == ["heartbeat"]  # at 6 s, too late


async def test_a_claim_answered_after_the_deadline_starts_no_handler(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim is sent at 0 s and answered at 9 s, after its items' self-stop deadline
    (6 s) and their stop grace (11 s is their bound, so a handler started then would be
    overdue at once on the real clock): no handler starts, nothing is written, the
    Worker does not fail-stop, it says why and the next claim runs its items."""
    caplog.set_level(logging.INFO)
    store, registry, tracer, failstops = ScriptedStore(), Registry(), Tracer(), Failstops()
    started: list[float] = []

    @registry.handler("A")
    async def a(item: WorkItem, ctx: Context) -> None:
        started.append(trio.current_time())

    await store.enqueue("A")
    store.script["claim"] = [9.0]
    async with running(store, registry, CUT, tracer=tracer, fail_stop=failstops) as worker:
        await trio.sleep(10)
        await store.enqueue("A")
        await trio.sleep(2)
        assert worker.statistics().events["self_stopped"] == 1
    assert failstops.calls == []
    assert len(started) == 1 and started[0] >= 10
    assert tracer.outcomes() == ["self_stopped", "complete"]
    first, second = store.items()
    assert (first.status, first.attempt) == (Status.RUNNING, 1)
    assert second.status is Status.SUCCEEDED
    assert [m for m in messages(caplog, EXECUTOR) if "before its handler started" in m] == [
        "self-stopped before its handler started: the claim was answered more than 6.0s"
        " (half the lease) after it was sent; writing nothing, lease recovery will requeue it"
    ]


async def test_a_claim_answered_at_the_deadline_itself_starts_no_handler(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The deadline is the first instant the attempt is self-stopped: a claim answered
    exactly then starts no handler either (one that never awaits would run whole)."""
    store, registry = ScriptedStore(), Registry()
    started: list[float] = []

    @registry.handler("A")
    async def a(item: WorkItem, ctx: Context) -> None:
        started.append(trio.current_time())

    await store.enqueue("A")
    store.script["claim"] = [CUT.self_stop_after]
    async with running(store, registry, CUT) as worker:
        await trio.sleep(CUT.self_stop_after + 1)
        assert worker.statistics().events["self_stopped"] == 1
    assert started == []
    assert store.items()[0].status is Status.RUNNING
