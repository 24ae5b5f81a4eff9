"""Limits beyond one on PostgreSQL (issue 21, docs/design/limits.md): N per scope, N per
kind and rate limits, held by the schema, with races forced by transactions held open
as the seed's race tests force them (test_scope_rule.py, whose N = 1 tests are
unchanged)."""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

import psycopg
import pytest
import trio

from tests.integration.test_scope_rule import Heard, in_thread, session
from tests.support.lines import (
    backend_pid,
    running_per_scope,
    wait_until_blocked,
    waits_on_a_lock,
    wedges,
)
from trioworker import PostgresStore
from trioworker._postgres.store import RUNNING_KIND_INDEX, RUNNING_SCOPE_INDEX

LEASE = 30.0
Conn = psycopg.Connection[Any]
TO_RUNNING = (
    "UPDATE work_items SET status = 'Running', attempt = attempt + 1,"
    " lease_expires_at = now() + interval '1h' WHERE id = %s"
)


def running_of_kind(pg: Conn, kind: str) -> int:
    row = pg.execute(
        "SELECT count(*) FROM work_items WHERE kind = %s AND status = 'Running'", (kind,)
    ).fetchone()
    assert row is not None
    return int(row[0])


async def start_blocked(pg: Conn, conn: Conn, nursery: trio.Nursery, id: int) -> list[Any]:
    """Start setting item `id` Running on `conn` in a thread; return once it waits on a
    lock. The list gets the error it ends with (None: it went through)."""
    outcome: list[Any] = []
    pid = backend_pid(conn)

    async def run() -> None:
        try:
            await in_thread(lambda: conn.execute(TO_RUNNING, (id,)))
            outcome.append(None)
        except psycopg.Error as exc:
            conn.rollback()
            outcome.append(exc)

    nursery.start_soon(run)
    await wait_until_blocked(pg, pid)
    return outcome


def rejected_by(outcome: list[Any]) -> tuple[type[Exception], str | None]:
    [exc] = outcome
    assert exc is not None
    return type(exc), exc.diag.constraint_name


