"""The operating side of the Store contract (batches, pauses, retries, retention,
schedules), run against PostgreSQL and the in-memory store alike."""

from __future__ import annotations

import datetime as dt

import pytest

from tests.support.harness import Harness
from trioworker import InvalidWorkItem, NewItem, Status
from trioworker._core.schedule import Schedule

LEASE = 30.0
KINDS = ("A", "B", "Tick")


async def fail_one(harness: Harness, kind: str = "A", **enqueue: object) -> int:
    """Enqueue an item of `kind` and fail its only attempt; its id."""
    item = await harness.store.enqueue(kind, **enqueue)  # type: ignore[arg-type]
    claimed = await harness.store.claim("w", LEASE, kinds=[kind])
    assert claimed is not None and claimed.id == item.id
    assert await harness.store.fail(claimed.id, claimed.attempt, "boom", "E: boom", "tb")
    return item.id


# -- enqueue_many --------------------------------------------------------------------


async def test_enqueue_many_queues_every_item_in_order(harness: Harness) -> None:
    """One call, every item Queued as enqueue would, results in the order given."""
    results = await harness.store.enqueue_many(
        [
            NewItem("A", scope="s1", payload={"n": 1}),
            NewItem("B", priority=5),
            NewItem("A", scope="s1", run_after=dt.timedelta(hours=1)),
        ]
    )
    items = harness.items()
    assert [r.id for r in results] == [i.id for i in items]
    assert not any(r.deduplicated for r in results)
    assert [(i.kind, i.scope, i.priority, i.payload) for i in items] == [
        ("A", "s1", 0, {"n": 1}),
        ("B", None, 5, {}),
        ("A", "s1", 0, {}),
    ]
    assert items[2].run_after - items[0].run_after > dt.timedelta(minutes=59)
    assert await harness.store.enqueue_many([]) == []


async def test_enqueue_many_merges_dedup_keys_in_the_batch_and_with_queued_items(
    harness: Harness,
) -> None:
    """A dedup key held by a Queued item, or by an earlier item of the batch, merges."""
    held = await harness.store.enqueue("A", dedup_key="held")
    results = await harness.store.enqueue_many(
        [
            NewItem("A", dedup_key="new"),
            NewItem("A", dedup_key="held"),
            NewItem("A"),
            NewItem("A", dedup_key="new"),
        ]
    )
    assert [r.deduplicated for r in results] == [False, True, False, True]
    assert results[1].id == held.id and results[3].id == results[0].id
    assert len(harness.items()) == 3
    assert harness.store.statistics().dedup_hits == 2


async def test_enqueue_many_writes_nothing_if_one_item_is_bad(harness: Harness) -> None:
    """All or nothing: the bad item is named by its index and no item is written."""
    with pytest.raises(InvalidWorkItem, match=r"item 2: scope must not be empty"):
        await harness.store.enqueue_many([NewItem("A"), NewItem("B"), NewItem("A", scope="")])
    with pytest.raises(InvalidWorkItem, match=r"item 0: a NewItem, not dict"):
        await harness.store.enqueue_many([{"kind": "A"}])  # type: ignore[list-item]
    assert harness.items() == []


# -- pause and resume ----------------------------------------------------------------


async def test_a_paused_scope_waits_while_other_scopes_run(harness: Harness) -> None:
    """Paused: its items are not claimed, other scopes' and unscoped ones are."""
    store = harness.store
    paused = await store.enqueue("A", scope="s1")
    other = await store.enqueue("A", scope="s2")
    unscoped = await store.enqueue("A")
    assert await store.pause(scope="s1") is True
    assert await store.pause(scope="s1") is False  # paused already
    claimed = await store.claim_batch("w", LEASE, 10, kinds=KINDS)
    assert sorted(i.id for i in claimed) == [other.id, unscoped.id]
    assert await store.claim("w", LEASE, kinds=KINDS) is None
    assert await store.claim("w", LEASE, ["s1"], kinds=KINDS) is None
    assert await store.seconds_until_due(kinds=KINDS) is None
    assert [(p.kind, p.scope) for p in await store.pauses()] == [(None, "s1")]
    assert await store.resume(scope="s1") is True
    assert await store.resume(scope="s1") is False
    resumed = await store.claim("w", LEASE, kinds=KINDS)
    assert resumed is not None and resumed.id == paused.id
    assert await store.pauses() == []


