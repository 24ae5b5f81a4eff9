"""The Store contract, run against PostgreSQL and the in-memory store alike."""

from __future__ import annotations

import datetime as dt

import pytest
import trio

from tests.support.harness import Harness
from trioworker import AttemptRecord, CancelOutcome, InvalidWorkItem, Lost, SelfStopped, Status
from trioworker._core.model import Heartbeat

LEASE = 30.0
KINDS = ("A", "B", "K", "Crawl", "Purge", "TokenCleanup")
KINDS += ("ok", "bad", "again", "done", "queued", "running")


def by_id(harness: Harness) -> dict[int, object]:
    return {item.id: item for item in harness.items()}


async def test_enqueue_returns_a_new_id_for_each_item(harness: Harness) -> None:
    """Each enqueue without a dedup key makes a new Queued item."""
    a = await harness.store.enqueue("Crawl", scope="c1", payload={"path": "/x"})
    b = await harness.store.enqueue("Crawl", scope="c1")
    assert a.id != b.id and not a.deduplicated and not b.deduplicated
    items = harness.items()
    assert [i.status for i in items] == [Status.QUEUED, Status.QUEUED]
    assert items[0].payload == {"path": "/x"} and items[1].payload == {}


async def test_dedup_key_merges_onto_the_queued_item(harness: Harness) -> None:
    """A second enqueue with a Queued item's dedup key returns that item instead."""
    first = await harness.store.enqueue("Crawl", scope="c1", dedup_key="crawl:c1")
    second = await harness.store.enqueue("Crawl", scope="c1", dedup_key="crawl:c1")
    assert second.id == first.id and second.deduplicated
    assert len(harness.items()) == 1
    assert harness.store.statistics().dedup_hits == 1


async def test_dedup_key_is_free_again_once_the_item_runs(harness: Harness) -> None:
    """Only Queued items hold their dedup key: a running crawl does not block the next."""
    first = await harness.store.enqueue("Crawl", dedup_key="k")
    assert await harness.store.claim("w1", LEASE, kinds=KINDS)
    second = await harness.store.enqueue("Crawl", dedup_key="k")
    assert second.id != first.id and not second.deduplicated


async def test_claim_takes_the_oldest_due_item(harness: Harness) -> None:
    """Claims go in enqueue order, and an item is not claimed before its run_after."""
    later = await harness.store.enqueue("A", run_after=dt.timedelta(hours=1))
    first = await harness.store.enqueue("A")
    second = await harness.store.enqueue("A", scope="s")
    one = await harness.store.claim("w1", LEASE, kinds=KINDS)
    two = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert one and two and (one.id, two.id) == (first.id, second.id)
    assert await harness.store.claim("w1", LEASE, kinds=KINDS) is None
    assert by_id(harness)[later.id].status is Status.QUEUED  # type: ignore[attr-defined]


async def test_claim_sets_running_with_attempt_and_lease(harness: Harness) -> None:
    """A claim marks the item Running, bumps its attempt and records the Worker."""
    enqueued = await harness.store.enqueue("A", scope="s", payload={"n": 1})
    item = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert item is not None
    assert (item.id, item.kind, item.scope, item.payload, item.attempt) == (
        enqueued.id, "A", "s", {"n": 1}, 1,
    )  # fmt: skip
    state = harness.items()[0]
    assert state.status is Status.RUNNING and state.worker_id == "w1"
    assert state.lease_expires_at is not None and state.started_at is not None


async def test_busy_scope_is_passed_over_for_other_scopes_and_unscoped(harness: Harness) -> None:
    """While scope C's item runs, a claimer takes scope D's item and an unscoped item."""
    c1 = await harness.store.enqueue("Crawl", scope="C")
    await harness.store.enqueue("Purge", scope="C")
    d = await harness.store.enqueue("Crawl", scope="D")
    free = await harness.store.enqueue("TokenCleanup")
    running = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert running and running.id == c1.id
    taken = {(await harness.store.claim("w2", LEASE, kinds=KINDS)).id for _ in range(2)}  # type: ignore[union-attr]
    assert taken == {d.id, free.id}
    assert await harness.store.claim("w2", LEASE, kinds=KINDS) is None  # C's second item waits


