"""The store behaviour behind issue 20's rough edges, run against PostgreSQL and the
in-memory store alike (the same contract as tests/integration/test_store_contract.py)."""

from __future__ import annotations

from tests.support.harness import Harness
from trioworker import Status

LEASE = 30.0
KINDS = ("A",)


async def test_recovery_names_the_worker_whose_attempt_stalled(harness: Harness) -> None:
    """Each recovered item says which Worker's attempt stopped heartbeating (the
    recovering Worker knows its own name): requeued, then failed as stalled."""
    await harness.store.enqueue("A", scope="s")
    first = await harness.store.claim("w-dead", LEASE, kinds=KINDS)
    assert first
    harness.expire_lease(first.id)
    [requeued] = await harness.store.recover_expired_leases(max_stalls=2)
    assert (requeued.status, requeued.attempt, requeued.worker_id) == (Status.QUEUED, 1, "w-dead")
    second = await harness.store.claim("w-next", LEASE, kinds=KINDS)
    assert second
    harness.expire_lease(second.id)
    [failed] = await harness.store.recover_expired_leases(max_stalls=2)
    assert (failed.status, failed.attempt, failed.worker_id) == (Status.FAILED, 2, "w-next")


async def test_an_operators_retry_is_a_mark_in_the_items_history(harness: Harness) -> None:
    """A retried item's history shows the retry (an attempt number of its own, noted
    `operator-retry`, run by no Worker), and it waits with a reason saying so, not the
    "failed 1 of 1 attempts" of before; its next run is the attempt after the mark."""
    item = await harness.store.enqueue("A")
    first = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert first
    assert await harness.store.fail(first.id, first.attempt, "failed 1 of 1 attempts", "boom")
    assert await harness.store.retry([item.id]) == [item.id]
    state = await harness.store.get_item(item.id)
    assert state is not None
    assert (state.status, state.attempt, state.reason) == (
        Status.QUEUED, 2, "retried by an operator after attempt 1"
    )  # fmt: skip
    history = await harness.store.attempts(item.id)
    assert [(a.attempt, a.outcome, a.worker_id) for a in history] == [
        (1, "failed", "w1"), (2, "operator-retry", None)
    ]  # fmt: skip
    again = await harness.store.claim("w2", LEASE, kinds=KINDS)
    assert again and again.attempt == 3 and again.failures == 0
