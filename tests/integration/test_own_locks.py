"""The queue's locks are its own (issue 32; docs/design/claim.md, "Locks"): a role granted
nothing, which any role that can connect is, holds every advisory key the Workers were
seen to take and every key the queue ever used, and the queue runs on; it can lock none
of the queue's rows. Lease recovery (docs/adr/0014-scope-lines-and-heads.md, "Lease
recovery and a held row") takes an expired item back once the session holding its row
ends, without waiting for it meanwhile, and names it once it has been held past every
bound the queue sets.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from tests.support.database import Databases
from tests.support.processes import kill_workers, observed, wait_for, workers
from tests.support.stranger import advisory_keys, families, held_by, hold, stranger_role
from trioworker import PostgresStore, Status

Conn = psycopg.Connection[Any]
APP = "tests.apps.locks:registry"
FAST = ["--lease", "4", "--heartbeat", "1", "--poll", "0.2", "--stop-grace", "1"]
#: A fenced transaction's first statement, the fence (queries.sql, lock_attempt).
LOCK_ATTEMPT = "SELECT work_fence_v1(%s, %s)"


def enqueue(pg: Conn, kind: str, scope: str | None, payload: str = "{}") -> int:
    row = pg.execute(
        "INSERT INTO work_items (kind, scope, payload) VALUES (%s, %s, %s) RETURNING id",
        (kind, scope, payload),
    ).fetchone()
    assert row is not None
    return int(row[0])


def a_mix(pg: Conn, tag: str) -> tuple[list[int], list[str]]:
    """Items of every shape the claim treats apart, and their scopes: three in each of
    three scopes of limit 1, four in `wide` (limit 2), six of the kind `Capped` (limit 2;
    half of them scoped), and six unscoped."""
    scopes = [f"{tag}-{i}" for i in range(3)]
    ids = [enqueue(pg, "Sleep", s) for s in scopes for _ in range(3)]
    ids += [enqueue(pg, "Sleep", "wide") for _ in range(4)]
    ids += [enqueue(pg, "Capped", scopes[i % 3] if i % 2 else None) for i in range(6)]
    ids += [enqueue(pg, "Sleep", None) for _ in range(6)]
    return ids, [*scopes, "wide"]


def statuses(pg: Conn, ids: list[int]) -> dict[int, tuple[str, int]]:
    rows = pg.execute(
        "SELECT id, status, stalls FROM work_items WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    return {id: (status, stalls) for id, status, stalls in rows}


def all_finished(pg: Conn, ids: list[int]) -> dict[int, tuple[str, int]] | None:
    now = statuses(pg, ids)
    done = all(status in ("Succeeded", "Failed", "Cancelled") for status, _ in now.values())
    return now if done and len(now) == len(ids) else None


def test_a_role_without_grants_holding_every_advisory_key_stops_no_worker(
    databases: Databases, dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """Two Workers run scoped items, a scope with a limit of 2, a kind with a limit of 2
    and unscoped items, while the test samples every advisory lock of the database. Then
    a role with no grants holds, for its session, every key sampled and every key the
    queue's functions ever took for the scopes in play (a scope's settle and claim
    locks, the limits lock, the migration lock). A Worker is killed while its handler
    runs an item of a scope with another item behind it; new items of every shape are
    enqueued; two more Workers run all of them to the end within the bound, the killed
    attempt's item is recovered (one stall) and run again, and its scope's next item
    runs after it. The role held its keys throughout, and the Workers took none."""
    pg.execute("SELECT work_set_limit_v1('Capped', NULL, 2), work_set_limit_v1(NULL, 'wide', 2)")
    first, scopes = a_mix(pg, "a")
    sampled: set[Any] = set()
    with workers(tmp_path) as start:
        for name in ("w1", "w2"):
            start(dsn, *FAST, "--concurrency", "4", name=name, app=APP)
        deadline = time.monotonic() + 60
        while all_finished(pg, first) is None:
            assert time.monotonic() < deadline, f"first items never finished: {statuses(pg, first)}"
            sampled |= advisory_keys(pg)
            time.sleep(0.002)

    with (
        stranger_role(databases.admin_dsn, dsn) as stranger_dsn,
        psycopg.connect(stranger_dsn, autocommit=True) as stranger,
        workers(tmp_path) as start,
    ):
        second, more = a_mix(pg, "b")
        keys = sampled | families(pg, [*scopes, *more, "doomed"])
        hold(stranger, keys)
        assert held_by(stranger) == keys
        doomed = enqueue(pg, "Sleep", "doomed", '{"first": 600}')
        behind = enqueue(pg, "Sleep", "doomed")
        killed = start(dsn, *FAST, "--concurrency", "1", name="w3", app=APP)
        wait_for(
            lambda: any(e["id"] == doomed and e["event"] == "start" for e in observed(tmp_path)),
            30,
            "the doomed item's first attempt to start",
        )
        kill_workers(killed.proc)
        for name in ("w4", "w5"):
            start(dsn, *FAST, "--concurrency", "4", name=name, app=APP)
        everything = [*second, doomed, behind]
        done = wait_for(lambda: all_finished(pg, everything), 60, "every item to finish")
        assert {status for status, _ in done.values()} == {"Succeeded"}, done
        assert done[doomed] == ("Succeeded", 1)  # recovered once, then run again
        runs = {(e["id"], e["event"]): e["t"] for e in observed(tmp_path) if e["attempt"] > 1}
        assert runs[(doomed, "end")] <= min(
            e["t"] for e in observed(tmp_path) if e["id"] == behind and e["event"] == "start"
        )
        assert held_by(stranger) == keys
    assert sampled == set()  # the Workers took no advisory lock at all


async def test_every_transition_goes_on_while_a_role_without_grants_holds_every_key(
    databases: Databases, dsn: str, pg: Conn, store: PostgresStore
) -> None:
    """With every advisory key the queue's functions ever took for its scopes held by a
    role with no grants: limit changes (the default, a scope's, a kind's) commit; a
    claim takes the first item of each free scope and the unscoped ones, within a
    kind's limit, and the next of a scope with a limit of 2 in the same claim; a
    completion, a release and lease recovery settle their scopes, so the next claim
    takes what was behind; a paused scope is held back until it is resumed. No call
    waits: each has 10 s (the store's call timeout), and all of them 20 s."""
    with (
        stranger_role(databases.admin_dsn, dsn) as stranger_dsn,
        psycopg.connect(stranger_dsn, autocommit=True) as stranger,
    ):
        keys = families(pg, ["s1", "s2", "wide"])
        hold(stranger, keys)

        async def claim() -> set[int]:
            return {i.id for i in await store.claim_batch("w", 60, 20, kinds=["K", "Capped"])}

        with trio.fail_after(20):
            await store.set_limit(running=1)
            await store.set_limit(scope="wide", running=2)
            await store.set_limit(kind="Capped", running=1)
            s1 = [(await store.enqueue("K", scope="s1")).id for _ in range(2)]
            s2 = [(await store.enqueue("K", scope="s2")).id for _ in range(2)]
            wide = [(await store.enqueue("K", scope="wide")).id for _ in range(3)]
            capped = [(await store.enqueue("Capped")).id for _ in range(2)]
            loose = (await store.enqueue("K")).id
            assert await claim() == {s1[0], s2[0], wide[0], wide[1], capped[0], loose}
            assert await claim() == set()
            assert await store.complete(s1[0], 1)
            assert await store.release(capped[0], 1)
            assert await store.pause(scope="s2")
            assert await store.complete(s2[0], 1)
            pg.execute(
                "UPDATE work_items SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
                (wide[0],),
            )
            [recovered] = await store.recover_expired_leases(3)
            assert (recovered.id, recovered.status) == (wide[0], Status.QUEUED)
            assert await claim() == {s1[1], capped[0], wide[0]}
            assert await claim() == set()
            assert await store.resume(scope="s2")
            assert await claim() == {s2[1]}
        assert held_by(stranger) == keys


def test_a_role_without_grants_can_lock_none_of_the_queues_rows(
    databases: Databases, dsn: str, pg: Conn
) -> None:
    """The locks the queue takes are rows of its own tables: taking one asks for UPDATE
    on the table, which a role granted nothing is refused at once, never left waiting;
    and the queue's functions, called by it, are refused before they lock anything."""
    with (
        stranger_role(databases.admin_dsn, dsn) as stranger_dsn,
        psycopg.connect(stranger_dsn, autocommit=True) as stranger,
    ):
        stranger.execute("SET lock_timeout = '1s'")
        for statement in [
            "SELECT FROM work_claim_locks FOR UPDATE",
            "SELECT FROM work_settle_locks FOR SHARE",
            "SELECT FROM work_settle_locks FOR KEY SHARE SKIP LOCKED",
            "SELECT FROM work_items FOR KEY SHARE",
            "LOCK TABLE work_claim_locks IN ROW SHARE MODE",
            "SELECT * FROM work_claim_v3('x', 60, 10, '{K}')",
            "SELECT work_set_limit_v1(NULL, NULL, 3)",
            "SELECT * FROM work_recover_v1(3, 100)",
        ]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege), stranger.transaction():
                stranger.execute(statement)  # type: ignore[arg-type]
        assert stranger.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()"
            " AND locktype IN ('tuple', 'advisory')"
        ).fetchone() == (0,)


