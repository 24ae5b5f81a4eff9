"""Periodic items and per-kind timeouts on Trio's virtual clock, with the in-memory store.

Defaults throughout: lease 60 s, heartbeat every 10 s, poll 5 s, stop grace 15 s. The
in-memory store's wall clock is 2026-01-01T00:00:00Z plus `trio.current_time()`, so cron
times fall at whole minutes of virtual time.
"""

from __future__ import annotations

import datetime as dt

import pytest
import trio
import trio.testing

from tests.support.fakes import Failstops, ScriptedStore, always, running
from trioworker import Context, Registry, RetryPolicy, Settings, Status, WorkItem
from trioworker.testing import MemoryStore

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def due_times(
    store: MemoryStore, runs: list[tuple[int, float]], *, late_by: float = 1.0
) -> list[str]:
    """The due time (run_after) of each item run, in the order they ran; each ran
    less than `late_by` seconds after it."""
    due = {item.id: item.run_after for item in store.items()}
    for id, started in runs:
        assert 0 <= (EPOCH + dt.timedelta(seconds=started) - due[id]).total_seconds() < late_by
    return [due[id].strftime("%H:%M:%S") for id, _ in runs]


async def test_a_stopping_worker_enqueues_no_periodic_items(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Once stop() is called ("no new claims"), the Worker fires no schedule, though it
    runs on for 30 s finishing its item: the every-5-s items due meanwhile are left to
    the Workers that stay (issue 20). Before the stop it fired on time."""
    store, registry = MemoryStore(), Registry()

    @registry.handler("Long")
    async def long(item: WorkItem, ctx: Context) -> None:
        await trio.sleep(30)

    @registry.handler("Tick")
    async def tick(item: WorkItem, ctx: Context) -> None:
        pass

    registry.periodic("Tick", every=5)
    await store.enqueue("Long")
    async with running(store, registry, Settings(concurrency=2)) as worker:
        await trio.sleep(7)
        ticks_before = [i.id for i in store.items() if i.kind == "Tick"]
        worker.stop()
    assert trio.current_time() >= 30  # it ran on, draining its Long item
    assert ticks_before  # it fired on time before the stop
    ticks = [i for i in store.items() if i.kind == "Tick"]
    assert [i.id for i in ticks] == ticks_before, [(i.id, i.requested_at) for i in ticks]


async def test_a_cron_schedule_enqueues_each_due_time_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`*/2 * * * *` from 00:00:30 to 00:07, with two Workers: items due at 00:02, 00:04
    and 00:06, each run once, on time."""
    store, registry = MemoryStore(), Registry()
    runs: list[tuple[int, float]] = []

    @registry.handler("Sweep")
    async def sweep(item: WorkItem, ctx: Context) -> None:
        runs.append((item.id, trio.current_time()))

    registry.periodic("Sweep", cron="*/2 * * * *")
    await trio.sleep(30)  # start at 00:00:30: the first due time is 00:02
    async with running(store, registry), running(store, registry, worker_id="w2"):
        await trio.sleep_until(7 * 60)
    assert due_times(store, runs) == ["00:02:00", "00:04:00", "00:06:00"]
    items = store.items()
    assert [i.status for i in items] == [Status.SUCCEEDED] * 3
    (state,) = await store.schedules()
    assert state.next_due == EPOCH + dt.timedelta(minutes=8)


async def test_after_downtime_a_cron_schedule_enqueues_only_the_latest_missed_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Workers gone from 00:03:30 to 00:13: one catch-up item (due 00:12, run at 00:13),
    then on time again."""
    store, registry = MemoryStore(), Registry()
    runs: list[tuple[int, float]] = []

    @registry.handler("Sweep")
    async def sweep(item: WorkItem, ctx: Context) -> None:
        runs.append((item.id, trio.current_time()))

    registry.periodic("Sweep", cron="*/3 * * * *")
    async with running(store, registry):
        await trio.sleep_until(3 * 60 + 30)
    await trio.sleep_until(13 * 60)
    async with running(store, registry):
        await trio.sleep_until(16 * 60 + 30)
    assert due_times(store, runs, late_by=61) == ["00:03:00", "00:12:00", "00:15:00"]
    assert [started for _, started in runs][1] == pytest.approx(13 * 60, abs=1)


async def test_a_cron_schedule_keeps_to_its_timezone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`0 1 * * *` in Asia/Kolkata (+05:30) is due at 19:30 UTC."""
    store, registry = MemoryStore(), Registry()
    runs: list[tuple[int, float]] = []

    @registry.handler("Report")
    async def report(item: WorkItem, ctx: Context) -> None:
        runs.append((item.id, trio.current_time()))

    registry.periodic("Report", cron="0 1 * * *", timezone="Asia/Kolkata")
    # Start at 19:00 UTC (the first due time is the next one from there), so the
    # Worker's loops do not spin through a day of virtual time.
    await trio.sleep_until(19 * 3600)
    async with running(store, registry):
        await trio.sleep_until(20 * 3600)
    assert due_times(store, runs) == ["19:30:00"]


async def test_a_handler_past_its_timeout_is_cancelled_retried_and_fails_timed_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """timeout=5 on a handler that sleeps 20 s: cancelled at 5 s each attempt, retried by
    its policy, failed after 3 attempts with "timed out after 5s"."""
    store, registry = MemoryStore(), Registry()
    cancelled: list[float] = []
    started: list[float] = []

    @registry.handler("Slow", timeout=5, retry=RetryPolicy(max_attempts=3, jitter=0.0))
    async def slow(item: WorkItem, ctx: Context) -> None:
        started.append(trio.current_time())
        try:
            await trio.sleep(20)
        except trio.Cancelled:
            cancelled.append(trio.current_time())
            raise

    item = await store.enqueue("Slow")
    failstops = Failstops()
    async with running(store, registry, fail_stop=failstops):
        await trio.sleep(600)
    assert [c - s for s, c in zip(started, cancelled, strict=True)] == [5.0, 5.0, 5.0]
    state = await store.get_item(item.id)
    assert state is not None
    assert (state.status, state.failures, state.error) == (
        Status.FAILED,
        3,
        "HandlerTimeout: timed out after 5s",
    )
    assert [w.op for w in store.writes if w.op != "heartbeat"] == [
        "retry_later",
        "retry_later",
        "fail",
    ]
    assert failstops.calls == []


async def test_a_self_stop_inside_a_timeout_bounded_handler_still_writes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Heartbeats fail; the self-stop (30 s) comes before the kind's timeout (45 s): the
    attempt writes nothing, as any self-stopped attempt, and is no handler failure."""
    store, registry = ScriptedStore(), Registry()
    cancelled: list[float] = []

    @registry.handler("Slow", timeout=45)
    async def slow(item: WorkItem, ctx: Context) -> None:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            cancelled.append(trio.current_time())
            raise

    store.script["heartbeat"] = always("fail")
    item = await store.enqueue("Slow")
    async with running(store, registry):
        await trio.sleep(50)
        state = await store.get_item(item.id)
    assert cancelled == [pytest.approx(30.0)]
    assert store.writes == []
    assert state is not None and (state.status, state.failures) == (Status.RUNNING, 0)


async def test_the_timeout_counts_from_the_handlers_start_not_from_heartbeats(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Heartbeats succeed and push the self-stop on; the 25 s timeout still ends it."""
    store, registry = MemoryStore(), Registry()
    ended: list[float] = []

    @registry.handler("Slow", timeout=25, retry=RetryPolicy(max_attempts=1))
    async def slow(item: WorkItem, ctx: Context) -> None:
        try:
            await trio.sleep(100)
        finally:
            ended.append(trio.current_time())

    item = await store.enqueue("Slow")
    async with running(store, registry):
        await trio.sleep(60)
    assert ended == [pytest.approx(25.0)]
    state = await store.get_item(item.id)
    assert state is not None and state.status is Status.FAILED
    assert store.calls.count("heartbeat") == 2  # at 10 s and 20 s, each pushing the deadline
