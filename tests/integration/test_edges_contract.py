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