@pytest.mark.parametrize("table", ["work_claim_locks", "work_settle_locks"])
@pytest.mark.parametrize(
    "statement",
    ["DELETE FROM {} WHERE stripe = 7", "UPDATE {} SET stripe = -1 WHERE stripe = 7",
     "TRUNCATE {}"],
)  # fmt: skip
def test_the_lock_rows_are_never_changed_or_removed(pg: Conn, table: str, statement: str) -> None:
    """A stripe's row missing would leave its scopes no lock to take (a claim would pass
    them over for good): even a role that may write the table is refused, by name."""
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        pg.execute(statement.format(table))  # type: ignore[arg-type]
    assert refused.value.diag.constraint_name == f"{table}_stay"
    assert pg.execute(f"SELECT count(*) FROM {table}").fetchone() == (16384,)  # type: ignore[arg-type]


async def test_an_expired_item_held_by_a_lost_hosts_session_is_recovered_once_it_ends(
    databases: Databases, dsn: str, pg: Conn, store: PostgresStore
) -> None:
    """Item A of scope S runs on a Worker whose host is lost with A's fenced transaction
    open: that transaction's session (one of the test's here) holds A's row, and B waits
    behind A. An application's transaction that merely refers to A (a row with a foreign
    key to it, not committed) and a role with no grants holding S's advisory keys are
    there too. A's lease runs out. Recovery passes A over while the session lasts, and
    does not wait for it; once the server ends that session, the next pass takes A back
    (a stall), the referrer notwithstanding; A is claimed again, and B after it."""
    pg.execute("CREATE TABLE receipts (item_id bigint REFERENCES work_items (id))")
    a, b = [(await store.enqueue("K", scope="S")).id for _ in range(2)]
    [claimed] = await store.claim_batch("lost", 60, 1, kinds=["K"])
    assert claimed.id == a
    pg.execute(
        "UPDATE work_items SET heartbeat_at = now() - interval '61 s',"
        " lease_expires_at = now() - interval '1 s' WHERE id = %s",
        (a,),
    )
    with (
        contextlib.closing(psycopg.connect(dsn)) as lost,  # its server ends it
        psycopg.connect(dsn) as referrer,
        stranger_role(databases.admin_dsn, dsn) as stranger_dsn,
        psycopg.connect(stranger_dsn, autocommit=True) as stranger,
    ):
        hold(stranger, families(pg, ["S"]))
        assert lost.execute(LOCK_ATTEMPT, (a, claimed.attempt)).fetchall() == [(True,)]
        referrer.execute("INSERT INTO receipts (item_id) VALUES (%s)", (a,))
        with trio.fail_after(5):
            assert await store.recover_expired_leases(3) == []
            assert await store.claim_batch("w", 60, 5, kinds=["K"]) == []
        pg.execute("SELECT pg_terminate_backend(%s)", (lost.info.backend_pid,))
        wait_for(
            lambda: pg.execute(
                "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)",
                (lost.info.backend_pid,),
            ).fetchone() == (True,),
            10,
            "the lost host's session to end",
        )  # fmt: skip
        with trio.fail_after(10):
            [recovered] = await store.recover_expired_leases(3)
            assert (recovered.id, recovered.status, recovered.stalls) == (a, Status.QUEUED, 1)
            # The claim, like a settle, passes over a row that another transaction has
            # locked in any way (here, the referrer's share lock): A's turn waits for it.
            referrer.rollback()
            await store.settle_noted_scopes()
            [again] = await store.claim_batch("w", 60, 5, kinds=["K"])
            assert (again.id, again.attempt) == (a, 2)
            assert await store.complete(a, 2)
            [after] = await store.claim_batch("w", 60, 5, kinds=["K"])
            assert after.id == b


