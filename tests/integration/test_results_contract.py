"""Results and durable steps (issue 34): the Store contract, run against the in-memory
store, the Trio store, and the Trio store's client operations through `Client` and
`AsyncClient` (tests/conftest.py's `harness`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import trio

from tests.support.harness import Harness
from trioworker import ItemNotSucceeded, Lost, SelfStopped, Status, UnknownItem, UnstorableResult

LEASE = 30.0
KINDS = ("A", "B")


async def claimed(harness: Harness, kind: str = "A", **kwargs: Any) -> tuple[int, int]:
    """A new item of `kind`, claimed: its (id, attempt)."""
    enqueued = await harness.store.enqueue(kind, **kwargs)
    item = await harness.store.claim("w1", LEASE, kinds=KINDS)
    assert item is not None and item.id == enqueued.id
    return item.id, item.attempt


def state(harness: Harness, id: int) -> Any:
    (row,) = [i for i in harness.items() if i.id == id]
    return row


async def test_a_result_is_stored_with_succeeded_and_read_back(harness: Harness) -> None:
    """complete_batch with a result: Succeeded and its result in one write; `result`
    and `show` read it back; an item finished without one has None."""
    id, attempt = await claimed(harness)
    other = await claimed(harness, "B")
    value = {"proxies": ["a.mp4", "b.mp4"], "n": 2, "ok": True, "deep": [[[1.5]]]}
    results = ['{"proxies":["a.mp4","b.mp4"],"n":2,"ok":true,"deep":[[[1.5]]]}', None]
    assert await harness.store.complete_batch([(id, attempt), other], results) == {id, other[0]}
    assert state(harness, id).status is Status.SUCCEEDED
    assert state(harness, id).result == value
    assert state(harness, other[0]).result is None
    assert await harness.store.result(id, timeout=5) == value
    assert await harness.store.result(other[0], timeout=5) is None
    details = await harness.store.show(id)
    assert details is not None and details.item.result == value


async def test_a_stale_attempts_result_is_refused_and_stores_nothing(harness: Harness) -> None:
    """After its lease expired and the item was claimed again, the old attempt's
    finish with a result writes nothing (neither Succeeded nor the result); the new
    attempt's applies."""
    id, old = await claimed(harness)
    harness.expire_lease(id)
    assert len(await harness.store.recover_expired_leases(max_stalls=3)) == 1
    new = await harness.store.claim("w2", LEASE, kinds=KINDS)
    assert new is not None and new.attempt == old + 1
    assert await harness.store.complete_batch([(id, old)], ['"stale"']) == set()
    row = state(harness, id)
    assert (row.status, row.result) == (Status.RUNNING, None)
    assert await harness.store.complete_batch([(id, new.attempt)], ['"fresh"']) == {id}
    assert state(harness, id).result == "fresh"


async def test_a_result_committed_in_the_handlers_transaction(harness: Harness) -> None:
    """`tx.complete(result=...)` stores the result with the success noted in that
    commit; the Worker's finish (no result of its own) keeps it, as does lease recovery
    finishing a completed item; a value that cannot be stored raises UnstorableResult
    at once, and nothing is noted."""
    id, attempt = await claimed(harness)
    with pytest.raises(UnstorableResult, match="result is not JSON-serialisable"):
        async with harness.store.fenced_transaction(id, attempt) as tx:
            tx.complete(result={"when": dt.datetime(2026, 1, 1)})
    with pytest.raises(UnstorableResult, match="result nests deeper than 64"):
        async with harness.store.fenced_transaction(id, attempt) as tx:
            deep: list[Any] = []
            for _ in range(70):
                deep = [deep]
            tx.complete(result=deep)
    with pytest.raises(UnstorableResult, match="result is 70009 bytes as JSON"):
        async with harness.store.fenced_transaction(id, attempt) as tx:
            tx.complete(result="x" * 70_007)
    assert state(harness, id).completed_at is None
    async with harness.store.fenced_transaction(id, attempt) as tx:
        tx.complete(result=[1, "two"])
    row = state(harness, id)
    assert (row.status, row.result) == (Status.RUNNING, [1, "two"])
    assert row.completed_at is not None
    assert await harness.store.complete_batch([(id, attempt)]) == {id}
    assert state(harness, id).result == [1, "two"]
    assert await harness.store.result(id, timeout=5) == [1, "two"]

    other, attempt = await claimed(harness, "B")
    async with harness.store.fenced_transaction(other, attempt) as tx:
        tx.complete(result="recovered")
    harness.expire_lease(other)
    [recovered] = await harness.store.recover_expired_leases(max_stalls=3)
    assert recovered.status is Status.SUCCEEDED
    assert await harness.store.result(other, timeout=5) == "recovered"