async def test_a_paused_kind_is_not_claimed_and_running_work_goes_on(harness: Harness) -> None:
    """A kind's pause stops claims of it, scoped or not; its Running item can finish."""
    store = harness.store
    await store.enqueue("A", scope="s1")
    running = await store.claim("w", LEASE, kinds=KINDS)
    assert running is not None
    waiting = await store.enqueue("A")
    await store.enqueue("A", scope="s2", run_after=dt.timedelta(seconds=30))
    b = await store.enqueue("B")
    assert await store.pause(kind="A")
    claimed = await store.claim_batch("w", LEASE, 10, kinds=KINDS)
    assert [i.id for i in claimed] == [b.id]
    assert await store.seconds_until_due(kinds=KINDS) is None
    assert await store.complete(running.id, running.attempt)
    assert await store.resume(kind="A")
    again = await store.claim("w", LEASE, kinds=KINDS)
    assert again is not None and again.id == waiting.id


async def test_pause_takes_a_kind_or_a_scope(harness: Harness) -> None:
    with pytest.raises(InvalidWorkItem, match="exactly one"):
        await harness.store.pause()
    with pytest.raises(InvalidWorkItem, match="exactly one"):
        await harness.store.resume(kind="A", scope="s")
    with pytest.raises(InvalidWorkItem, match="scope must not be empty"):
        await harness.store.pause(scope=" ")


# -- retry ---------------------------------------------------------------------------


async def test_retry_puts_failed_items_back_with_a_fresh_budget(harness: Harness) -> None:
    """Failed and Cancelled back to Queued, due now, failures and stalls zero; attempt
    numbers and history go on, the retry a mark in it of its own (issue 20). Others are
    left as they are."""
    store = harness.store
    failed = await fail_one(harness, scope="s1")
    cancelled = await store.enqueue("A")
    await store.cancel(cancelled.id)
    queued = await store.enqueue("B")
    done = await store.enqueue("B", scope="s9")
    claimed = await store.claim("w", LEASE, ["s9"], kinds=["B"], unscoped=False)
    assert claimed is not None and await store.complete(claimed.id, claimed.attempt)
    retried = await store.retry([failed, cancelled.id, queued.id, done.id, 999_999, failed])
    assert retried == [failed, cancelled.id]
    rows = {i.id: i for i in harness.items()}
    assert rows[failed].status is Status.QUEUED and rows[failed].failures == 0
    assert rows[failed].finished_at is None
    assert rows[failed].reason == "retried by an operator after attempt 1"
    assert rows[cancelled.id].status is Status.QUEUED
    assert not rows[cancelled.id].cancel_requested
    assert rows[done.id].status is Status.SUCCEEDED
    again = await store.claim("w", LEASE, ["s1"], kinds=["A"], unscoped=False)
    assert again is not None and again.id == failed and again.attempt == 3
    assert again.failures == 0
    outcomes = [a.outcome for a in await store.attempts(failed)]
    assert outcomes == ["failed", "operator-retry", "running"]


async def test_retry_leaves_an_item_whose_dedup_key_is_queued_again(harness: Harness) -> None:
    store = harness.store
    failed = await fail_one(harness, dedup_key="k")
    await store.enqueue("A", dedup_key="k")
    assert await store.retry([failed]) == []
    assert harness.items()[0].status is Status.FAILED


async def test_failed_items_by_kind_and_since(harness: Harness) -> None:
    a1 = await fail_one(harness, "A")
    b1 = await fail_one(harness, "B")
    a2 = await fail_one(harness, "A")
    harness.age(a1, 3600)
    assert await harness.store.failed_items() == [a1, b1, a2]
    assert await harness.store.failed_items(kind="A") == [a1, a2]
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=30)
    if harness.name == "memory":
        since = harness.store.now() - dt.timedelta(minutes=30)  # type: ignore[union-attr]
    assert await harness.store.failed_items(kind="A", since=since) == [a2]


