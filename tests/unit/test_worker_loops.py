"""The Worker's loops on Trio's virtual clock, with a scripted in-memory store: what it
claims and when, how it backs off, its lease recovery, settling, schedules, presence,
statistics, its log lines, and the watchdog it feeds. The Worker starts at time 0.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import math
import os
import re
import socket
import types
from typing import Any

import pytest
import trio
import trio.testing

from tests.support.fakes import (
    Failstops,
    ScriptedStore,
    Sink,
    always,
    gaps,
    messages,
    records,
    running,
    sleeping,
)
from trioworker import (
    ConfigurationError,
    Context,
    IdTakenOver,
    Registry,
    SchemaNotReady,
    Settings,
    Status,
    Worker,
    WorkerStatistics,
    WorkItem,
)
from trioworker._core.model import Fired, HeldLease, WorkerInfo
from trioworker._worker import worker as worker_module
from trioworker._worker.watchdog import WatchdogLink

WORKER = "trioworker.worker"


def within(gap: float, base: float) -> bool:
    """A backoff delay: `base` spread by +/- 20%."""
    return base * 0.8 - 1e-9 <= gap <= base * 1.2 + 1e-9


# -- start, stop, what it says ---------------------------------------------------------


async def test_the_worker_says_what_it_serves_when_it_starts_and_stops(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Starting, ready, stopping (with what is running) and stopped are logged."""
    caplog.set_level(logging.INFO)
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping(2))
    registry.handler("B")(sleeping())
    await store.enqueue("A")
    with trio.fail_after(100):
        async with running(store, registry, Settings(concurrency=2, poll=3)) as worker:
            await trio.sleep(1)
            worker.stop()
            assert messages(caplog, WORKER)[-1] == (
                "stopping: no new claims; 1 running item(s) get 30s to finish"
            )
            worker.stop()  # said once
    assert messages(caplog, WORKER) == [
        "worker w1 starting: kinds A, B; all scopes and unscoped items, concurrency 2,"
        " lease 60s, heartbeat 10s, poll 3s",
        "worker w1 ready",
        "stopping: no new claims; 1 running item(s) get 30s to finish",
        "worker w1 stopped",
    ]
    assert trio.current_time() == 2.0


@pytest.mark.parametrize(
    ("scopes", "unscoped", "served"),
    [
        (["b", "a", "b"], None, "scopes a, b only"),
        (["b", "a"], True, "scopes a, b and unscoped items"),
    ],
)
async def test_the_start_line_lists_the_scopes_served(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    scopes: list[str],
    unscoped: bool | None,
    served: str,
) -> None:
    """Scopes are listed sorted, once; a Worker without handlers serves kinds "none"."""
    caplog.set_level(logging.INFO)
    async with running(ScriptedStore(), Registry(), scopes=scopes, unscoped=unscoped):
        pass
    assert messages(caplog, WORKER)[0] == (
        f"worker w1 starting: kinds none; {served}, concurrency 1,"
        " lease 60s, heartbeat 10s, poll 5s"
    )


async def test_a_worker_stopped_before_it_runs_returns_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """stop() before run(): run() claims nothing and returns."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping())
    await store.enqueue("A")
    worker = Worker(store, registry, worker_id="w1", fail_stop=Failstops())
    worker.stop()
    with trio.fail_after(100):
        await worker.run()
    assert trio.current_time() == 0.0
    assert "claim" not in store.calls


async def test_the_shutdown_grace_ends_in_a_release_it_logs(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Items still running when the grace period is over are cancelled, released, and
    counted in a warning."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping())
    await store.enqueue("A", scope="x")
    await store.enqueue("A", scope="y")
    with trio.fail_after(100):
        async with running(store, registry, Settings(concurrency=2)) as worker:
            assert worker.statistics().running == 2
            worker.stop()
    assert trio.current_time() == 30.0
    assert records(caplog, "shutdown grace")[0].getMessage() == (
        "shutdown grace period over: cancelling and releasing 2 item(s)"
    )
    assert worker.statistics().events["release"] == 2


# -- statistics and events ---------------------------------------------------------------


async def test_statistics_count_the_events_and_metrics_see_every_observation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Counted events (not timings) in statistics(), every observation in the sink."""
    store, registry, sink = ScriptedStore(), Registry(), Sink()
    registry.handler("A")(sleeping(12))
    for _ in range(3):
        await store.enqueue("A", scope="same")
    async with running(store, registry, metrics=sink) as worker:
        assert worker.statistics().running == 1
        assert worker.statistics().claimed == 1
        await trio.sleep(30)
        statistics = worker.statistics()
    assert (statistics.claimed, statistics.running) == (3, 1)
    assert statistics.events == {"claimed": 3, "complete": 2}
    assert sink.named("claimed") == [("claimed", "A", None)] * 3
    assert sink.named("heartbeat_rtt") == [("heartbeat_rtt", "", 0.0)] * 2
    assert sink.named("handler_duration") == [("handler_duration", "A", 12.0)] * 2


async def test_a_fresh_worker_has_nothing_running(autojump_clock: trio.testing.MockClock) -> None:
    """Before it claims anything, a Worker's statistics are all zero: made, and running
    for a minute of polls and advertisements with only an item it does not serve."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping())
    await store.enqueue("B")
    nothing = WorkerStatistics(claimed=0, running=0, events={})
    async with running(store, registry, Settings(concurrency=3)) as worker:
        assert worker.statistics() == nothing
        await trio.sleep(60)
        assert len(store.times["claim"]) >= 2  # it kept looking
        assert worker.statistics() == nothing
    (item,) = store.items()
    assert (item.status, item.attempt) == (Status.QUEUED, 0)


# -- claiming -----------------------------------------------------------------------


async def test_one_claim_fills_every_free_slot(autojump_clock: trio.testing.MockClock) -> None:
    """Concurrency 3, six items in six scopes: two claims of three each, not six."""
    store, registry = ScriptedStore(), Registry()
    started: list[float] = []
    registry.handler("A")(sleeping(1, started))

    for scope in "uvwxyz":
        await store.enqueue("A", scope=scope)
    async with running(store, registry, Settings(concurrency=3, poll=1000)):
        await trio.sleep(1.5)
        assert store.times["claim"][:2] == [0.0, 1.0]
        assert started == [0.0] * 3 + [1.0] * 3
        await trio.sleep(10)
    assert all(i.worker_id == "w1" for i in store.items())


async def test_a_claim_never_takes_more_than_the_free_slots(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Concurrency 2 and three items waiting: two run, the third waits for a slot."""
    store, registry = ScriptedStore(), Registry()
    started: list[float] = []
    registry.handler("A")(sleeping(1, started))

    for scope in "xyz":
        await store.enqueue("A", scope=scope)
    async with running(store, registry, Settings(concurrency=2, poll=1000)):
        await trio.sleep(5)
    assert started == [0.0, 0.0, 1.0]