async def test_an_expired_item_held_past_every_bound_is_named_and_holds_up_no_other(
    dsn: str, pg: Conn, store: PostgresStore
) -> None:
    """Items A, C and D ran on Workers that are gone. A's lease (one minute) ran out two
    minutes ago and an operator's session still holds its row: past every bound the
    queue sets on a holder. D's ran out a second ago, and a session holds it too. C's
    nobody holds. Recovery takes C back at once, passing over A and D without waiting
    for them; held_leases names A, and the backend that holds it, and not D (it may
    still be let go by the bounds). Once the operator's session ends, the next pass
    takes A back."""
    a, c, d = [(await store.enqueue("K")).id for _ in range(3)]
    claimed = await store.claim_batch("gone", 60, 3, kinds=["K"])
    assert sorted(i.id for i in claimed) == [a, c, d]
    pg.execute(
        "UPDATE work_items SET heartbeat_at = now() - interval '3 min',"
        " lease_expires_at = now() - interval '2 min' WHERE id = %s",
        (a,),
    )
    pg.execute(
        "UPDATE work_items SET heartbeat_at = now() - interval '61 s',"
        " lease_expires_at = now() - interval '1 s' WHERE id = ANY(%s)",
        ([c, d],),
    )
    with psycopg.connect(dsn) as operator, psycopg.connect(dsn) as other:
        operator.execute("SELECT FROM work_items WHERE id = %s FOR UPDATE", (a,))
        other.execute(LOCK_ATTEMPT, (d, 1))
        with trio.fail_after(2):
            recovered = await store.recover_expired_leases(3)
            held = await store.held_leases()
        assert [r.id for r in recovered] == [c]
        assert [(h.id, h.attempt, h.worker_id, h.holder) for h in held] == [
            (a, 1, "gone", operator.info.backend_pid)
        ]
        assert 119 < held[0].expired_for < 150
        operator.rollback()
        with trio.fail_after(2):
            assert [r.id for r in await store.recover_expired_leases(3)] == [a]
            assert await store.held_leases() == []
        other.rollback()
