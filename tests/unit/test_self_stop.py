"""The executor on Trio's virtual clock, with the in-memory store: the seed's cases.

Defaults throughout: lease 60 s, heartbeat every 10 s, so the self-stop comes 30 s
after the last heartbeat that succeeded (the claim counts as the first).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from tests.support.fakes import EVERY, Failstops, ScriptedStore, always, running, sleeping
from trioworker import Context, Registry, RetryPolicy, Settings, Status, WorkItem

SETTINGS = Settings()  # lease 60, heartbeat 10, poll 5, stop grace 15, shutdown grace 30
WRITES = {"complete", "fail", "cancel", "release", "retry_later"}
Handler = Callable[[WorkItem, Context], Awaitable[None]]


class Probe:
    """What a test handler saw: when it started, when it was cancelled, how it ended."""

    def __init__(self) -> None:
        self.started: list[float] = []
        self.cancelled: list[float] = []
        self.running = trio.Event()

    def start(self) -> float:
        now = trio.current_time()
        self.started.append(now)
        self.running.set()
        return now


def sleeper(probe: Probe, *, cleanup: float = 0.0, ending: str = "cancelled") -> Handler:
    """A handler that sleeps until it is cancelled (`probe` sees both), cleans up for
    `cleanup` seconds, shielded, and then ends "cancelled" (Cancelled raised again), or
    mishandles it: "raises" another error, or "returns"."""

    async def handler(item: WorkItem, ctx: Context) -> None:
        probe.start()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            probe.cancelled.append(trio.current_time())
            with trio.CancelScope(shield=True):
                await trio.sleep(cleanup)
            if ending == "raises":
                raise RuntimeError("cleanup failed") from None
            if ending == "cancelled":
                raise

    return handler


def writes(store: ScriptedStore) -> list[str]:
    return [w.op for w in store.writes if w.op in WRITES]


@asynccontextmanager
async def crawling(
    store: ScriptedStore, probe: Probe, handler: Handler | None = None, **kwargs: Any
) -> AsyncIterator[None]:
    """One Crawl item (scope 7) run by a Worker over `store` (`kwargs`: `running`'s):
    `handler`, by default one that sleeps until it is cancelled (`probe` sees both).
    The block begins once the handler has started."""
    registry = Registry()
    registry.handler("Crawl")(handler or sleeper(probe))
    await store.enqueue("Crawl", scope="7")
    async with running(store, registry, **kwargs):
        await probe.running.wait()
        yield


async def test_heartbeats_fail_continuously_the_handler_is_cancelled_at_half_a_lease(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Every heartbeat fails: the handler is cancelled 30 s after the claim, not before."""
    store, probe = ScriptedStore(), Probe()
    store.script["heartbeat"] = always("fail")
    async with crawling(store, probe):
        await trio.sleep(29.9)
        assert probe.cancelled == []
        await trio.sleep(0.2)
        assert probe.cancelled == [pytest.approx(probe.started[0] + 30.0)]
        assert len(store.times["heartbeat"]) >= 2  # at 10 s, 20 s (and 30 s races the stop)
    assert writes(store) == []


async def test_one_heartbeat_that_succeeds_resets_the_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Heartbeats fail except the one sent at 20 s: the self-stop moves to 20 + 30 = 50 s."""
    store, probe = ScriptedStore(), Probe()
    store.script["heartbeat"] = always("fail")
    async with crawling(store, probe):
        start = probe.started[0]
        await trio.sleep_until(start + 19)
        del store.script["heartbeat"]
        await trio.sleep_until(start + 21)
        store.script["heartbeat"] = always("fail")
        await trio.sleep_until(start + 49.9)
        assert probe.cancelled == []
        await trio.sleep_until(start + 50.1)
        assert probe.cancelled == [pytest.approx(start + 50.0)]
    assert writes(store) == []


class TimedStore(ScriptedStore):
    """Records how long each heartbeat call took, however it ended."""

    def __init__(self) -> None:
        super().__init__()
        self.heartbeat_spans: list[tuple[float, float]] = []

    async def heartbeat_many(self, attempts: Any, lease: float) -> Any:
        begun = trio.current_time()
        try:
            return await super().heartbeat_many(attempts, lease)
        finally:
            self.heartbeat_spans.append((begun, trio.current_time()))


async def test_a_heartbeat_call_that_never_completes_still_cancels_at_half_a_lease(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Heartbeat calls hang: each is cut off after one interval, and the handler is
    still cancelled at 30 s, since the deadline never waits for a heartbeat to return.
    """
    store, probe = TimedStore(), Probe()
    store.script["heartbeat"] = always("hang")
    async with crawling(store, probe):
        await trio.sleep(40)
    assert probe.cancelled == [pytest.approx(probe.started[0] + 30.0)]
    assert store.heartbeat_spans, "no heartbeat was even tried"
    assert all(end - begun <= SETTINGS.heartbeat + 1e-9 for begun, end in store.heartbeat_spans)
    assert writes(store) == []


async def test_heartbeats_fail_until_the_self_stop_then_the_database_answers_again(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The database comes back right after the self-stop: no Fail, nothing written, the
    attempt is logged as self-stopped, and the item is still Running for recovery.
    """
    store, probe = ScriptedStore(), Probe()
    store.script["heartbeat"] = always("fail")
    caplog.set_level(logging.INFO)
    async with crawling(store, probe):
        await trio.sleep_until(probe.started[0] + 30.5)
        del store.script["heartbeat"]
        await trio.sleep(5)
    assert writes(store) == []
    (state,) = store.items()
    assert state.status is Status.RUNNING
    stopped = [r for r in caplog.records if "self-stopped" in r.getMessage()]
    assert len(stopped) == 1 and stopped[0].item_id == state.id  # type: ignore[attr-defined]


async def test_lost_writes_nothing(autojump_clock: trio.testing.MockClock) -> None:
    """A heartbeat that finds another attempt owns the item cancels the handler, and
    the lost attempt writes nothing."""
    store, probe = ScriptedStore(), Probe()
    async with crawling(store, probe):
        start = probe.started[0]
        store.expire_lease(1)
        await store.recover_expired_leases(max_stalls=3)
        assert await store.claim("other", 60.0, kinds=["Crawl"])  # the item belongs to "other" now
        await trio.sleep_until(start + 10.5)
        assert probe.cancelled == [pytest.approx(start + 10.0)]
    assert writes(store) == []
    assert store.items()[0].worker_id == "other"


async def test_cancel_requested_writes_cancelled(autojump_clock: trio.testing.MockClock) -> None:
    """A cancel request reaches the handler at the next heartbeat; the item ends Cancelled."""
    store, probe = ScriptedStore(), Probe()
    async with crawling(store, probe):
        await store.cancel(1)
        await trio.sleep(11)
    assert probe.cancelled == [pytest.approx(probe.started[0] + 10.0)]
    assert writes(store) == ["cancel"]
    assert store.items()[0].status is Status.CANCELLED


async def test_shutdown_releases_without_a_stall(autojump_clock: trio.testing.MockClock) -> None:
    """stop(): a handler still running when the grace period ends is cancelled and its
    item released (Queued again, no stall); a handler that finishes in time completes."""
    store, registry, probe, quick = ScriptedStore(), Registry(), Probe(), Probe()
    registry.handler("Slow")(sleeper(probe))

    @registry.handler("Quick")
    async def quick_handler(item: WorkItem, ctx: Context) -> None:
        quick.start()
        await trio.sleep(20)

    await store.enqueue("Slow", scope="a")
    await store.enqueue("Quick", scope="b")
    async with running(store, registry, Settings(concurrency=2)) as worker:
        await probe.running.wait()
        await quick.running.wait()
        stopped_at = trio.current_time()
        worker.stop()
    assert trio.current_time() == pytest.approx(stopped_at + SETTINGS.shutdown_grace)
    assert probe.cancelled == [pytest.approx(stopped_at + SETTINGS.shutdown_grace)]
    slow, fast = store.items()
    assert (slow.status, slow.stalls, slow.attempt) == (Status.QUEUED, 0, 1)
    assert fast.status is Status.SUCCEEDED
    assert sorted(writes(store)) == ["complete", "release"]


@pytest.mark.parametrize("ending", ["raises", "returns"])
async def test_a_handler_that_mishandles_its_cancel_is_never_failed_after_a_self_stop(
    autojump_clock: trio.testing.MockClock, ending: str
) -> None:
    """Turning Cancelled into another error, or returning normally, after a self-stop
    still writes nothing: never Fail (nor Complete) for a self-stop."""
    store, probe = ScriptedStore(), Probe()
    store.script["heartbeat"] = always("fail")
    async with crawling(store, probe, sleeper(probe, ending=ending)):
        await trio.sleep(35)
        del store.script["heartbeat"]  # the database is back: the write would go through
        await trio.sleep(5)
    assert probe.cancelled == [pytest.approx(probe.started[0] + 30.0)]
    assert writes(store) == []
    assert store.items()[0].status is Status.RUNNING


@pytest.mark.parametrize("ending", ["raises", "returns"])
async def test_a_handler_that_mishandles_a_cancel_request_still_ends_cancelled(
    autojump_clock: trio.testing.MockClock, ending: str
) -> None:
    """After CancelRequested, an error or a normal return still writes Cancelled."""
    store, probe = ScriptedStore(), Probe()
    async with crawling(store, probe, sleeper(probe, ending=ending)):
        await store.cancel(1)
        await trio.sleep(15)
    assert writes(store) == ["cancel"]
    assert store.items()[0].status is Status.CANCELLED


async def test_handler_errors_retry_with_backoff_then_fail(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An erroring handler is retried with growing delays, then Failed with the error."""
    store, registry = ScriptedStore(), Registry()
    attempts: list[float] = []
    policy = RetryPolicy(max_attempts=4, initial_delay=10.0, max_delay=1000.0, jitter=0.0)

    @registry.handler("Flaky", retry=policy)
    async def flaky(item: WorkItem, ctx: Context) -> None:
        attempts.append(trio.current_time())
        raise OSError("disk on fire")

    await store.enqueue("Flaky")
    async with running(store, registry):
        await trio.sleep(200)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps == [
        pytest.approx(10.0, abs=0.1),
        pytest.approx(20.0, abs=0.1),
        pytest.approx(40.0, abs=0.1),
    ]
    state = store.items()[0]
    assert (state.status, state.failures, state.attempt) == (Status.FAILED, 4, 4)
    assert state.reason == "failed 4 of 4 attempts"
    assert state.error == "OSError: disk on fire"
    assert writes(store) == ["retry_later"] * 3 + ["fail"]


async def test_do_not_retry_fails_at_once(autojump_clock: trio.testing.MockClock) -> None:
    """An error that says not to retry fails the item on its first attempt."""
    from trioworker import DoNotRetry

    store, registry = ScriptedStore(), Registry()

    @registry.handler("Bad")
    async def bad(item: WorkItem, ctx: Context) -> None:
        raise DoNotRetry("unsupported format")

    await store.enqueue("Bad")
    async with running(store, registry):
        await trio.sleep(10)
    state = store.items()[0]
    assert (state.status, state.attempt, state.reason) == (
        Status.FAILED, 1, "handler said not to retry",
    )  # fmt: skip


async def test_a_kind_without_a_handler_stays_queued_and_the_worker_carries_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A Worker claims only kinds it has handlers for: an item of another kind is left
    Queued for a Worker that serves it (nothing is failed), and the next item runs."""
    store, registry = ScriptedStore(), Registry()
    done = trio.Event()

    @registry.handler("Known")
    async def known(item: WorkItem, ctx: Context) -> None:
        done.set()

    await store.enqueue("Mystery")
    await store.enqueue("Known")
    async with running(store, registry):
        with trio.fail_after(10):
            await done.wait()
        await trio.sleep(1)
    mystery, ok = store.items()
    assert (mystery.status, mystery.attempt, mystery.reason) == (Status.QUEUED, 0, None)
    assert ok.status is Status.SUCCEEDED


async def test_a_handler_that_ignores_its_cancel_fail_stops_the_worker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A handler that swallows Cancelled and keeps going past the stop grace period
    makes the Worker fail-stop, at self-stop (30 s) + grace (15 s)."""
    store, probe, failstops = ScriptedStore(), Probe(), Failstops()
    stubborn = sleeper(probe, cleanup=1000, ending="returns")  # keeps writing files, say
    store.script["heartbeat"] = always("fail")
    async with crawling(store, probe, stubborn, fail_stop=failstops):
        await trio.sleep(50)
        assert failstops.calls == [(pytest.approx(probe.started[0] + 45.0), failstops.calls[0][1])]
        assert "did not stop within 15s" in failstops.calls[0][1]
        await trio.sleep(1000)
    assert writes(store) == []


async def test_a_handler_that_stops_within_the_grace_period_does_not_fail_stop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Cleanup that takes a while but ends inside the grace period is fine."""
    store, probe, failstops = ScriptedStore(), Probe(), Failstops()
    tidy = sleeper(probe, cleanup=14)  # removes its partial files
    store.script["heartbeat"] = always("fail")
    async with crawling(store, probe, tidy, fail_stop=failstops):
        await trio.sleep(100)
    assert failstops.calls == []


async def test_notify_wakes_an_idle_worker_before_its_poll(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An enqueue reaches an idle Worker at once, not at its next poll."""
    store, registry, probe = ScriptedStore(), Registry(), Probe()

    @registry.handler("A")
    async def a(item: WorkItem, ctx: Context) -> None:
        probe.start()

    async with running(store, registry, Settings(poll=1000)):
        await trio.sleep(7)
        enqueued_at = trio.current_time()
        await store.enqueue("A")
        await probe.running.wait()
    assert probe.started == [enqueued_at]


async def test_a_worker_claims_again_at_once_after_finishing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With work waiting, a Worker does not wait for a poll between items."""
    store, registry = ScriptedStore(), Registry()
    started: list[float] = []
    registry.handler("A")(sleeping(1, started))

    for _ in range(3):
        await store.enqueue("A", scope="same")
    async with running(store, registry, Settings(poll=1000)):
        await trio.sleep(10)
    assert started == [pytest.approx(started[0] + n) for n in range(3)]


async def test_database_outage_at_claim_time_is_retried_and_nothing_is_lost(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """While PostgreSQL is down the Worker keeps retrying with backoff, logs it, and
    picks the work up once it is back."""
    store, registry, probe = ScriptedStore(), Registry(), Probe()

    @registry.handler("A")
    async def a(item: WorkItem, ctx: Context) -> None:
        probe.start()

    await store.enqueue("A")
    store.script[EVERY] = always("fail")
    caplog.set_level(logging.WARNING)
    async with running(store, registry):
        await trio.sleep(120)
        assert probe.started == []
        del store.script[EVERY]
        with trio.fail_after(30):
            await probe.running.wait()
        await trio.sleep(1)
    assert store.items()[0].status is Status.SUCCEEDED
    claims = [r for r in caplog.records if r.getMessage().startswith("cannot claim")]
    assert 5 <= len(claims) <= 40  # backoff: neither silent nor a tight loop


async def test_a_self_stopped_attempt_stops_heartbeating(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """After the self-stop, no heartbeat renews the lease, even once the database is back
    and the handler is still cleaning up: a heartbeat is a write too."""
    store, probe = ScriptedStore(), Probe()
    store.script["heartbeat"] = always("fail")
    # A slow cleanup, inside the stop grace.
    async with crawling(store, probe, sleeper(probe, cleanup=12)):
        await trio.sleep_until(probe.started[0] + 30.5)
        del store.script["heartbeat"]
        beats_then = len(store.times["heartbeat"])
        await trio.sleep(12)
        assert len(store.times["heartbeat"]) == beats_then
    assert [w for w in store.writes if w.applied] == []