async def test_a_worker_claims_and_is_woken_only_for_what_it_serves(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Serving scope "a" only: enqueues in other scopes or unscoped neither wake it nor
    are claimed; one in "a" wakes it at once."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping(0))
    async with running(store, registry, Settings(poll=1000), scopes=["a"]):
        await trio.sleep(1)
        await store.enqueue("A", scope="b")
        await store.enqueue("A")
        await trio.sleep(1)
        assert store.times["claim"] == [0.0]
        await store.enqueue("A", scope="a")
        await trio.sleep(1)
        assert store.times["claim"] == [0.0, 2.0, 2.0]
        assert store.on_notify is not None
        store.on_notify(None)  # a NOTIFY without a scope wakes everyone
        await trio.sleep(0.5)
        assert store.times["claim"] == [0.0, 2.0, 2.0, 3.0]
    assert [i.status.value for i in store.items()] == ["Queued", "Queued", "Succeeded"]


async def test_a_worker_of_listed_scopes_and_unscoped_items_is_woken_for_both(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Scopes ["a"] and unscoped=True: an unscoped enqueue wakes it and is claimed."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping(1))
    async with running(store, registry, Settings(poll=1000), scopes=["a"], unscoped=True):
        await trio.sleep(1)
        await store.enqueue("A")
        await trio.sleep(0.5)
        assert store.times["claim"] == [0.0, 1.0]
    assert store.items()[0].worker_id == "w1"


async def test_an_idle_worker_wakes_when_a_delayed_item_falls_due(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An item due in 0.5 s is claimed at 0.51 s, long before the poll."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping(0))
    await store.enqueue("A", run_after=dt.timedelta(seconds=0.5))
    async with running(store, registry, Settings(poll=1000)):
        await trio.sleep(1)
    assert store.times["claim"][:2] == [0.0, pytest.approx(0.51)]


@pytest.mark.parametrize(("scopes", "unscoped"), [(["a"], False), (["a"], True)])
async def test_delayed_items_the_worker_does_not_serve_do_not_wake_it(
    autojump_clock: trio.testing.MockClock, scopes: list[str], unscoped: bool
) -> None:
    """Only items the Worker would claim count towards when it next looks."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping(0))
    await store.enqueue("A", scope="b", run_after=dt.timedelta(seconds=2))
    if not unscoped:
        await store.enqueue("A", run_after=dt.timedelta(seconds=2))
    await store.enqueue("A", scope="a", run_after=dt.timedelta(seconds=7))
    if unscoped:
        await store.enqueue("A", run_after=dt.timedelta(seconds=4))
    async with running(store, registry, Settings(poll=1000), scopes=scopes, unscoped=unscoped):
        await trio.sleep(10)
    assert store.times["claim"][:2] == [0.0, pytest.approx(4.01 if unscoped else 7.01)]


async def test_when_the_due_time_cannot_be_read_the_worker_polls(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """seconds_until_due failing: the next claim comes after the poll interval."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping(0))
    store.script["seconds_until_due"] = ["fail"]
    async with running(store, registry, Settings(poll=3)):
        await trio.sleep(4)
    assert store.times["claim"][:2] == [0.0, 3.0]


@pytest.mark.parametrize(("poll", "cap"), [(1.0, 5.0), (10.0, 20.0)])
async def test_claims_back_off_through_an_outage_and_say_so(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    poll: float,
    cap: float,
) -> None:
    """While claims fail, the Worker retries after 0.5 s, doubling up to twice the
    poll interval (at least 5 s), +/- 20%, logging each failure; once PostgreSQL
    answers it says so, and a later outage starts again from 0.5 s."""
    caplog.set_level(logging.INFO)
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping(0))
    store.script["claim"] = always("fail")
    async with running(store, registry, Settings(poll=poll)):
        await trio.sleep(200)
        del store.script["claim"]
        failures = len(store.times["claim"])
        await trio.sleep(cap * 1.2 + 1)
        store.script["claim"] = always("fail")
        await store.enqueue("A")  # wakes it: that claim fails, and is retried
        await trio.sleep(0.5 * 1.2 + 0.01)
        del store.script["claim"]
        await trio.sleep(5)
    times = store.times["claim"][:failures]
    for n, gap in enumerate(gaps(times)):
        assert within(gap, min(cap, 0.5 * 2**n)), (n, gap)
    assert any(gap > cap * 0.9 for gap in gaps(times))
    logged = [r.getMessage() for r in records(caplog, "cannot claim")]
    for n, (message, gap) in enumerate(zip(logged, gaps(times), strict=False), start=1):
        assert message == (f"cannot claim: claim: down (failure {n}); retrying in {gap:.1f}s")
    assert [m for m in messages(caplog, WORKER) if "answers" in m] == [
        "PostgreSQL answers again; claiming"
    ] * 2
    second = records(caplog, "cannot claim")[failures]
    assert "(failure 1)" in second.getMessage()


# -- lease recovery ---------------------------------------------------------------------


async def ghost_claims(store: ScriptedStore, n: int = 1, *, scope: str = "g") -> None:
    """Items of a kind the Worker does not serve, claimed by a Worker that vanished."""
    for _ in range(n):
        await store.enqueue("Orphan", scope=scope)
        assert await store.claim("ghost", 1.0, kinds=["Orphan"])


async def test_lease_recovery_runs_every_recovery_interval_and_logs_each_stall(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Recovery at 0, 15, 30 s; the vanished Worker's item is requeued at 15 s with the
    stall logged, its fields attached, counted and observed."""
    store, registry, sink = ScriptedStore(), Registry(), Sink()
    await ghost_claims(store)
    async with running(store, registry, metrics=sink) as worker:
        await trio.sleep(31)
    assert store.times["recover_expired_leases"] == [0.0, 15.0, 30.0]
    (record,) = records(caplog, "lease expired")
    assert (record.getMessage(), record.levelno) == (
        # Issue 20: the Worker whose attempt died, and the one that recovered it.
        "lease expired; stall 1 of 3: requeued (attempt 1 on Worker ghost; recovered by w1)",
        logging.WARNING,
    )
    names = ("item_id", "attempt", "kind", "scope", "worker_id", "stalled_worker_id")
    fields = {f: getattr(record, f) for f in names}
    assert fields == {"item_id": 1, "attempt": 1, "kind": "Orphan", "scope": "g", "worker_id": "w1",
                      "stalled_worker_id": "ghost"}  # fmt: skip
    assert worker.statistics().events == {"stall_recovered": 1}
    assert sink.seen == [("stall_recovered", "Orphan", None)]


async def test_a_last_stall_fails_the_item_and_a_cancel_requested_one_is_cancelled(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """max_stalls=1: the stalled item fails (an error); one whose cancel was requested
    is logged with its status and reason."""
    store, registry = ScriptedStore(), Registry()
    await ghost_claims(store, scope="f")
    async with running(store, registry, Settings(max_stalls=1)):
        await trio.sleep(16)
    (failed,) = records(caplog, "lease expired")
    assert (failed.getMessage(), failed.levelno) == (
        "lease expired; stall 1 of 1: failed as stalled (attempt 1 on Worker ghost;"
        " recovered by w1)", logging.ERROR,
    )  # fmt: skip
    assert failed.item_id == 1  # type: ignore[attr-defined]
    caplog.clear()
    store = ScriptedStore()
    await ghost_claims(store)
    await store.cancel(1)
    async with running(store, registry):
        await trio.sleep(16)
    (cancelled,) = records(caplog, "lease expired")
    assert (cancelled.getMessage(), cancelled.levelno) == (
        "lease expired; stall 1: Cancelled (cancel requested; attempt 1 on Worker ghost;"
        " recovered by w1)", logging.WARNING,
    )  # fmt: skip
    assert cancelled.item_id == 1  # type: ignore[attr-defined]


async def test_a_recovered_success_committed_in_its_transaction_is_no_stall(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The vanished Worker's attempt had committed its success in its transaction:
    recovery finishes it Succeeded and says so at INFO, naming both Workers, and counts
    no stall."""
    caplog.set_level(logging.INFO)
    store, registry, sink = ScriptedStore(), Registry(), Sink()
    await ghost_claims(store)
    async with store.fenced_transaction(1, 1) as tx:
        tx.complete()
    async with running(store, registry, metrics=sink) as worker:
        await trio.sleep(16)
    (record,) = records(caplog, "lease expired")
    assert (record.getMessage(), record.levelno) == (
        "lease expired after the attempt committed its success in its transaction: finished"
        " as Succeeded, no stall (attempt 1 on Worker ghost; recovered by w1)", logging.INFO,
    )  # fmt: skip
    assert record.item_id == 1  # type: ignore[attr-defined]
    assert (store.items()[0].status, store.items()[0].stalls) == (Status.SUCCEEDED, 0)
    assert "stall_recovered" not in worker.statistics().events and sink.seen == []


class HeldStore(ScriptedStore):
    """Its lease recovery meets item 7's row held by backend 4242 (another session) a
    whole lease after the lease ran out: held_leases names it every pass."""

    async def held_leases(self, *, batch: int = 100) -> list[HeldLease]:
        await super().held_leases(batch=batch)
        return [
            HeldLease(7, "Orphan", "g", 2, "ghost", 61.4, 4242),
            HeldLease(8, "Orphan", None, 1, "ghost", 90.0, None),
        ]


async def test_a_lease_held_past_every_bound_is_reported_every_pass(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """An expired item another session still holds is no stall (nothing was taken
    back): each recovery pass logs it at WARNING, naming the holder's backend, with the
    item's fields, and counts it, so that someone ends that session."""
    store, sink = HeldStore(), Sink()
    async with running(store, Registry(), metrics=sink) as worker:
        await trio.sleep(16)
    assert store.times["held_leases"] == [0.0, 15.0]
    held = records(caplog, "lease of item 7")
    assert [(r.getMessage(), r.levelno) for r in held] == [
        ("lease of item 7 expired 61s ago, and backend 4242 still holds its row: lease"
         " recovery takes the item back once that session ends (attempt 2 on Worker ghost)",
         logging.WARNING),
    ] * 2  # fmt: skip
    names = ("item_id", "attempt", "kind", "scope", "stalled_worker_id", "holder_pid")
    assert {f: getattr(held[0], f) for f in names} == {
        "item_id": 7, "attempt": 2, "kind": "Orphan", "scope": "g",
        "stalled_worker_id": "ghost", "holder_pid": 4242,
    }  # fmt: skip
    assert held[0].worker_id == worker.worker_id
    shared = records(caplog, "lease of item 8")
    assert [r.getMessage() for r in shared] == [
        "lease of item 8 expired 90s ago, and another session still holds its row: lease"
        " recovery takes the item back once that session ends (attempt 1 on Worker ghost)"
    ] * 2
    assert shared[0].holder_pid is None
    assert worker.statistics().events == {"lease_held": 4}
    assert sink.seen == [("lease_held", "Orphan", None)] * 4


class WedgedStore(ScriptedStore):
    """Its first head repair finds a wedged scope."""

    def __init__(self) -> None:
        super().__init__()
        self.wedged = ["s1"]

    async def repair_heads(self) -> list[str]:
        await super().repair_heads()
        wedged, self.wedged = self.wedged, []
        return wedged


async def test_a_repaired_scope_is_reported_as_a_bug(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A scope the repair had to fix is an error in the log, counted once."""
    store, sink = WedgedStore(), Sink()
    async with running(store, Registry(), metrics=sink) as worker:
        await trio.sleep(20)
    assert messages(caplog, WORKER, logging.ERROR) == [
        "scope 's1' was wedged (due work no claim could take) and is repaired:"
        " this is a bug in trioworker, please report it"
    ]
    assert worker.statistics().events == {"heads_repaired": 1}
    assert sink.seen == [("heads_repaired", "", None)]


async def test_a_failed_recovery_is_logged_and_tried_again(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Recovery failing at 0 s is logged, and the next try (15 s) recovers."""
    store = ScriptedStore()
    store.script["repair_heads"] = ["fail"]
    await ghost_claims(store)
    async with running(store, Registry()):
        await trio.sleep(16)
    assert messages(caplog, WORKER, logging.WARNING) == [
        "lease recovery failed: repair_heads: down; next try in 15s",
        "lease expired; stall 1 of 3: requeued (attempt 1 on Worker ghost; recovered by w1)",
    ]


# -- settling -------------------------------------------------------------------------


async def test_scopes_are_settled_every_poll_and_at_once_when_announced(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Every poll interval (5 s), and at once on an announcement; a failure is logged
    and the loop goes on."""
    store = ScriptedStore()
    store.script["settle_noted_scopes"] = ["ok", "fail"]
    async with running(store, Registry()):
        await trio.sleep(12)
        assert store.on_settle is not None
        store.on_settle("x")
        await trio.sleep(1)
    assert store.times["settle_noted_scopes"] == [5.0, 10.0, 12.0]
    assert messages(caplog, WORKER, logging.WARNING) == [
        "settling scopes failed: settle_noted_scopes: down; next try in 5s"
    ]


class SettlingStore(ScriptedStore):
    """Whose settle passes settle, in turn, `settles` items and scopes (then none)."""

    def __init__(self, settles: list[int]) -> None:
        super().__init__()
        self.settles = settles

    async def settle_noted_scopes(self, *, batch: int = 100) -> int:
        await super().settle_noted_scopes(batch=batch)
        return self.settles.pop(0) if self.settles else 0


async def test_a_pass_that_settled_is_followed_soon_then_twice_as_late_until_one_settles_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """What a pass met held by another transaction it notes again, unannounced; that
    transaction is about to end. So a pass that settled anything is followed by
    another 0.05 s later, then 0.1 s, doubling up to the poll interval (5 s), until one
    settles nothing; then every poll interval again, and the next burst starts at
    0.05 s again."""
    store = SettlingStore([2, 1, 0, 0, *[1] * 9, 0])
    async with running(store, Registry()):
        await trio.sleep(1)
        assert store.on_settle is not None
        store.on_settle(None)  # passes at 1, ~1.05, ~1.15 (none), 6.15 (the poll)
        await trio.sleep(9)
        store.on_settle(None)  # at 10: nine that settle, then none
        await trio.sleep(30)
    times = store.times["settle_noted_scopes"]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert times[0] == pytest.approx(1.0)
    assert 0.04 <= gaps[0] <= 0.06 and 0.08 <= gaps[1] <= 0.12
    assert gaps[2] == pytest.approx(5.0)  # the pass that settled none: the poll next
    assert times[4] == pytest.approx(10.0)
    soon = [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]  # 6.4 and 12.8 capped
    for gap, base in zip(gaps[4:13], soon, strict=True):
        assert 0.8 * base <= gap <= 1.2 * base, (gap, base)
    assert gaps[13:] == pytest.approx([5.0] * len(gaps[13:])) and len(gaps) > 14


async def test_an_announcement_starts_the_passes_that_follow_at_0_05_s_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Passes woken by announcements, each settling something (a busy fan-in), do not
    space out the pass that follows the last of them: it comes 0.05 s later, then the
    unannounced ones twice as late each."""
    store = SettlingStore([1, 1, 1, 1, 1, 0])
    async with running(store, Registry()):
        await trio.sleep(1)
        assert store.on_settle is not None
        for _ in range(3):  # at 1.00, 1.02 and 1.04: each before its follow-up is due
            store.on_settle(None)
            await trio.sleep(0.02)
        await trio.sleep(2)
    times = store.times["settle_noted_scopes"]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert times[:3] == pytest.approx([1.0, 1.02, 1.04])
    for gap, base in zip(gaps[2:5], [0.05, 0.1, 0.2], strict=True):
        assert 0.8 * base <= gap <= 1.2 * base, (gap, base)


# -- schedules ------------------------------------------------------------------------


async def test_a_schedule_fires_on_time_and_each_firing_is_logged(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """every=2 s: synced once, fired at 0, 2, 4, 6 s (each a moment after its due time,
    sooner than the poll); a due time whose previous item still waits is merged onto it."""
    caplog.set_level(logging.INFO)
    store, registry, sink = ScriptedStore(), Registry(), Sink()
    registry.handler("Tick")(sleeping(100))
    registry.periodic("Tick", every=2, scope="s")
    async with running(store, registry, metrics=sink) as worker:
        await trio.sleep(5)
    assert store.times["sync_schedules"] == [0.0]
    assert store.times["fire_schedules"] == [0.0, pytest.approx(2.01), pytest.approx(4.01)]
    fired = [r.getMessage() for r in records(caplog, "schedule ")]
    assert fired == [
        "schedule Tick@s: due 2026-01-01T00:00:00+00:00, enqueued item 1",
        "schedule Tick@s: due 2026-01-01T00:00:02+00:00, enqueued item 2",
        "schedule Tick@s: due 2026-01-01T00:00:04+00:00, merged onto its still queued item 2",
    ]
    assert worker.statistics().events["scheduled"] == 3
    assert sink.named("scheduled") == [("scheduled", "Tick@s", None)] * 3


async def test_a_schedule_further_off_than_the_poll_is_looked_at_every_poll(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """every=60 s: between firings the Worker looks every poll interval (another Worker
    may have changed the schedule)."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("Tick")(sleeping(0))
    registry.periodic("Tick", every=60)
    async with running(store, registry, Settings(poll=4)):
        await trio.sleep(9)
    assert store.times["fire_schedules"] == [0.0, pytest.approx(4.01), pytest.approx(8.02)]


class NoScheduleStore(ScriptedStore):
    """Fires nothing and knows no next due time."""

    async def fire_schedules(self, schedules: Any) -> tuple[list[Fired], float | None]:
        await self._enter("fire_schedules")
        self.fired_with = list(schedules)
        return [], None


async def test_without_a_next_due_time_the_worker_looks_every_poll(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No due time known: the schedules are looked at every poll interval."""
    store, registry = NoScheduleStore(), Registry()
    schedule = registry.periodic("Tick", every=60)
    async with running(store, registry, Settings(poll=4)):
        await trio.sleep(9)
    assert store.times["fire_schedules"] == [0.0, pytest.approx(4.01), pytest.approx(8.02)]
    assert store.fired_with == [schedule]


@pytest.mark.parametrize(("poll", "cap"), [(1.0, 5.0), (10.0, 20.0)])
async def test_schedules_back_off_through_an_outage_and_say_so(
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    poll: float,
    cap: float,
) -> None:
    """Syncing, then firing, failing: retried after 0.5 s, doubling up to twice the
    poll (at least 5 s), +/- 20%, each failure logged; synced once it succeeds, and
    the backoff starts again after a success."""
    caplog.set_level(logging.INFO)
    store, registry = ScriptedStore(), Registry()
    registry.handler("Tick")(sleeping(0))
    registry.periodic("Tick", every=1000)
    store.script["sync_schedules"] = ["fail"] * 3
    store.script["fire_schedules"] = ["fail"] * 12
    async with running(store, registry, Settings(poll=poll)):
        await trio.sleep(300)
        before = len(store.times["fire_schedules"])
        store.script["fire_schedules"] = ["fail"]
        await trio.sleep(poll + 1)
    syncs, fires = store.times["sync_schedules"], store.times["fire_schedules"]
    assert len(syncs) == 4
    assert fires[0] == syncs[3]  # synced, then fired at once
    tries = syncs[:3] + fires[:13]
    for n, gap in enumerate(gaps(tries)):
        assert within(gap, min(cap, 0.5 * 2**n)), (n, gap)
    assert any(gap > cap * 0.9 for gap in gaps(tries))
    logged = messages(caplog, WORKER, logging.WARNING)
    assert len(logged) == 16
    for message, gap in zip(logged, gaps(tries), strict=False):
        assert re.fullmatch(
            r"cannot fire schedules: (sync|fire)_schedules: down; retrying in [\d.]+s", message
        )
        assert message.endswith(f" {gap:.1f}s")
    again = fires[before + 1] - fires[before]
    assert logged[-1] == f"cannot fire schedules: fire_schedules: down; retrying in {again:.1f}s"
    assert within(again, 0.5)
    assert len(store.items()) == 1


# -- presence -------------------------------------------------------------------------


async def test_the_worker_advertises_itself_and_records_when_it_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Advertised at 0, 15, 30 s with what it serves; cancelled, it still records that
    it stopped (the store's Workers table forgets it)."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping())
    async with running(store, registry, Settings(concurrency=2), scopes=["b", "a"]):
        await trio.sleep(31)
        assert store.workers["w1"] == WorkerInfo(
            id="w1",
            host=socket.gethostname(),
            pid=os.getpid(),
            kinds=("A",),
            scopes=("a", "b"),
            unscoped=False,
            concurrency=2,
            advertise_every=15.0,  # its recovery interval: how it is judged alive
        )
    # Once to claim its id before it claims anything, then every recovery interval.
    assert store.times["advertise"] == [0.0, 0.0, 15.0, 30.0]
    assert store.times["worker_stopped"] == [31.0]
    assert store.workers == {}


def holder(pid: int = 1, advertise_every: float | None = 15.0) -> WorkerInfo:
    """Another process's Worker "w1"."""
    return WorkerInfo(id="w1", host="elsewhere", pid=pid, kinds=("A",), scopes=None,
                      unscoped=True, concurrency=1, advertise_every=advertise_every)  # fmt: skip


async def test_a_worker_id_a_live_worker_holds_is_refused_before_any_claim(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Issue 20: a second Worker "w1" beside a live one raises ConfigurationError
    naming the holder, and claims, advertises and stops nothing: the live one's row
    is untouched."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping())
    await store.advertise(holder())
    await trio.sleep(44)  # alive for 3 of its 15 s intervals
    worker = Worker(store, registry, Settings(), worker_id="w1", fail_stop=Failstops())
    with pytest.raises(ConfigurationError, match="worker id 'w1' is in use by a live Worker"
                       r" \(host elsewhere, pid 1, seen 44.0s ago\)"):  # fmt: skip
        await worker.run()
    assert store.times["advertise"] == [0.0, 44.0]
    assert "claim_batch" not in store.times and "worker_stopped" not in store.times
    assert store.workers["w1"] == holder()


@pytest.mark.parametrize(("advertise_every", "gone_after"), [(15.0, 45), (None, 180)])
async def test_a_worker_id_whose_holder_is_gone_is_taken_afresh(
    autojump_clock: trio.testing.MockClock, advertise_every: float | None, gone_after: float
) -> None:
    """Three of the holder's intervals after its last advertisement (180 s for one of
    an earlier version, which did not say), the id is free: the Worker runs, with a
    new started_at, and `status` counted the dead one alive only until then."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping())
    await store.advertise(holder(advertise_every=advertise_every))
    await trio.sleep(gone_after - 1)
    assert [w.alive for w in (await store.status()).workers] == [True]
    await trio.sleep(1)
    assert [w.alive for w in (await store.status()).workers] == [False]
    async with running(store, registry):
        [state] = (await store.status()).workers
        assert (state.pid, state.alive) == (os.getpid(), True)
        assert state.started_at == state.last_seen  # afresh, not the dead one's


async def test_a_worker_whose_id_is_taken_over_stops_claiming_and_says_so(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A Worker cut off long enough to seem gone, whose id another took meanwhile: its
    next advertisement is refused; it logs that once, claims nothing more, lets its
    running item have the shutdown grace (then releases it, fenced), records no stop
    over the other's row, and its run ends with IdTakenOver (issue 35, item 10)."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping())
    first = await store.enqueue("A")
    settings = Settings(concurrency=2, shutdown_grace=5.0)
    taken = pytest.RaisesExc(IdTakenOver, match="worker id 'w1' is in use by a live Worker")
    with trio.fail_after(120), pytest.RaisesGroup(taken):
        async with running(store, registry, settings) as worker:
            assert worker.statistics().running == 1
            store.workers.pop("w1")
            store._seen.pop("w1")
            store._advertised.pop("w1")
            await store.advertise(holder())
            taken_at = trio.current_time()
            await trio.sleep(settings.recovery_every + 1)  # found at the next advertisement
            second = await store.enqueue("A")  # a free slot, and an item for it
            await trio.sleep(2)
            assert worker.statistics().claimed == 1
    assert trio.current_time() - taken_at <= settings.recovery_every + settings.shutdown_grace + 1
    [error] = messages(caplog, WORKER, logging.ERROR)
    assert error.startswith(
        "this Worker's id was taken over while it seemed gone: worker id 'w1' is in use by"
        " a live Worker (host elsewhere, pid 1, seen "
    )
    assert error.endswith(
        "give each Worker its own --worker-id; stopping: no new claims, running items end"
        " by their fence"
    )
    assert "worker_stopped" not in store.times
    assert store.workers["w1"] == holder()
    assert (await store.get_item(second.id)).status is Status.QUEUED  # type: ignore[union-attr]
    assert (await store.get_item(first.id)).status is Status.QUEUED  # type: ignore[union-attr]


async def test_a_worker_that_seemed_gone_claims_only_once_it_has_advertised_again(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """No advertisement for three recovery intervals (others may take the id over): the
    claim loop advertises first, quietly (the presence loop logs the failures), and
    claims nothing until one succeeds; then it claims as before."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping())
    # Only claim_id's advertisement, at 0, is made.
    store.script["advertise"] = itertools.chain(["ok"], always("fail"))
    async with running(store, registry) as worker:
        advertised = 1
        await trio.sleep(50)  # the only good advertisement was at 0: gone for others at 45
        await store.enqueue("A")
        await trio.sleep(5)  # 55: between two of the presence loop's (its next is at 60)
        assert worker.statistics().claimed == 0
        failed = len(store.times["advertise"]) - advertised
        warned = messages(caplog, WORKER, logging.WARNING)
        assert set(warned) == {"could not advertise this Worker: advertise: down"}
        # The presence loop's at 0, 15, 30 and 45 only: the claim loop's tries since 45
        # (at least three by 55, its backoff's first steps) are not logged.
        assert len(warned) == 4 and failed >= len(warned) + 3, (warned, store.times)
        del store.script["advertise"]
        await trio.sleep(15)  # the claim loop's backoff: at most 10 s, and its jitter
        assert worker.statistics().claimed == 1


async def test_a_worker_seems_gone_after_three_recovery_intervals_without_advertising(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Exactly three intervals since the last advertisement is gone (others take the id
    at `last_seen <= now() - 3 intervals`); never advertised is not."""
    worker = Worker(ScriptedStore(), Registry(), Settings(), worker_id="w1", fail_stop=Failstops())
    assert not worker._seemed_gone()
    now = trio.current_time()
    worker._advertised_at = now - 45.0
    assert trio.current_time() - worker._advertised_at == 45.0
    assert worker._seemed_gone()
    worker._advertised_at = now - 44.0
    assert not worker._seemed_gone()
    await trio.sleep(50)
    assert worker._seemed_gone()
    assert await worker._advertise()  # each advertisement starts the count again
    assert worker._advertised_at == trio.current_time()
    assert not worker._seemed_gone()


async def test_an_advertisement_counts_from_when_it_was_sent_not_when_its_answer_came(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A Worker stopped (SIGSTOP, a stalled link) after sending an advertisement and
    before reading its answer seemed gone to others all that while, and its id may be
    another's: the count starts when it was sent, so the claim loop advertises again
    before it claims. (A resumed Worker whose answer came after its pause claimed at
    once, under an id taken over meanwhile: test_id_taken_over.)"""
    store = ScriptedStore()
    worker = Worker(store, Registry(), Settings(), worker_id="w1", fail_stop=Failstops())
    store.script["advertise"] = [50.0, 50.0]  # the answers come 50 s late (gone at 45)
    sent_at = trio.current_time()
    await worker.claim_id()
    assert worker._advertised_at == sent_at
    assert worker._seemed_gone()
    sent_at = trio.current_time()
    assert await worker._advertise()
    assert worker._advertised_at == sent_at
    assert worker._seemed_gone()


async def test_a_worker_serving_every_scope_advertises_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """scopes=None in the Workers table: every scope, and unscoped items."""
    store = ScriptedStore()
    async with running(store, Registry()):
        info = store.workers["w1"]
    assert (info.scopes, info.unscoped, info.kinds) == (None, True, ())


async def test_presence_failures_are_logged(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A failed advertisement is logged and retried; a Worker never advertised records
    no stop; a failed stop record is logged."""
    store = ScriptedStore()
    store.script["advertise"] = always("fail")
    async with running(store, Registry()):
        await trio.sleep(20)
    assert (
        messages(caplog, WORKER, logging.WARNING)
        == ["could not advertise this Worker: advertise: down"] * 2
    )
    assert store.times["worker_stopped"] == []
    caplog.clear()
    store = ScriptedStore()
    store.script["advertise"] = ["fail", "fail"]  # claiming its id at start, then the loop
    store.script["worker_stopped"] = ["fail"]
    async with running(store, Registry()):
        await trio.sleep(20)
    assert messages(caplog, WORKER, logging.WARNING) == [
        "could not advertise this Worker: advertise: down",
        "could not record that this Worker stopped: worker_stopped: down",
    ]


async def test_recording_the_stop_is_bounded_by_the_poll_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A stop record that gets no answer is given up after the poll interval."""
    store = ScriptedStore()
    store.script["worker_stopped"] = ["hang"]
    async with running(store, Registry(), Settings(poll=3)):
        await trio.sleep(1)
    assert trio.current_time() == 4.0


# -- the watchdog link ----------------------------------------------------------------


class FakeLink(WatchdogLink):
    """Stands in for the pipe to the supervisor: records what the loop publishes."""

    def __init__(self) -> None:  # no pipe
        self.published: list[tuple[float, float]] = []  # (kill_at, Trio's clock)

    def publish(self, kill_at: float) -> None:
        self.published.append((kill_at, trio.current_time()))


async def test_the_loop_publishes_its_kill_bound_when_the_earliest_deadline_moves(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each change of the earliest self-stop deadline is published once, as a
    `time.monotonic()` instant: deadline + stop grace + kill margin (inf: none running).
    Two attempts claimed together share a deadline; one ending while the other runs on
    changes nothing. (The Worker's `time.monotonic()` stands still at 1000 here, so the
    bound is exact, whatever the machine's load.)"""
    monkeypatch.setattr(worker_module, "time", types.SimpleNamespace(monotonic=lambda: 1000.0))
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping(15))
    registry.handler("B")(sleeping(5))
    await store.enqueue("A")
    await store.enqueue("B")
    link = FakeLink()
    settings = Settings(concurrency=2)
    async with running(store, registry, settings, watchdog=link):
        await trio.sleep(20)
    published = [(at, kill_at - 1000.0) for kill_at, at in link.published]
    after = settings.self_stop_after + settings.stop_grace + settings.kill_margin
    assert after == 46.0
    # Claimed at 0 (deadline 30), the heartbeat at 10 (deadline 40), A ends at 15.
    assert published == [(0.0, after), (10.0, after), (15.0, math.inf)]


@pytest.mark.parametrize(
    "op",
    ["claim", "recover_expired_leases", "settle_noted_scopes", "advertise",
     "fire_schedules"],
)  # fmt: skip
async def test_every_loop_ends_the_worker_on_a_missing_schema(
    autojump_clock: trio.testing.MockClock, op: str
) -> None:
    """SchemaNotReady is no store error to retry: whichever loop meets it, the Worker
    stops with it (the command line exits 1 saying to migrate)."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("Crawl")(sleeping(1))
    registry.periodic("Crawl", every=60)
    store.script[op] = ["unmigrated"]
    with pytest.RaisesGroup(pytest.RaisesExc(SchemaNotReady, match=op), flatten_subgroups=True):
        async with running(store, registry):
            await trio.sleep(3600)


async def test_a_schema_gone_between_advertisements_is_no_id_taken_over(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The presence loop's advertisement meets a missing schema: the Worker stops with
    SchemaNotReady, and says nothing of its id being taken over (SchemaNotReady is no
    ConfigurationError, which a refused advertisement is)."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("Crawl")(sleeping(1))
    store.script["advertise"] = ["ok", "unmigrated"]
    missing = pytest.RaisesExc(SchemaNotReady, match="advertise")
    with pytest.RaisesGroup(missing, flatten_subgroups=True):
        async with running(store, registry):
            await trio.sleep(3600)
    assert len(store.times["advertise"]) == 2
    assert not [m for m in messages(caplog, WORKER, logging.ERROR) if "taken over" in m]


# -- slots and completions ----------------------------------------------------------------


@pytest.mark.parametrize("scope", [None, "s"])
async def test_a_completions_slot_goes_to_the_claim_sent_with_it(
    autojump_clock: trio.testing.MockClock, scope: str | None
) -> None:
    """Concurrency 1, a handler of 1 s, completions that take 3 s to write: the next
    item, unscoped or of a scope, is claimed in the same call as the first one's
    completion (one round trip for both, work_finish_and_claim_v3), so it starts
    once that call has answered. Each is completed by its one fenced write. (Before
    issue 32, an unscoped item's slot went back as its handler returned, and the next one
    was claimed while the completion was written: two round trips.)"""
    second_starts_at = 4.0
    store, registry = ScriptedStore(), Registry()
    starts: list[float] = []
    registry.handler("A")(sleeping(1, starts))

    for n in range(2):
        await store.enqueue("A", scope=None if scope is None else f"{scope}{n}")
    store.script["complete_batch"] = [3.0, 3.0]
    with trio.fail_after(100):
        async with running(store, registry, Settings(concurrency=1)):
            await trio.sleep(10)  # both written by 7 s at the latest
    assert starts == [0.0, second_starts_at]
    assert [(w.op, w.id, w.attempt, w.applied) for w in store.writes] == [
        ("complete", 1, 1, True), ("complete", 2, 1, True)
    ]  # fmt: skip


async def test_a_completion_retried_after_its_slot_went_back_is_still_written_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The first completion's statement fails: the retried write of that unscoped item
    (whose slot is already back) applies once, and the next item runs meanwhile."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping(1))
    for _ in range(2):
        await store.enqueue("A")
    store.script["complete_batch"] = ["fail"]
    with trio.fail_after(100):
        async with running(store, registry, Settings(concurrency=1)):
            await trio.sleep(10)
    # Item 1's write fails at 1 s and is retried within a second; item 2 runs from 1 s.
    assert [(w.op, w.id, w.applied) for w in store.writes] == [
        ("complete", 1, True), ("complete", 2, True)
    ]  # fmt: skip
    assert store.times["claim"][:2] == [0.0, 1.0]


@pytest.mark.parametrize("release", ["ok", "fail"])
async def test_a_claim_along_answered_after_the_items_ended_gives_its_items_back(
    autojump_clock: trio.testing.MockClock, release: str
) -> None:
    """Concurrency 1: item 1's completion goes out at 1 s with the claim of item 2, and
    its statement takes 3 s. The Worker is stopped at 2 s, and its items end at 3 s (a
    shutdown grace of 1 s): item 2, claimed by the answer at 4 s, is released at once
    (back to Queued, not after its lease) and its slot given back, and the Worker stops
    cleanly; if the release fails, the Worker stops cleanly all the same (the lease's
    expiry gives item 2 back)."""
    store, registry = ScriptedStore(), Registry()
    starts: list[int] = []

    @registry.handler("A")
    async def handler(item: WorkItem, ctx: Context) -> None:
        starts.append(item.id)
        await trio.sleep(1)

    await store.enqueue("A")
    store.script["complete_batch"] = [3.0]
    store.script["release"] = [release]
    settings = Settings(concurrency=1, shutdown_grace=1)
    with trio.fail_after(100):
        async with running(store, registry, settings) as worker:
            await trio.sleep(0.5)
            await store.enqueue("A")  # no slot free: claimed only along with item 1's end
            await trio.sleep(1.5)
            worker.stop()
    assert starts == [1]
    assert store.times["claim"] == [0.0, 4.0]
    released = [("release", 2, 1, True)] if release == "ok" else []
    assert [(w.op, w.id, w.attempt, w.applied) for w in store.writes] == [
        ("complete", 1, 1, True), *released
    ]  # fmt: skip
    assert store.times["release"] == [4.0]
    assert worker.statistics().running == 0


async def test_a_stopping_worker_writes_its_completions_without_claiming(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Stopped at 1 s while item 1's handler runs to 2 s: its completion is written on its
    own, with no claim along (the queue's item 2 stays Queued for other Workers)."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping(2))
    for _ in range(2):
        await store.enqueue("A")
    with trio.fail_after(100):
        async with running(store, registry, Settings(concurrency=1)) as worker:
            await trio.sleep(1)
            worker.stop()
    assert store.times["claim"] == [0.0]
    assert store.times["complete_batch"] == [2.0]
    assert [(w.op, w.id) for w in store.writes] == [("complete", 1)]


async def test_a_worker_that_seemed_gone_writes_its_completions_without_claiming(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """No advertisement has got through since 0 (gone for others at 45 s: its id may be
    another's); item 1's handler ends at 50 s: its completion is written on its own, with
    no claim along (the claim loop claims only once an advertisement gets through)."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping(50))
    for _ in range(2):
        await store.enqueue("A")
    store.script["advertise"] = itertools.chain(["ok"], always("fail"))
    with trio.fail_after(100):
        async with running(store, registry, Settings(concurrency=1)):
            await trio.sleep(60)
    assert store.times["claim"] == [0.0]
    assert store.times["complete_batch"] == [50.0]
    assert [(w.op, w.id) for w in store.writes if w.op != "heartbeat"] == [("complete", 1)]


async def test_after_a_claim_along_that_filled_its_slots_the_next_claim_goes_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Concurrency 1, poll 5 s: item 1 completes at 1 s and the claim sent with it takes
    item 2 (all it asked for); item 2 fails at 2 s, its slot comes free, and the claim
    loop claims item 3 at once: it does not wait the poll as after a claim that came
    back short."""
    store, registry = ScriptedStore(), Registry()
    starts: list[tuple[int, float]] = []

    @registry.handler("A")
    async def handler(item: WorkItem, ctx: Context) -> None:
        starts.append((item.id, trio.current_time()))
        await trio.sleep(1)
        if item.id == 2:
            raise ValueError("item 2 fails")

    for _ in range(3):
        await store.enqueue("A")
    with trio.fail_after(100):
        async with running(store, registry, Settings(concurrency=1, poll=5)):
            await trio.sleep(3.5)
    assert starts == [(1, 0.0), (2, 1.0), (3, 2.0)]
    assert store.times["claim"][:3] == [0.0, 1.0, 2.0]


async def test_after_a_claim_along_that_came_back_short_the_loop_waits_the_poll(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Concurrency 2, poll 5 s: item 1 completes at 1 s while item 2 runs, and the claim
    sent with it finds nothing (short by its one slot): the slot waits (the poll, or a
    NOTIFY) instead of claiming again at once; item 3, enqueued at 1.5 s, is claimed
    then, by the claim its NOTIFY wakes."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping(1))
    registry.handler("B")(sleeping(10))
    await store.enqueue("A")
    await store.enqueue("B")
    with trio.fail_after(100):
        async with running(store, registry, Settings(concurrency=2, poll=5)):
            await trio.sleep(1.5)
            await store.enqueue("A")
            await trio.sleep(1)
    assert store.times["claim"] == [0.0, 1.0, 1.5]


async def test_after_a_claim_of_its_own_that_came_back_short_the_loop_waits_the_poll(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Concurrency 2, poll 5 s, one item: the claim at 0 s takes it and comes back short
    by a slot, so nothing more could start (a claim takes every item that may); the loop
    waits the poll instead of sending an empty claim at once."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping(20))
    await store.enqueue("A")
    with trio.fail_after(100):
        async with running(store, registry, Settings(concurrency=2, poll=5)):
            await trio.sleep(7)
    assert store.times["claim"] == [0.0, 5.0]


async def test_an_unscoped_failures_slot_comes_free_before_its_write(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Concurrency 1: item 1 fails at 1 s and its write (a retry later) takes 3 s; its
    handler is over, so its slot is free at once and item 2 is claimed at 1 s, while
    the write is in flight."""
    store, registry = ScriptedStore(), Registry()

    @registry.handler("A")
    async def handler(item: WorkItem, ctx: Context) -> None:
        await trio.sleep(1)
        if item.id == 1:
            raise ValueError("item 1 fails")

    for _ in range(2):
        await store.enqueue("A")
    store.script["retry_later"] = [3.0]
    with trio.fail_after(100):
        async with running(store, registry, Settings(concurrency=1, poll=5)):
            await trio.sleep(3)
    assert store.times["claim"][:2] == [0.0, 1.0]
    assert store.times["retry_later"] == [1.0]


async def test_after_a_full_claim_along_a_failed_one_leaves_the_loop_claiming_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Concurrency 1, poll 5 s, three items of three scopes (no NOTIFY when one ends):
    item 1's completion at 1 s claims item 2 along (all it asked for); item 2's at 2 s
    fails, its slot goes back unused, and the claim loop claims item 3 at once (the last
    claim along was not short): no wait for the poll."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("A")(sleeping(1))
    for n in range(3):  # each of its own scope: no finish frees a scope others wait on
        await store.enqueue("A", scope=f"s{n}")
    store.script["complete_batch"] = ["ok", "fail"]
    with trio.fail_after(100):
        async with running(store, registry, Settings(concurrency=1, poll=5)):
            await trio.sleep(2.5)
    assert store.times["complete_batch"][:2] == [1.0, 2.0]
    assert store.times["claim"][:3] == [0.0, 1.0, 2.0]


# -- limits declared with the handlers ------------------------------------------------


async def test_a_declared_limit_is_in_force_before_the_first_claim(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """K declares limit=2 and the database held 5 for it (set by the CLI, say): the
    Worker replaces it as it starts, says so, and of five items, concurrency 5, two
    run at once. L declares a rate and had no limit: it is put in force, said at INFO."""
    caplog.set_level(logging.INFO)
    store, registry = ScriptedStore(), Registry()
    starts: list[float] = []
    registry.handler("K", limit=2)(sleeping(1, starts))

    registry.handler("L", rate="10/min")(sleeping(1))
    await store.set_limit(kind="K", running=5)
    for _ in range(5):
        await store.enqueue("K")
    with trio.fail_after(100):
        async with running(store, registry, Settings(concurrency=5, poll=5)):
            await trio.sleep(3.5)
    assert starts == [0.0, 0.0, 1.0, 1.0, 2.0]
    said = [m for m in messages(caplog, WORKER, logging.INFO) if m.startswith("kind ")]
    assert said == [
        "kind K: its declared limit (running 2) replaces the one the database held (running 5)",
        "kind L: its declared limit is in force (rate 10/min)",
    ]
    assert [r.levelno for r in records(caplog, "kind ")] == [logging.WARNING, logging.INFO]


async def test_a_declared_limit_already_in_force_is_left_as_it_is_and_not_said(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A second Worker start finds the declared limit in the database: nothing is
    written or said about it."""
    caplog.set_level(logging.INFO)
    store, registry = ScriptedStore(), Registry()
    registry.handler("K", limit=2)(sleeping(1))
    for _ in range(2):
        async with running(store, registry, Settings(poll=5)):
            await trio.sleep(1)
    assert len(records(caplog, "kind K")) == 1
    assert [(lim.kind, lim.running) for lim in await store.limits()] == [("K", 2)]


async def test_no_claim_until_the_declared_limit_is_in_force(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL refuses the declaration twice (backoff 0.5 s, then 1 s, each spread by
    20%): the Worker says so each time and claims nothing until it has gone through."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("K", limit=1)(sleeping(1))
    await store.enqueue("K")
    store.script["declare_limit"] = ["fail", "fail"]
    with trio.fail_after(100):
        async with running(store, registry, Settings(poll=5)):
            await trio.sleep(3)
    declared_at = store.times["declare_limit"]
    assert len(declared_at) == 3 and within(gaps(declared_at)[0], 0.5)
    assert within(gaps(declared_at)[1], 1.0)
    assert store.times["claim"][0] == declared_at[-1]
    warned = [r.getMessage() for r in records(caplog, "cannot put the limit declared")]
    assert warned == [
        "cannot put the limit declared for kind K in force: declare_limit: down; no claims"
        f" until it is; retrying in {gap:.1f}s"
        for gap in gaps(declared_at)
    ]
    assert all(r.levelno == logging.WARNING for r in records(caplog, "cannot put"))


def test_a_declared_limit_is_checked_when_the_handler_is_registered() -> None:
    """A limit that could never be set is refused at the decorator, naming the kind."""
    registry = Registry()
    with pytest.raises(ConfigurationError, match=r"the limit declared for 'K': running limit 0"):
        registry.handler("K", limit=0)
    with pytest.raises(ConfigurationError, match=r"'K'.*rate"):
        registry.handler("K", rate="often")
    registry.handler("B", limit=3, rate="5/s")(sleeping(1))
    registry.handler("A")(sleeping(1))
    assert [(d.kind, d.running, str(d.rate)) for d in registry.declared_limits] == [("B", 3, "5/s")]


async def test_a_declared_limit_the_database_refuses_stops_the_worker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Refused (not unreachable: the Worker's role may not, say): ConfigurationError
    naming the kind and the grant, before any claim."""
    store, registry = ScriptedStore(), Registry()
    registry.handler("K", limit=1)(sleeping(1))
    await store.enqueue("K")
    store.script["declare_limit"] = ["refuse"]
    worker = Worker(store, registry, Settings(poll=5), worker_id="w", fail_stop=Failstops())
    with trio.fail_after(100), pytest.raises(ConfigurationError) as raised:
        await worker.run()
    assert str(raised.value) == (
        "cannot put the limit declared for kind K in force: declare_limit: refused (a"
        " Worker's role needs EXECUTE on work_declare_limit_v1: docs/grants.sql)"
    )
    assert store.times["claim"] == []
