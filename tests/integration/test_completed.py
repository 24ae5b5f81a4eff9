"""A success committed in the handler's own transaction holds its slots (issue 31), on
real PostgreSQL, with the completing transaction held open on a connection of its own
while the Worker's writes, claims and lease recovery run on others.

The completing transaction is the store's own statements (`lock_attempt`, then
`complete_in_transaction`, as `PostgresStore.fenced_transaction` sends them when the
handler called `tx.complete()`), sent by the test so it can hold the transaction open
between them and its COMMIT.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
import trio

from tests.support.lines import running_per_scope, wait_until_blocked, wedges
from trioworker import CancelOutcome, PostgresStore, Status, WorkItem
from trioworker._postgres.queries import WRITTEN

LEASE = 60.0
Conn = psycopg.Connection[Any]
CHECK = "work_items_completed_only_running_or_succeeded"


@contextlib.contextmanager
def completing(dsn: str, item: WorkItem) -> Iterator[Conn]:
    """A connection holding item's fenced transaction open, its success noted and not
    yet committed: commit() or rollback() it."""
    with psycopg.connect(dsn) as conn:
        params = {"id": item.id, "attempt": item.attempt}
        assert conn.execute(WRITTEN["lock_attempt"], params).fetchall() == [(True,)]
        noted = conn.execute(WRITTEN["complete_in_transaction"], params).fetchall()
        assert noted == [(True,)]
        yield conn


def row(pg: Conn, id: int) -> tuple[Any, ...]:
    found = pg.execute(
        "SELECT status, attempt, stalls, failures, completed_at IS NOT NULL, cancel_requested"
        " FROM work_items WHERE id = %s",
        [id],
    ).fetchone()
    assert found is not None
    return tuple(found)


async def test_a_completed_item_holds_its_scope_and_kind_against_claims_until_finished(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """After the completing commit, claims from other connections take neither the
    scope's next item nor the limited kind's; the Worker's finish frees both."""
    await store.set_limit(kind="Limited", running=1)
    await store.enqueue("A", scope="s")
    scoped_next = await store.enqueue("A", scope="s")
    await store.enqueue("Limited")
    kind_next = await store.enqueue("Limited")
    held = await store.claim_batch("w1", LEASE, 4, kinds=["A", "Limited"])
    assert len(held) == 2
    for item in held:
        with completing(dsn, item) as conn:
            conn.commit()
    assert [row(pg, item.id)[:1] + row(pg, item.id)[4:5] for item in held] == [
        ("Running", True), ("Running", True),
    ]  # fmt: skip
    assert await store.claim_batch("w2", LEASE, 4, kinds=["A", "Limited"]) == []
    assert running_per_scope(pg) == {"s": 1} and wedges(pg) == []
    assert await store.complete_batch([(i.id, i.attempt) for i in held]) == {i.id for i in held}
    taken = await store.claim_batch("w2", LEASE, 4, kinds=["A", "Limited"])
    assert sorted(i.id for i in taken) == sorted([scoped_next.id, kind_next.id])
    assert [row(pg, i.id)[:1] + row(pg, i.id)[4:5] for i in held] == [
        ("Succeeded", True), ("Succeeded", True),
    ]  # fmt: skip


WRITES: dict[str, Callable[[PostgresStore, WorkItem], Awaitable[object]]] = {
    "fail": lambda store, i: store.fail(i.id, i.attempt, "gave up", "Error", "TB"),
    "cancel_attempt": lambda store, i: store.cancel_attempt(i.id, i.attempt),
    "release": lambda store, i: store.release(i.id, i.attempt),
    "retry_later": lambda store, i: store.retry_later(i.id, i.attempt, 1.0, "Error"),
    "cancel": lambda store, i: store.cancel(i.id),
}