async def test_three_starts_racing_for_two_free_slots_of_a_scope_leave_two_running(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """Scope S has limit 2 and both slots free. Three transactions each make an item
    of S Running, none seeing the others': the first holds slot 1 open, the other two
    wait on the slot index; it commits and both lose by the index's name. Each starts
    again: one takes slot 2 and holds it, the other waits; it commits, and the third
    is rejected by name. Exactly two Running."""
    await store.set_limit(scope="S", running=2)
    a, b, c = [(await store.enqueue("K", scope="S")).id for _ in range(3)]
    with session(dsn) as one, session(dsn) as two, session(dsn) as three:
        one.execute(TO_RUNNING, (a,))
        async with trio.open_nursery() as nursery:
            second = await start_blocked(pg, two, nursery, b)
            third = await start_blocked(pg, three, nursery, c)
            one.commit()
        assert rejected_by(second) == (psycopg.errors.UniqueViolation, RUNNING_SCOPE_INDEX)
        assert rejected_by(third) == (psycopg.errors.UniqueViolation, RUNNING_SCOPE_INDEX)
        two.execute(TO_RUNNING, (b,))  # slot 2, held open
        async with trio.open_nursery() as nursery:
            again = await start_blocked(pg, three, nursery, c)
            two.commit()
        assert rejected_by(again) == (psycopg.errors.UniqueViolation, RUNNING_SCOPE_INDEX)
    assert running_per_scope(pg) == {"S": 2}
    slots = pg.execute("SELECT scope_slot FROM work_items WHERE status = 'Running' ORDER BY 1")
    assert slots.fetchall() == [(1,), (2,)]


async def test_a_claim_racing_for_a_scopes_last_slot_loses_on_the_index_and_keeps_its_batch(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """The seed's forced race at N = 2: S has limit 2 with one item Running (slot 1).
    An operator sets S's second item Running by hand (slot 2) and holds it open; the
    claim cannot see it, sees room in S, waits on the slot index, and once the operator
    commits loses S by the index's name, yet takes the batch's other item (scope D)."""
    await store.set_limit(scope="S", running=2)
    await store.enqueue("A", scope="S")
    by_hand = await store.enqueue("B", scope="S")
    await store.enqueue("C", scope="S")
    first = await store.claim("w", LEASE, kinds=["A"])
    assert first is not None
    other = await store.enqueue("X", scope="D")
    with session(dsn) as operator:
        operator.execute(TO_RUNNING, (by_hand.id,))
        result: list[Any] = []
        async with trio.open_nursery() as nursery:

            async def claim() -> None:
                result.append(await store.claim_batch("w", LEASE, 4, kinds=["C", "X"]))

            nursery.start_soon(claim)
            await wait_until_blocked(pg)
            operator.commit()
    [claimed] = result
    assert [item.id for item in claimed] == [other.id]
    assert running_per_scope(pg) == {"S": 2, "D": 1}
    assert store.statistics().race_losses == 1


async def test_three_claims_racing_for_two_free_slots_of_a_kind_leave_two_running(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """Kind K has a global limit of 2 and five unscoped items. One claim holds its
    start (kind slot 1) open; two more claims run, see room for two, take other items
    and wait on the kind slot index; the first commits and both lose by its name. The
    store claims again: exactly one of them gets slot 2, and the third claim (rejected
    by name once more, or finding the kind full) ends with nothing. Exactly two Running."""
    await store.set_limit(kind="K", running=2)
    for _ in range(5):
        await store.enqueue("K")
    # The failover guard notes the longest lease a claim asks for (0003.failover): the
    # first claims of a longer lease update its row, and one would wait there, not on
    # the index. Noted beforehand, as any claim of this lease would have.
    pg.execute("SELECT work_failover_hold_v1(%s)", [LEASE])
    with session(dsn) as first:
        held = first.execute("SELECT id, kind_slot FROM work_claim_v3('w1', 30, 1, ARRAY['K'])")
        assert [slot for _, slot in held.fetchall()] == [1]
        results: list[list[Any]] = []
        async with trio.open_nursery() as nursery:

            async def claim(worker: str) -> None:
                results.append(await store.claim_batch(worker, LEASE, 1, kinds=["K"]))

            nursery.start_soon(claim, "w2")
            nursery.start_soon(claim, "w3")
            with trio.fail_after(10):
                while True:  # both wait on the index
                    row = pg.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND datname = current_database()"
                    ).fetchone()
                    if row and row[0] == 2:
                        break
                    await trio.sleep(0.02)
            first.commit()
    assert sorted(len(batch) for batch in results) == [0, 1]
    assert running_of_kind(pg, "K") == 2
    # Both lost on the first commit. Claiming again, the second either raced the first
    # for slot 2 and lost by name once more, or began after it committed and found the
    # kind full: no race to lose.
    assert store.statistics().race_losses in (2, 3)
    kind_slots = pg.execute("SELECT kind_slot FROM work_items WHERE status = 'Running' ORDER BY 1")
    assert kind_slots.fetchall() == [(1,), (2,)]


async def test_a_start_by_hand_over_a_kinds_limit_is_refused_by_the_index(
    store: PostgresStore, pg: Conn
) -> None:
    """With kind K at its limit of 2, a third item set Running by hand fails, naming
    the kind slot index; an item of another kind is not held up."""
    await store.set_limit(kind="K", running=2)
    ids = [(await store.enqueue("K")).id for _ in range(3)]
    other = await store.enqueue("L")
    assert len(await store.claim_batch("w", LEASE, 10, kinds=["K"])) == 2
    with pytest.raises(psycopg.errors.UniqueViolation) as raised:
        pg.execute(TO_RUNNING, (ids[2],))
    assert raised.value.diag.constraint_name == RUNNING_KIND_INDEX
    item = await store.claim("w", LEASE, kinds=["K", "L"])
    assert item is not None and item.id == other.id


async def test_a_lowered_limit_cancels_nothing_and_no_claim_starts_until_under_it(
    store: PostgresStore, pg: Conn
) -> None:
    """S runs three (limit 3); lowered to 2, all three go on. One ends: S is still at
    its new limit, so no claim starts, and a start by hand is refused by name (a free
    slot, but as many Running as the limit). Once a second ends, one starts."""
    await store.set_limit(scope="S", running=3)
    for _ in range(5):
        await store.enqueue("K", scope="S")
    running = []
    for _ in range(3):
        item = await store.claim("w", LEASE, kinds=["K"])
        assert item is not None
        running.append(item)
    await store.set_limit(scope="S", running=2)
    assert running_per_scope(pg) == {"S": 3}
    assert await store.complete(running[0].id, running[0].attempt)
    assert await store.claim("w", LEASE, kinds=["K"]) is None
    queued = pg.execute("SELECT min(id) FROM work_items WHERE status = 'Queued'").fetchone()
    assert queued is not None
    with pytest.raises(psycopg.errors.CheckViolation) as raised:
        pg.execute(TO_RUNNING, (queued[0],))
    assert raised.value.diag.constraint_name == "work_items_slot_within_limit"
    assert await store.complete(running[1].id, running[1].attempt)
    assert await store.claim("w", LEASE, kinds=["K"]) is not None
    assert await store.claim("w", LEASE, kinds=["K"]) is None
    assert running_per_scope(pg) == {"S": 2} and wedges(pg) == []


async def test_a_claim_fills_its_batch_from_scopes_that_may_run_more_than_one(
    store: PostgresStore, pg: Conn
) -> None:
    """Three scopes at limit 2, three items each: one claim for six slots takes two of
    each scope (a round takes one a scope; the settle after it makes the next item a
    head, and the claim goes round again), so a short claim means nothing more could
    start, which is what lets a Worker wait after one."""
    pg.execute("SELECT * FROM work_set_limit_v1(NULL, NULL, 2)")
    for scope in ("A", "B", "C"):
        for _ in range(3):
            await store.enqueue("K", scope=scope)
    batch = await store.claim_batch("w", LEASE, 6, kinds=["K"])
    assert sorted(item.scope or "" for item in batch) == ["A", "A", "B", "B", "C", "C"]
    assert await store.claim_batch("w", LEASE, 6, kinds=["K"]) == []
    assert running_per_scope(pg) == {"A": 2, "B": 2, "C": 2} and wedges(pg) == []


async def test_a_claim_never_waits_for_a_settle_lock(
    dsn: str, store: PostgresStore, pg: Conn
) -> None:
    """A claim settles a scope that may run more only if its settle lock is free: with
    another transaction holding it, the claim takes its item without waiting and notes
    the scope for a later settle. (Waiting, a claim sent with a batch of completions,
    whose finish holds the settle locks of the scopes it ended, waited on another
    Worker's doing the same.) Should the claim ever be seen waiting, the holder commits,
    so the claim could settle the scope itself and the notes would show it too."""
    pg.execute("SELECT * FROM work_set_limit_v1(NULL, NULL, 2)")
    for _ in range(3):
        await store.enqueue("K", scope="S")
    holder, claimer = session(dsn), session(dsn)
    try:
        holder.execute("SELECT work_lock_scope('S')")
        pid = backend_pid(claimer)
        claimed: list[Any] = []
        done = trio.Event()
        waited = False

        async def claim() -> None:
            rows = await in_thread(
                lambda: claimer.execute(
                    "SELECT id FROM work_claim_v3('w', 30, 4, ARRAY['K'])"
                ).fetchall()
            )
            claimer.commit()
            claimed.extend(rows)
            done.set()

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(claim)
                while not done.is_set():
                    if not waited and waits_on_a_lock(pg, pid):
                        waited = True
                        holder.commit()
                    await trio.sleep(0.005)
        noted = pg.execute("SELECT scope FROM work_unsettled_scopes").fetchall()
        assert not waited and len(claimed) == 1 and noted == [("S",)]
        holder.commit()
        assert await store.settle_noted_scopes() == 1
        assert len(await store.claim_batch("w", LEASE, 4, kinds=["K"])) == 1
        assert running_per_scope(pg) == {"S": 2} and wedges(pg) == []
    finally:
        holder.close()
        claimer.close()


async def test_a_raised_limit_lets_a_busy_scope_run_more_and_wakes_workers(
    store: PostgresStore, pg: Conn
) -> None:
    """S (limit 1) runs one item and has four waiting. Raising its limit to 3 by plain
    SQL notes S for a settle and announces it; once settled, two more start at once."""
    for _ in range(5):
        await store.enqueue("K", scope="S")
    assert await store.claim("w", LEASE, kinds=["K"]) is not None
    assert await store.claim("w", LEASE, kinds=["K"]) is None
    heard, settle = Heard(), Heard()
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(store.listen, heard, on_settle=settle))
        pg.execute("INSERT INTO work_limits (scope, running) VALUES ('S', 3)")
        await settle.until(1)
        await heard.until(1)
        nursery.cancel_scope.cancel()
    assert settle.scopes == ["S"]
    assert await store.settle_noted_scopes() == 1
    batch = [await store.claim("w", LEASE, kinds=["K"]) for _ in range(3)]
    assert [item is not None for item in batch] == [True, True, False]
    assert running_per_scope(pg) == {"S": 3} and wedges(pg) == []


async def test_a_rate_limited_kind_starts_at_most_its_rate_and_is_never_failed(
    store: PostgresStore, pg: Conn
) -> None:
    """R may start 3 per 2 s: a claim of 10 takes 3, the rest stay Queued (nothing
    fails), other kinds are claimed meanwhile, seconds_until_due says when the window
    opens, and a start by hand in a closed window is refused by name."""
    await store.set_limit(kind="R", rate="3/2s")
    ids = [(await store.enqueue("R")).id for _ in range(10)]
    await store.enqueue("L")
    assert len(await store.claim_batch("w", LEASE, 10, kinds=["R"])) == 3
    assert [i.kind for i in await store.claim_batch("w", LEASE, 10, kinds=["R", "L"])] == ["L"]
    wait = await store.seconds_until_due(kinds=["R"])
    assert wait is not None and 0 < wait <= 2.0
    with pytest.raises(psycopg.errors.CheckViolation) as raised:
        pg.execute(TO_RUNNING, (ids[-1],))
    assert raised.value.diag.constraint_name == "work_items_rate_within_limit"
    row = pg.execute("SELECT count(*) FROM work_items WHERE kind = 'R' AND status = 'Queued'")
    assert row.fetchone() == (7,)
    await trio.sleep(wait + 0.05)
    assert len(await store.claim_batch("w", LEASE, 10, kinds=["R"])) == 3


async def test_a_spent_scope_holds_no_heads_and_a_head_a_race_leaves_it_cuts_no_claim_short(
    store: PostgresStore, pg: Conn
) -> None:
    """R's rate spent by a claim and its finish: R holds no head, and an item arriving
    in it is placed behind (the claim reads none of them). A head a race leaves there
    anyway (a settle that ran while a claim held R's last open start, made here by
    hand) is asked its rate: a claim of one takes X's later item, not nothing."""
    await store.set_limit(scope="R", rate="1/h")
    first = await store.enqueue("K", scope="R")
    behind = await store.enqueue("K", scope="R")
    [started] = await store.claim_batch("w", LEASE, 1, kinds=["K"])
    assert started.id == first.id and await store.complete(started.id, started.attempt)
    await store.enqueue("K", scope="R", priority=3)  # arrives in a line of its own
    heads = pg.execute("SELECT id FROM work_items WHERE scope = 'R' AND is_head").fetchall()
    assert heads == []
    row = pg.execute("SELECT reopens_at > now() FROM work_spent_scopes WHERE scope = 'R'")
    assert row.fetchone() == (True,)
    pg.execute("UPDATE work_items SET is_head = true WHERE id = %s", (behind.id,))
    x = await store.enqueue("K", scope="X")
    assert [item.id for item in await store.claim_batch("w", LEASE, 1, kinds=["K"])] == [x.id]
    assert {i.id for i in await store.claim_batch("w", LEASE, 9, kinds=["K"])} == set()
    row = pg.execute("SELECT count(*) FROM work_items WHERE scope = 'R' AND status = 'Queued'")
    assert row.fetchone() == (2,)  # `behind` and the later arrival wait for R's window


def test_only_a_settle_writes_a_spent_scopes_note(pg: Conn) -> None:
    """A note of work_spent_scopes is written and removed by work_settle_locked alone,
    whose callers hold the scope's settle lock: so nothing ever waits on a note's row
    (docs/adr/0014, the amendment on spent scopes)."""
    rows = pg.execute(
        "SELECT p.proname FROM pg_proc AS p"
        " WHERE p.pronamespace = current_schema()::regnamespace"
        " AND p.prosrc ~* '(insert\\s+into|update|delete\\s+from)\\s+work_spent_scopes'"
        " ORDER BY 1"
    ).fetchall()
    assert [name for (name,) in rows] == ["work_settle_locked"]


async def test_the_idle_sleep_ends_at_a_spent_scopes_reopening_for_work_due_before_it(
    store: PostgresStore, pg: Conn
) -> None:
    """R at one start in 3 s, spent; its next item falls due in 1 s, before R reopens:
    the idle sleep is until R reopens (R holds no head to say so), and then the item
    starts."""
    await store.set_limit(scope="R", rate="1/3s")
    await store.enqueue("K", scope="R")
    [started] = await store.claim_batch("w", LEASE, 1, kinds=["K"])
    assert await store.complete(started.id, started.attempt)
    later = await store.enqueue("K", scope="R", run_after=dt.timedelta(seconds=1))
    wait = await store.seconds_until_due(kinds=["K"])
    assert wait is not None and 1.0 < wait <= 3.0
    await trio.sleep(wait + 0.05)
    assert [i.id for i in await store.claim_batch("w", LEASE, 10, kinds=["K"])] == [later.id]


def test_a_note_that_no_longer_holds_is_repaired(pg: Conn) -> None:
    """A note of a scope that is not spent (its limit gone by a TRUNCATE, which fires no
    trigger) places an arriving item behind; the repair pass finds the scope free with
    no head, settles it (the note goes) and reports it."""
    pg.execute("INSERT INTO work_spent_scopes VALUES ('b', now() + interval '1 hour')")
    pg.execute("INSERT INTO work_items (kind, scope) VALUES ('K', 'b')")
    assert pg.execute("SELECT is_head FROM work_items").fetchall() == [(False,)]
    assert pg.execute("SELECT * FROM work_repair_v2(10)").fetchall() == [("b", 1)]
    assert pg.execute("SELECT is_head FROM work_items").fetchall() == [(True,)]
    assert pg.execute("SELECT count(*) FROM work_spent_scopes").fetchall() == [(0,)]
