"""The in-memory store's fenced transactions run statements (issue 35): each is recorded
on the store only when its transaction commits, as on PostgreSQL, and returns the rows
the store's responder gives. On Trio's virtual clock."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from tests.unit.test_fenced_deadline import claimed
from trioworker import Context, Lost, Registry, RetryPolicy, SelfStopped, Status, WorkItem
from trioworker._store.api import Params
from trioworker.testing import MemoryStore, Statement, worker


async def test_committed_statements_are_recorded_in_commit_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two transactions' statements are recorded as each commits, in commit order, with
    their item, attempt, query and params; none are recorded before the commit."""
    store = MemoryStore()
    item = await claimed(store)
    async with store.fenced_transaction(item.id, item.attempt) as tx:
        assert await tx.execute("INSERT INTO t VALUES (%s)", [1]) == []
        assert await tx.rows("UPDATE t SET n = %(n)s", {"n": 2}) == []
        assert store.statements == []
    async with store.fenced_transaction(item.id, item.attempt) as tx:
        await tx.execute("DELETE FROM t")
    assert store.statements == [
        Statement(item.id, item.attempt, "INSERT INTO t VALUES (%s)", [1]),
        Statement(item.id, item.attempt, "UPDATE t SET n = %(n)s", {"n": 2}),
        Statement(item.id, item.attempt, "DELETE FROM t", None),
    ]


async def test_a_raising_body_records_nothing(autojump_clock: trio.testing.MockClock) -> None:
    """A body that raises rolls its transaction back: its statements are not recorded."""
    store = MemoryStore()
    item = await claimed(store)
    with pytest.raises(OSError, match="disk full"):
        async with store.fenced_transaction(item.id, item.attempt) as tx:
            await tx.execute("INSERT INTO t VALUES (1)")
            raise OSError("disk full")
    assert store.statements == []


async def test_a_fenced_out_attempt_records_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An attempt whose item was recovered from it while its transaction was open is
    refused at the commit (Lost), and its statements are not recorded."""
    store = MemoryStore()
    item = await claimed(store)
    with pytest.raises(Lost):
        async with store.fenced_transaction(item.id, item.attempt) as tx:
            await tx.execute("INSERT INTO t VALUES (1)")
            store.expire_lease(item.id)
            await store.recover_expired_leases(max_stalls=3)
    assert store.statements == []


async def test_a_self_stopped_attempt_records_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Reaching the self-stop deadline inside the transaction refuses its commit
    (SelfStopped): its statements are not recorded."""
    store = MemoryStore()
    item = await claimed(store)
    with pytest.raises(SelfStopped):
        async with store.fenced_transaction(item.id, item.attempt, until=lambda: 5.0) as tx:
            await tx.execute("INSERT INTO t VALUES (1)")
            await trio.sleep(5)
    assert store.statements == []


async def test_the_responders_rows_are_returned(autojump_clock: trio.testing.MockClock) -> None:
    """`respond(query, params)` gives a statement's rows as dicts: `rows` returns them
    as given, `execute` as tuples of their values."""
    asked: list[tuple[str, Params]] = []

    def respond(query: str, params: Params) -> list[dict[str, Any]]:
        asked.append((query, params))
        return [{"files": 2, "words": 7}]

    store = MemoryStore(respond=respond)
    item = await claimed(store)
    async with store.fenced_transaction(item.id, item.attempt) as tx:
        rows = await tx.rows("SELECT files, words FROM folders WHERE name = %s", ["a"])
        tuples = await tx.execute("SELECT files, words FROM folders")
    assert rows == [{"files": 2, "words": 7}]
    assert tuples == [(2, 7)]
    assert asked == [
        ("SELECT files, words FROM folders WHERE name = %s", ["a"]),
        ("SELECT files, words FROM folders", None),
    ]


@pytest.mark.parametrize("answer", [(), [("a", 1)], None])
async def test_a_responder_not_giving_a_list_of_dicts_is_a_clear_error(
    answer: object, autojump_clock: trio.testing.MockClock
) -> None:
    """A responder returning anything but a list of dicts raises a TypeError naming the
    rule, the answer and the query, not a confusing error later."""
    store = MemoryStore(respond=lambda query, params: answer)  # type: ignore[arg-type,return-value]
    item = await claimed(store)
    with pytest.raises(TypeError, match=r"must return a list of dicts .* for 'SELECT 1'"):
        async with store.fenced_transaction(item.id, item.attempt) as tx:
            await tx.execute("SELECT 1")


async def test_an_item_enqueued_in_a_handlers_transaction_exists_once_it_commits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """`ctx.store.enqueue(..., tx=tx)` in the handler's own transaction: the item is
    created by the commit, not by a first attempt that raised after enqueueing."""
    registry = Registry()
    attempts: list[int] = []

    @registry.handler("Index", retry=RetryPolicy(initial_delay=1.0, jitter=0.0))
    async def index(item: WorkItem, ctx: Context) -> None:
        attempts.append(item.attempt)
        async with ctx.transaction() as tx:
            await tx.execute("INSERT INTO documents VALUES (%s)", [item.attempt])
            await ctx.store.enqueue("Summarise", scope=item.scope, tx=tx)
            if item.attempt == 1:
                raise OSError("the share went away")
            tx.complete()

    async with worker(registry) as w:
        item = await w.store.enqueue("Index", scope="notes")
        state = await w.finished(item.id)
    assert (state.status, attempts) == (Status.SUCCEEDED, [1, 2])
    assert [(i.kind, i.status) for i in w.store.items()] == [
        ("Index", Status.SUCCEEDED),
        ("Summarise", Status.QUEUED),
    ]
    assert w.store.statements == [Statement(item.id, 2, "INSERT INTO documents VALUES (%s)", [2])]


async def test_a_dedup_key_enqueued_twice_in_one_transaction_is_one_item(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Two enqueues with one dedup key in a handler's transaction: the second is the
    first's item (deduplicated), as on PostgreSQL, and that item exists after the commit."""
    registry = Registry()
    got: list[tuple[int, bool]] = []

    @registry.handler("Index")
    async def index(item: WorkItem, ctx: Context) -> None:
        async with ctx.transaction() as tx:
            for _ in range(2):
                e = await ctx.store.enqueue("Summarise", dedup_key="notes", tx=tx)
                got.append((e.id, e.deduplicated))
            tx.complete()

    async with worker(registry) as w:
        item = await w.store.enqueue("Index")
        await w.finished(item.id)
    [(first, first_deduplicated), (second, second_deduplicated)] = got
    assert (second, first_deduplicated, second_deduplicated) == (first, False, True)
    summarise = [i for i in w.store.items() if i.kind == "Summarise"]
    assert [(i.id, i.status) for i in summarise] == [(first, Status.QUEUED)]