# -- retention -----------------------------------------------------------------------


async def test_delete_finished_goes_by_status_in_bounded_batches(harness: Harness) -> None:
    """Only finished items of the statuses given, older than the cut-off, in batches of
    at most `batch`; Queued and Running items are never touched."""
    store = harness.store
    failed = [await fail_one(harness) for _ in range(3)]
    succeeded = []
    for _ in range(4):
        item = await store.enqueue("B")
        claimed = await store.claim("w", LEASE, kinds=["B"])
        assert claimed and await store.complete(claimed.id, claimed.attempt)
        succeeded.append(item.id)
    for id in failed + succeeded:
        harness.age(id, 7200)
    queued = await store.enqueue("A")
    running = await store.enqueue("B")
    assert await store.claim("w", LEASE, kinds=["B"])
    batches: list[int] = []
    deleted = await store.delete_finished(
        dt.timedelta(hours=1),
        statuses=[Status.FAILED],
        batch=2,
        on_batch=lambda rows, _seconds: batches.append(rows),
    )
    assert deleted == 3 and batches == [2, 1]
    left = {i.id for i in harness.items()}
    assert left == {*succeeded, queued.id, running.id}
    assert await store.delete_finished(dt.timedelta(hours=3)) == 0
    assert await store.delete_finished(dt.timedelta(hours=1), batch=3) == 4
    assert {i.id for i in harness.items()} == {queued.id, running.id}
    with pytest.raises(ValueError, match="finished items only"):
        await store.delete_finished(dt.timedelta(0), statuses=[Status.QUEUED])


# -- schedules -----------------------------------------------------------------------


async def test_a_schedule_fires_once_per_due_time_and_catches_up_once(harness: Harness) -> None:
    """A new `every` schedule is due at once; firing enqueues one item and moves it on;
    after a long gap, one item for the latest missed due time."""
    store = harness.store
    tick = Schedule("Tick", every=60.0, payload={"n": 1})
    await store.sync_schedules([tick])
    fired, wait = await store.fire_schedules([tick])
    assert [(f.name, f.deduplicated) for f in fired] == [("Tick", False)]
    assert wait is not None and 55 < wait <= 60
    assert (await store.fire_schedules([tick]))[0] == []  # not due again yet
    item = harness.items()[0]
    assert (item.kind, item.payload) == ("Tick", {"n": 1})
    assert item.dedup_key == "trioworker.schedule:Tick"
    claimed = await store.claim("w", LEASE, kinds=["Tick"])
    assert claimed and await store.complete(claimed.id, claimed.attempt)
    harness.backdate_schedule("Tick", 60 * 5 + 1)  # five due times missed
    fired, _ = await store.fire_schedules([tick])
    assert len(fired) == 1 and len(harness.items()) == 2
    (state,) = await store.schedules()
    assert state.last_item == fired[0].item and state.last_due == fired[0].due
    assert state.next_due > fired[0].due


async def test_a_schedule_whose_item_still_waits_adds_none(harness: Harness) -> None:
    """While the schedule's item is Queued (its kind paused), a due time merges onto it."""
    store = harness.store
    tick = Schedule("Tick", every=60.0)
    await store.sync_schedules([tick])
    (first,), _ = await store.fire_schedules([tick])
    harness.backdate_schedule("Tick", 61)
    (second,), _ = await store.fire_schedules([tick])
    assert second.deduplicated and second.item == first.item
    assert len(harness.items()) == 1


async def test_a_changed_schedule_starts_afresh_and_the_old_one_is_not_fired(
    harness: Harness,
) -> None:
    store = harness.store
    old = Schedule("Tick", every=60.0)
    new = Schedule("Tick", every=3600.0)
    await store.sync_schedules([old])
    await store.fire_schedules([old])
    await store.sync_schedules([new])
    harness.backdate_schedule("Tick", 3601)
    assert (await store.fire_schedules([old]))[0] == []  # a Worker with the old spec
    fired, _ = await store.fire_schedules([new])
    assert len(fired) == 1
    (state,) = await store.schedules()
    assert state.spec == "every 3600s"