async def test_result_waits_until_the_item_has_ended(harness: Harness) -> None:
    """`result` returns once the item has Succeeded, however long it waited."""
    id, attempt = await claimed(harness)
    got: list[Any] = []

    async def wait() -> None:
        got.append(await harness.store.result(id, timeout=10))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.sleep(0.3)
        assert got == []
        assert await harness.store.complete_batch([(id, attempt)], ['{"done": 1}']) == {id}
    assert got == [{"done": 1}]


async def test_result_of_a_failed_or_cancelled_item_raises_naming_its_status(
    harness: Harness,
) -> None:
    """ItemNotSucceeded names the status and the error text (Failed) or the reason
    (Cancelled); TimeoutError while the item has not ended; UnknownItem for none."""
    id, attempt = await claimed(harness)
    assert await harness.store.fail(id, attempt, "gave up", "ValueError: bad frame")
    with pytest.raises(ItemNotSucceeded, match="Failed: gave up; ValueError: bad frame") as e:
        await harness.store.result(id, timeout=5)
    assert (e.value.id, e.value.status, e.value.error) == (id, "Failed", "ValueError: bad frame")
    queued = await harness.store.enqueue("B", run_after=dt.timedelta(hours=1))
    await harness.store.cancel(queued.id)
    with pytest.raises(ItemNotSucceeded, match="Cancelled") as e:
        await harness.store.result(queued.id, timeout=5)
    assert e.value.status == "Cancelled"
    waiting = await harness.store.enqueue("B", run_after=dt.timedelta(hours=1))
    started = trio.current_time()
    with pytest.raises(TimeoutError, match=f"item {waiting.id} had not ended after 0.3s"):
        await harness.store.result(waiting.id, timeout=0.3)
    assert 0.3 <= trio.current_time() - started < 5
    with pytest.raises(UnknownItem):
        await harness.store.result(10**9, timeout=5)


async def test_a_step_is_recorded_once_fenced_by_its_attempt(harness: Harness) -> None:
    """record_step: recorded by the attempt that owns the item; a second record of the
    same name keeps the first; a stale attempt's record raises Lost and writes
    nothing; past the deadline SelfStopped; `show` lists the steps."""
    id, old = await claimed(harness)
    assert await harness.store.step(id, "scan /a") == (False, None)
    assert await harness.store.record_step(id, old, "scan /a", '["x.jpg"]')
    assert not await harness.store.record_step(id, old, "scan /a", '["other"]')
    assert await harness.store.step(id, "scan /a") == (True, ["x.jpg"])
    with pytest.raises(SelfStopped):
        await harness.store.record_step(
            id, old, "scan /b", "1", until=lambda: trio.current_time() - 1
        )
    harness.expire_lease(id)
    assert len(await harness.store.recover_expired_leases(max_stalls=3)) == 1
    new = await harness.store.claim("w2", LEASE, kinds=KINDS)
    assert new is not None
    with pytest.raises(Lost):
        await harness.store.record_step(id, old, "scan /b", '"stale"')
    assert await harness.store.step(id, "scan /b") == (False, None)
    assert await harness.store.step(id, "scan /a") == (True, ["x.jpg"])
    assert await harness.store.record_step(id, new.attempt, "scan /b", None)
    assert await harness.store.step(id, "scan /b") == (True, None)
    details = await harness.store.show(id)
    assert details is not None
    assert [(s.name, s.attempt, s.result) for s in details.steps] == [
        ("scan /a", old, ["x.jpg"]),
        ("scan /b", new.attempt, None),
    ]


async def test_retention_deletes_an_items_steps_with_it(harness: Harness) -> None:
    """An item deleted by retention takes its steps along."""
    id, attempt = await claimed(harness)
    assert await harness.store.record_step(id, attempt, "s", "1")
    assert await harness.store.complete_batch([(id, attempt)], ['"r"']) == {id}
    harness.age(id, 7200)
    assert await harness.store.delete_finished(dt.timedelta(hours=1)) == 1
    assert await harness.store.step(id, "s") == (False, None)