async def test_the_next_item_of_a_scope_is_claimable_once_the_first_finishes(
    harness: Harness,
) -> None:
    """A scope's items run one after the other."""
    first = await harness.store.enqueue("Crawl", scope="C")
    second = await harness.store.enqueue("Purge", scope="C")
    item = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert item and item.id == first.id
    assert await harness.store.claim("w2", LEASE, kinds=KINDS) is None
    assert await harness.store.complete(item.id, item.attempt)
    nxt = await harness.store.claim("w2", LEASE, kinds=KINDS)
    assert nxt and nxt.id == second.id


async def test_claim_restricted_to_scopes(harness: Harness) -> None:
    """A Worker serving some scopes takes only those (and unscoped items only if asked)."""
    await harness.store.enqueue("A", scope="u1")
    mine = await harness.store.enqueue("A", scope="u2")
    unscoped = await harness.store.enqueue("A")
    item = await harness.store.claim("w", LEASE, ["u2", "u3"], unscoped=False, kinds=KINDS)
    assert item and item.id == mine.id
    assert await harness.store.claim("w", LEASE, ["u2", "u3"], unscoped=False, kinds=KINDS) is None
    item = await harness.store.claim("w", LEASE, ["u2"], unscoped=True, kinds=KINDS)
    assert item and item.id == unscoped.id


async def test_heartbeat_reports_ok_then_cancel_requested(harness: Harness) -> None:
    """A heartbeat of the live attempt is Ok, and CancelRequested once a cancel is asked."""
    await harness.store.enqueue("A")
    item = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert item
    assert await harness.store.heartbeat(item.id, item.attempt, LEASE) is Heartbeat.OK
    assert await harness.store.cancel(item.id) is CancelOutcome.REQUESTED
    assert await harness.store.heartbeat(item.id, item.attempt, LEASE) is Heartbeat.CANCEL_REQUESTED
    assert await harness.store.cancel_attempt(item.id, item.attempt)
    assert harness.items()[0].status is Status.CANCELLED


async def test_stale_attempt_writes_nothing_and_is_lost(harness: Harness) -> None:
    """Heartbeat, complete and fail of a superseded attempt write nothing and report Lost."""
    await harness.store.enqueue("A", scope="s")
    old = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert old
    harness.expire_lease(old.id)
    assert len(await harness.store.recover_expired_leases(max_stalls=3)) == 1
    new = await harness.store.claim("w2", LEASE, kinds=KINDS)
    assert new and new.attempt == old.attempt + 1
    before = harness.items()
    assert await harness.store.heartbeat(old.id, old.attempt, LEASE) is Heartbeat.LOST
    assert not await harness.store.complete(old.id, old.attempt)
    assert not await harness.store.fail(old.id, old.attempt, "boom", "Error")
    assert not await harness.store.cancel_attempt(old.id, old.attempt)
    assert not await harness.store.release(old.id, old.attempt)
    assert not await harness.store.retry_later(old.id, old.attempt, 1.0, "Error")
    assert harness.items() == before
    assert await harness.store.complete(new.id, new.attempt)