@pytest.mark.parametrize("write", sorted(WRITES))
async def test_a_write_waiting_on_the_completing_commit_applies_nothing_after_it(
    store: PostgresStore, pg: Conn, dsn: str, write: str
) -> None:
    """fail, cancel_attempt, release, retry_later and a client's cancel of the attempt
    wait on its row while the completing transaction is open; once it commits, each
    re-reads the row (READ COMMITTED) and applies nothing: the success stands."""
    await store.enqueue("A", scope="s")
    item = await store.claim("w", LEASE, kinds=["A"])
    assert item is not None
    result: list[object] = []
    with completing(dsn, item) as conn:
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                result.append(await WRITES[write](store, item))

            nursery.start_soon(run)
            await wait_until_blocked(pg)
            conn.commit()
    assert result == [CancelOutcome.ALREADY_FINISHED if write == "cancel" else False]
    assert row(pg, item.id) == ("Running", 1, 0, 0, True, False)
    assert pg.execute("SELECT count(*) FROM work_attempts").fetchone() == (0,)
    assert await store.complete(item.id, item.attempt)
    assert row(pg, item.id)[0] == "Succeeded"


async def test_lease_recovery_passes_over_a_completing_transaction_then_finishes_it(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """With the lease run out while the completing transaction is open, recovery passes
    over the held row at once; after the commit it finishes the item Succeeded, with
    no stall, and the scope's next item is claimable."""
    await store.enqueue("A", scope="s")
    nxt = await store.enqueue("A", scope="s")
    item = await store.claim("w1", LEASE, kinds=["A"])
    assert item is not None
    pg.execute("UPDATE work_items SET lease_expires_at = now() - interval '1s' WHERE id = %s",
               [item.id])  # fmt: skip
    with completing(dsn, item) as conn:
        with trio.fail_after(5):
            assert await store.recover_expired_leases(max_stalls=1) == []
        conn.commit()
    [recovered] = await store.recover_expired_leases(max_stalls=1)
    assert (recovered.id, recovered.status, recovered.stalls, recovered.worker_id) == (
        item.id, Status.SUCCEEDED, 0, "w1",
    )  # fmt: skip
    assert row(pg, item.id) == ("Succeeded", 1, 0, 0, True, False)
    assert [(a.outcome, a.worker_id) for a in await store.attempts(item.id)] == [
        ("succeeded", "w1")
    ]
    again = await store.claim("w2", LEASE, kinds=["A"])
    assert again is not None and again.id == nxt.id


async def test_a_rolled_back_completion_leaves_the_attempt_as_it_was(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """A completing transaction that rolls back notes nothing: the attempt's own writes
    (here a release) apply as usual afterwards."""
    await store.enqueue("A", scope="s")
    item = await store.claim("w", LEASE, kinds=["A"])
    assert item is not None
    with completing(dsn, item) as conn:
        conn.rollback()
    assert row(pg, item.id) == ("Running", 1, 0, 0, False, False)
    assert await store.release(item.id, item.attempt)
    assert row(pg, item.id)[0] == "Queued"


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE work_items SET status = 'Queued', lease_expires_at = NULL WHERE id = %(id)s",
        "UPDATE work_items SET status = 'Failed', lease_expires_at = NULL WHERE id = %(id)s",
    ],
    ids=["by-hand-requeue", "by-hand-fail"],
)
async def test_the_schema_refuses_any_end_but_success_for_a_completed_row(
    store: PostgresStore, pg: Conn, statement: str
) -> None:
    """The rule is the schema's, not only the Worker's: a change by hand that would end a
    completed row otherwise than Succeeded is refused by the CHECK's name, and changes
    nothing. (The pre-release chain's earlier function versions, refused the same way,
    are gone with the squash into one baseline, issue 32.)"""
    await store.enqueue("A", scope="s")
    item = await store.claim("w", LEASE, kinds=["A"])
    assert item is not None
    async with store.fenced_transaction(item.id, item.attempt) as tx:
        tx.complete()
    pg.execute("UPDATE work_items SET lease_expires_at = now() - interval '1s' WHERE id = %s",
               [item.id])  # fmt: skip
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        pg.execute(statement, {"id": item.id, "attempt": item.attempt})  # type: ignore[arg-type]
    assert refused.value.diag.constraint_name == CHECK
    assert row(pg, item.id) == ("Running", 1, 0, 0, True, False)
    finished = pg.execute(
        "SELECT work_finish_v1(ARRAY[%s], ARRAY[%s], 'Succeeded')", [item.id, item.attempt]
    ).fetchall()
    assert finished == [(item.id,)] and row(pg, item.id)[0] == "Succeeded"