async def test_complete_fail_and_retry_later(harness: Harness) -> None:
    """complete -> Succeeded; fail -> Failed with reason; retry_later -> Queued later."""
    for kind in ("ok", "bad", "again"):
        await harness.store.enqueue(kind)
    ok, bad, again = [await harness.store.claim("w", LEASE, kinds=KINDS) for _ in range(3)]
    assert ok and bad and again
    assert await harness.store.complete(ok.id, ok.attempt)
    assert await harness.store.fail(bad.id, bad.attempt, "gave up", "ValueError: x")
    assert await harness.store.retry_later(again.id, again.attempt, 3600.0, "OSError: y")
    items = by_id(harness)
    assert items[ok.id].status is Status.SUCCEEDED  # type: ignore[attr-defined]
    assert (items[bad.id].status, items[bad.id].reason, items[bad.id].error) == (  # type: ignore[attr-defined]
        Status.FAILED, "gave up", "ValueError: x",
    )  # fmt: skip
    retried = items[again.id]
    assert retried.status is Status.QUEUED and retried.failures == 1  # type: ignore[attr-defined]
    assert retried.error == "OSError: y"  # type: ignore[attr-defined]
    assert await harness.store.claim("w", LEASE, kinds=KINDS) is None  # not due for an hour


async def test_release_requeues_without_a_stall(harness: Harness) -> None:
    """A released item is Queued again with no stall counted, and runs as the next attempt."""
    await harness.store.enqueue("A", scope="s")
    item = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert item
    assert await harness.store.release(item.id, item.attempt)
    state = harness.items()[0]
    assert (state.status, state.stalls, state.failures) == (Status.QUEUED, 0, 0)
    again = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert again and again.id == item.id and again.attempt == item.attempt + 1


async def test_release_with_a_queued_dedup_sibling_is_superseded(harness: Harness) -> None:
    """A release that would meet a Queued sibling with its dedup key gives way to it."""
    await harness.store.enqueue("Crawl", dedup_key="k")
    item = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert item
    sibling = await harness.store.enqueue("Crawl", dedup_key="k")
    assert await harness.store.release(item.id, item.attempt)
    items = by_id(harness)
    assert items[item.id].status is Status.CANCELLED  # type: ignore[attr-defined]
    assert items[item.id].reason == f"superseded by queued item {sibling.id}"  # type: ignore[attr-defined]
    assert items[sibling.id].status is Status.QUEUED  # type: ignore[attr-defined]


async def test_recovery_requeues_an_expired_lease_and_counts_a_stall(harness: Harness) -> None:
    """An expired lease is requeued with stalls + 1 and can be claimed again."""
    await harness.store.enqueue("A", scope="s")
    item = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert item
    harness.expire_lease(item.id)
    [recovered] = await harness.store.recover_expired_leases(max_stalls=3)
    assert (recovered.id, recovered.status, recovered.stalls) == (item.id, Status.QUEUED, 1)
    state = harness.items()[0]
    assert (state.status, state.stalls, state.worker_id) == (Status.QUEUED, 1, None)
    again = await harness.store.claim("w2", LEASE, kinds=KINDS)
    assert again and again.id == item.id and again.stalls == 1


async def test_recovery_fails_the_item_at_max_stalls(harness: Harness) -> None:
    """The stall that reaches max_stalls fails the item as stalled."""
    await harness.store.enqueue("A", scope="s")
    for stall in (1, 2, 3):
        item = await harness.store.claim("w", LEASE, kinds=KINDS)
        assert item, f"stall {stall}: nothing to claim"
        harness.expire_lease(item.id)
        [recovered] = await harness.store.recover_expired_leases(max_stalls=3)
        assert recovered.stalls == stall
    state = harness.items()[0]
    assert (state.status, state.reason, state.stalls) == (Status.FAILED, "stalled", 3)
    assert await harness.store.claim("w", LEASE, kinds=KINDS) is None


async def test_recovery_leaves_a_renewed_lease_alone(harness: Harness) -> None:
    """An item whose heartbeat renewed its lease is not touched by recovery."""
    await harness.store.enqueue("A")
    item = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert item
    harness.expire_lease(item.id)
    assert await harness.store.heartbeat(item.id, item.attempt, LEASE) is Heartbeat.OK
    assert await harness.store.recover_expired_leases(max_stalls=3) == []
    state = harness.items()[0]
    assert (state.status, state.stalls) == (Status.RUNNING, 0)
    assert await harness.store.complete(item.id, item.attempt)


async def test_recovery_does_not_wedge_on_a_queued_dedup_sibling(harness: Harness) -> None:
    """A stalled item whose dedup key a Queued sibling holds gives way; nothing stays Running."""
    await harness.store.enqueue("Crawl", scope="s", dedup_key="crawl:s")
    item = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert item
    sibling = await harness.store.enqueue("Crawl", scope="s", dedup_key="crawl:s")
    assert not sibling.deduplicated
    harness.expire_lease(item.id)
    [recovered] = await harness.store.recover_expired_leases(max_stalls=3)
    assert recovered.status is Status.CANCELLED
    assert recovered.reason == f"superseded by queued item {sibling.id}"
    items = by_id(harness)
    assert items[item.id].stalls == 1  # type: ignore[attr-defined]
    nxt = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert nxt and nxt.id == sibling.id


async def test_recovery_cancels_a_stalled_item_whose_cancel_was_requested(
    harness: Harness,
) -> None:
    """An item asked to stop that then stalls ends Cancelled, not requeued."""
    await harness.store.enqueue("A")
    item = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert item
    assert await harness.store.cancel(item.id) is CancelOutcome.REQUESTED
    harness.expire_lease(item.id)
    [recovered] = await harness.store.recover_expired_leases(max_stalls=3)
    assert recovered.status is Status.CANCELLED


async def test_request_cancel_outcomes(harness: Harness) -> None:
    """Queued: cancelled at once. Finished: left alone. Unknown id: not found."""
    queued = await harness.store.enqueue("A")
    assert await harness.store.cancel(queued.id) is CancelOutcome.CANCELLED
    assert harness.items()[0].status is Status.CANCELLED
    assert await harness.store.cancel(queued.id) is CancelOutcome.ALREADY_FINISHED
    assert await harness.store.cancel(999_999) is CancelOutcome.NOT_FOUND
    assert await harness.store.claim("w", LEASE, kinds=KINDS) is None


async def test_delete_finished_keeps_recent_and_unfinished_items(harness: Harness) -> None:
    """Retention deletes finished items older than the cut-off, nothing else."""
    await harness.store.enqueue("done")
    await harness.store.enqueue("running")
    await harness.store.enqueue("queued")
    done = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert done and await harness.store.complete(done.id, done.attempt)
    assert await harness.store.claim("w", LEASE, kinds=KINDS)
    assert await harness.store.delete_finished(dt.timedelta(hours=1)) == 0
    assert await harness.store.delete_finished(dt.timedelta(0)) == 1
    assert sorted(i.kind for i in harness.items()) == ["queued", "running"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": ""}, "kind must not be empty"),
        ({"kind": 7}, "kind must be a string"),
        ({"kind": "x" * 201}, "longer than 200"),
        ({"kind": "A", "payload": {"f": object()}}, "not JSON-serialisable"),
        ({"kind": "A", "payload": float("nan")}, "not JSON-serialisable"),
        ({"kind": "A", "payload": "x" * 70_000}, "the limit is 65536"),
        ({"kind": "A", "scope": ""}, "scope must not be empty"),
        ({"kind": "A", "dedup_key": 5}, "dedup_key must be a string"),
        ({"kind": "A", "run_after": dt.datetime(2026, 1, 1)}, "timezone-aware"),
        ({"kind": "A", "run_after": dt.datetime(9999, 1, 1, tzinfo=dt.UTC)}, "366 days"),
        ({"kind": "A", "run_after": dt.timedelta(days=1000)}, "366 days"),
        ({"kind": "A", "run_after": "tomorrow"}, "datetime or a timedelta"),
    ],
)
async def test_bad_input_is_rejected_and_nothing_is_written(
    harness: Harness, kwargs: dict[str, object], message: str
) -> None:
    """Bad enqueue input raises InvalidWorkItem with a clear message and writes nothing."""
    with pytest.raises(InvalidWorkItem, match=message):
        await harness.store.enqueue(**kwargs)  # type: ignore[arg-type]
    assert harness.items() == []


async def test_unknown_kind_is_rejected_when_kinds_are_known(harness: Harness) -> None:
    """A store that knows the registry's kinds refuses others."""
    harness.store.known_kinds = frozenset({"Crawl"})
    with pytest.raises(InvalidWorkItem, match="unknown kind 'Crawll'"):
        await harness.store.enqueue("Crawll")
    assert harness.items() == []


async def test_a_batch_claim_takes_one_item_per_scope(harness: Harness) -> None:
    """claim_batch fills up to its limit in order, but never with two items of one scope."""
    a1 = await harness.store.enqueue("A", scope="a")
    await harness.store.enqueue("A", scope="a")
    b1 = await harness.store.enqueue("A", scope="b")
    u1 = await harness.store.enqueue("A")
    u2 = await harness.store.enqueue("A")
    await harness.store.enqueue("A")
    batch = await harness.store.claim_batch("w", LEASE, 4, kinds=KINDS)
    assert [i.id for i in batch] == [a1.id, b1.id, u1.id, u2.id]
    rest = await harness.store.claim_batch("w", LEASE, 10, kinds=KINDS)
    assert [i.scope for i in rest] == [None]  # a's second item waits for a1


async def test_complete_batch_applies_only_to_live_attempts(harness: Harness) -> None:
    """A batched complete is fenced per item: a stale attempt in the batch writes nothing."""
    for scope in ("a", "b"):
        await harness.store.enqueue("A", scope=scope)
    a, b = await harness.store.claim_batch("w", LEASE, 2, kinds=KINDS)
    applied = await harness.store.complete_batch([(a.id, a.attempt), (b.id, b.attempt + 1)])
    assert applied == {a.id}
    states = by_id(harness)
    assert states[a.id].status is Status.SUCCEEDED  # type: ignore[attr-defined]
    assert states[b.id].status is Status.RUNNING  # type: ignore[attr-defined]
    nxt = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert nxt is None  # b is still running; a's scope has nothing queued


@pytest.mark.parametrize("scope", [None, "s"])
async def test_a_high_priority_item_behind_1000_low_priority_ones_is_claimed_next(
    harness: Harness, scope: str | None
) -> None:
    """Priority runs across the queue: higher is claimed sooner, whatever waits before
    it (unscoped, or in the line of one scope)."""
    for _ in range(1000):
        await harness.store.enqueue("A", scope=scope, priority=-1)
    urgent = await harness.store.enqueue("A", scope=scope, priority=10)
    item = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert item and (item.id, item.priority) == (urgent.id, 10)


async def test_across_scopes_the_highest_priority_due_item_goes_first(harness: Harness) -> None:
    """Candidates of every free scope compete on priority, then due time."""
    low = await harness.store.enqueue("A", scope="s1")
    high = await harness.store.enqueue("B", scope="s2", priority=3)
    unscoped = await harness.store.enqueue("A", priority=1)
    order = [(await harness.store.claim("w", LEASE, kinds=KINDS)) for _ in range(3)]
    assert [i.id for i in order if i] == [high.id, unscoped.id, low.id]


async def test_within_a_scope_items_run_one_at_a_time_by_priority_then_due_time(
    harness: Harness,
) -> None:
    """A scope's items run one at a time, in priority order, then in due-time order."""
    first = await harness.store.enqueue("A", scope="s")
    second = await harness.store.enqueue("B", scope="s")
    urgent = await harness.store.enqueue("A", scope="s", priority=2)
    ran = []
    for _ in range(3):
        item = await harness.store.claim("w", LEASE, kinds=KINDS)
        assert item is not None and await harness.store.claim("w", LEASE, kinds=KINDS) is None
        assert await harness.store.complete(item.id, item.attempt)
        ran.append(item.id)
    assert ran == [urgent.id, first.id, second.id]


async def test_a_high_priority_item_not_yet_due_holds_up_nothing(harness: Harness) -> None:
    """A higher-priority item of a scope that is due tomorrow does not stop the scope's
    due work now."""
    await harness.store.enqueue("A", scope="s", priority=9, run_after=dt.timedelta(days=1))
    due = await harness.store.enqueue("A", scope="s")
    item = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert item and item.id == due.id


async def test_a_claim_takes_only_the_kinds_it_serves(harness: Harness) -> None:
    """Routing by kind: a Worker gets only kinds it has handlers for; other kinds stay
    Queued (nothing fails), in its scope's line too, for a Worker that serves them."""
    other = await harness.store.enqueue("Purge", scope="s")
    mine = await harness.store.enqueue("Crawl", scope="s")
    unscoped_other = await harness.store.enqueue("Purge")
    item = await harness.store.claim("w", LEASE, kinds=["Crawl"])
    assert item and item.id == mine.id
    assert await harness.store.claim("w", LEASE, kinds=["Crawl", "Unknown"]) is None
    assert await harness.store.complete(item.id, item.attempt)
    assert await harness.store.claim("w", LEASE, kinds=["Crawl"]) is None
    items = by_id(harness)
    assert items[other.id].status is Status.QUEUED  # type: ignore[attr-defined]
    assert items[unscoped_other.id].status is Status.QUEUED  # type: ignore[attr-defined]
    taken = {i.id for i in await harness.store.claim_batch("w2", LEASE, 5, kinds=["Purge"])}
    assert taken == {other.id, unscoped_other.id}


async def test_seconds_until_due_counts_only_the_kinds_served(harness: Harness) -> None:
    """An idle Worker sleeps until the next item of its own kinds falls due."""
    await harness.store.enqueue("A", run_after=dt.timedelta(seconds=30))
    await harness.store.enqueue("B", scope="s", run_after=dt.timedelta(seconds=90))
    until_a = await harness.store.seconds_until_due(kinds=["A"])
    until_b = await harness.store.seconds_until_due(kinds=["B"])
    assert until_a is not None and 25 < until_a <= 30
    assert until_b is not None and 85 < until_b <= 90
    assert await harness.store.seconds_until_due(kinds=["B"], scopes=["t"]) is None
    assert await harness.store.seconds_until_due(kinds=["A"], scopes=["t"], unscoped=False) is None
    assert await harness.store.seconds_until_due(kinds=["Other"]) is None


async def test_each_attempt_that_did_not_succeed_is_kept_with_its_traceback(
    harness: Harness,
) -> None:
    """A retried attempt and the failed one after it are both in the item's history,
    each with its error and traceback; the row keeps the last of them. A succeeded
    attempt is the row's own."""
    item = await harness.store.enqueue("A", scope="s")
    first = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert first and await harness.store.retry_later(first.id, 1, 0.0, "E1", "TB1")
    second = await harness.store.claim("w2", LEASE, kinds=KINDS)
    assert second and await harness.store.fail(second.id, 2, "gave up", "E2", "TB2")
    state = await harness.store.get_item(item.id)
    assert state and (state.error, state.traceback) == ("E2", "TB2")
    history = await harness.store.attempts(item.id)
    assert [(a.attempt, a.worker_id, a.outcome, a.error, a.traceback) for a in history] == [
        (1, "w1", "retried", "E1", "TB1"),
        (2, "w2", "failed", "E2", "TB2"),
    ]
    assert all(a.started_at and a.ended_at and a.started_at <= a.ended_at for a in history)
    done = await harness.store.enqueue("A")
    claimed = await harness.store.claim("w3", LEASE, kinds=KINDS)
    assert claimed and claimed.id == done.id
    assert [a.outcome for a in await harness.store.attempts(done.id)] == ["running"]
    assert await harness.store.complete(claimed.id, claimed.attempt)
    assert [(a.attempt, a.worker_id, a.outcome) for a in await harness.store.attempts(done.id)] == [
        (1, "w3", "succeeded")
    ]


async def test_a_stall_and_a_release_are_in_the_history_too(harness: Harness) -> None:
    """Lease recovery notes a stall ('lease expired'); a release notes itself."""
    item = await harness.store.enqueue("A")
    first = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert first
    harness.expire_lease(item.id)
    await harness.store.recover_expired_leases(max_stalls=3)
    second = await harness.store.claim("w2", LEASE, kinds=KINDS)
    assert second and await harness.store.release(second.id, second.attempt)
    history = await harness.store.attempts(item.id)
    assert [(a.attempt, a.outcome, a.error) for a in history] == [
        (1, "stalled", "lease expired"),
        (2, "released", None),
    ]


# -- a success committed in the handler's own transaction (issue 31) -----------------------


async def complete_in_transaction(harness: Harness, id: int, attempt: int) -> None:
    """What a handler's `tx.complete()` does: commit the attempt's success in its own
    fenced transaction."""
    async with harness.store.fenced_transaction(id, attempt) as tx:
        tx.complete()


async def test_a_success_committed_in_the_transaction_keeps_the_scope_until_finished(
    harness: Harness,
) -> None:
    """The completing commit leaves the item Running with completed_at set, so the
    scope's next item is not claimed; the Worker's finish makes it Succeeded (keeping
    completed_at) and frees the scope."""
    first = await harness.store.enqueue("A", scope="s")
    second = await harness.store.enqueue("B", scope="s")
    item = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert item and item.id == first.id
    await complete_in_transaction(harness, item.id, item.attempt)
    state = by_id(harness)[first.id]
    assert state.status is Status.RUNNING and state.completed_at is not None  # type: ignore[attr-defined]
    assert await harness.store.claim("w2", LEASE, kinds=KINDS) is None
    assert await harness.store.complete(item.id, item.attempt)
    state = by_id(harness)[first.id]
    assert state.status is Status.SUCCEEDED and state.completed_at is not None  # type: ignore[attr-defined]
    assert state.finished_at is not None and state.completed_at <= state.finished_at  # type: ignore[attr-defined]
    nxt = await harness.store.claim("w2", LEASE, kinds=KINDS)
    assert nxt and nxt.id == second.id


async def test_a_success_committed_in_the_transaction_keeps_its_kinds_slot(
    harness: Harness,
) -> None:
    """The same for a kind's running limit: its slot stays taken until the finish, which
    complete_batch makes too."""
    await harness.store.set_limit(kind="K", running=1)
    await harness.store.enqueue("K")
    later = await harness.store.enqueue("K")
    item = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert item
    await complete_in_transaction(harness, item.id, item.attempt)
    assert await harness.store.claim("w2", LEASE, kinds=KINDS) is None
    assert await harness.store.complete_batch([(item.id, item.attempt)]) == {item.id}
    nxt = await harness.store.claim("w2", LEASE, kinds=KINDS)
    assert nxt and nxt.id == later.id


async def test_a_success_committed_in_the_transaction_cannot_be_undone_by_another_write(
    harness: Harness,
) -> None:
    """After the completing commit, fail, cancel_attempt, release and retry_later of the
    attempt write nothing and report not applied; only the finish applies."""
    await harness.store.enqueue("A", scope="s")
    item = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert item
    await complete_in_transaction(harness, item.id, item.attempt)
    before = harness.items()
    assert not await harness.store.fail(item.id, item.attempt, "gave up", "Error", "TB")
    assert not await harness.store.cancel_attempt(item.id, item.attempt)
    assert not await harness.store.release(item.id, item.attempt)
    assert not await harness.store.retry_later(item.id, item.attempt, 1.0, "Error")
    assert harness.items() == before
    assert await harness.store.attempts(item.id) == [
        AttemptRecord(item.attempt, "w", before[0].started_at, None, "running")
    ]
    assert await harness.store.complete(item.id, item.attempt)
    assert harness.items()[0].status is Status.SUCCEEDED


async def test_recovery_finishes_a_success_committed_in_the_transaction_without_a_stall(
    harness: Harness,
) -> None:
    """Its Worker died after the completing commit: when the lease runs out, recovery
    finishes it Succeeded (never requeues it), counts no stall, and its history reads
    `succeeded`; the scope is then free."""
    await harness.store.enqueue("A", scope="s")
    nxt = await harness.store.enqueue("A", scope="s")
    item = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert item
    await complete_in_transaction(harness, item.id, item.attempt)
    harness.expire_lease(item.id)
    [recovered] = await harness.store.recover_expired_leases(max_stalls=1)
    assert (recovered.id, recovered.status, recovered.stalls, recovered.worker_id) == (
        item.id, Status.SUCCEEDED, 0, "w1",
    )  # fmt: skip
    state = by_id(harness)[item.id]
    assert (state.status, state.stalls, state.failures) == (Status.SUCCEEDED, 0, 0)  # type: ignore[attr-defined]
    assert state.completed_at is not None and state.lease_expires_at is None  # type: ignore[attr-defined]
    history = await harness.store.attempts(item.id)
    assert [(a.attempt, a.worker_id, a.outcome) for a in history] == [(1, "w1", "succeeded")]
    again = await harness.store.claim("w2", LEASE, kinds=KINDS)
    assert again and again.id == nxt.id


async def test_a_success_committed_in_the_transaction_is_already_finished_for_cancel(
    harness: Harness,
) -> None:
    """Client.cancel of it reports ALREADY_FINISHED and changes nothing; its heartbeat
    still renews the lease (its handler runs on), and reports no cancel asked before
    the commit (the success is kept)."""
    await harness.store.enqueue("A")
    item = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert item
    assert await harness.store.cancel(item.id) is CancelOutcome.REQUESTED
    await complete_in_transaction(harness, item.id, item.attempt)
    before = harness.items()
    assert await harness.store.cancel(item.id) is CancelOutcome.ALREADY_FINISHED
    assert harness.items() == before
    harness.expire_lease(item.id)
    assert await harness.store.heartbeat(item.id, item.attempt, LEASE) is Heartbeat.OK
    assert await harness.store.recover_expired_leases(max_stalls=3) == []
    assert harness.items()[0].status is Status.RUNNING
    assert await harness.store.complete(item.id, item.attempt)


async def test_a_fenced_transaction_past_its_attempts_deadline_writes_nothing(
    harness: Harness,
) -> None:
    """`until` already passed: SelfStopped (a Lost) as it opens. Passed while it was
    open: SelfStopped at the commit, nothing applied (no success noted). Moved on
    meanwhile, as a good heartbeat moves it: it commits."""
    await harness.store.enqueue("A")
    item = await harness.store.claim("w", LEASE, kinds=KINDS)
    assert item
    with pytest.raises(SelfStopped):
        async with harness.store.fenced_transaction(
            item.id, item.attempt, until=lambda: trio.current_time() - 1.0
        ) as tx:
            raise AssertionError("opened past the deadline")  # pragma: no cover
    deadline = [trio.current_time() + 0.3]
    with pytest.raises(Lost):
        async with harness.store.fenced_transaction(
            item.id, item.attempt, until=lambda: deadline[0]
        ) as tx:
            tx.complete()
            await trio.sleep(0.4)
    assert harness.items()[0].completed_at is None
    deadline = [trio.current_time() + 0.3]
    async with harness.store.fenced_transaction(
        item.id, item.attempt, until=lambda: deadline[0]
    ) as tx:
        tx.complete()
        deadline[0] += 60.0  # a heartbeat succeeded meanwhile
        await trio.sleep(0.4)
    assert harness.items()[0].completed_at is not None
