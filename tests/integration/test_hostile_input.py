"""What a handler raises, what a caller stores, and what a lock holder does cannot stop a
Worker (issue 18): on real PostgreSQL, with Workers as users run them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from tests.support.processes import wait_for, workers
from trioworker import Registry, RetryPolicy, Settings, Status, Worker, open_store
from trioworker._core.jsontext import UndecodableValue

Conn = psycopg.Connection[Any]
FAST = ["--lease", "4", "--heartbeat", "1", "--poll", "0.2", "--stop-grace", "1"]
HOSTILE = "tests.apps.hostile:registry"
#: Valid jsonb, inside the table's size and depth limits, that Python's json cannot
#: read back: an integer of more than its 4,300 digits.
LONG_NUMBER = "('[' || repeat('1', 5000) || ']')::jsonb"


def enqueue(pg: Conn, kind: str, scope: str | None = None) -> int:
    row = pg.execute(
        "INSERT INTO work_items (kind, scope) VALUES (%s, %s) RETURNING id", (kind, scope)
    ).fetchone()
    assert row is not None
    return int(row[0])


def finished(pg: Conn, ids: list[int], timeout: float) -> dict[int, dict[str, Any]]:
    def all_done() -> dict[int, dict[str, Any]] | None:
        rows = pg.execute(
            "SELECT id, status, reason, error, traceback, failures, stalls FROM work_items"
            " WHERE id = ANY(%s)",
            (ids,),
        ).fetchall()
        by_id = {
            r[0]: dict(zip(["status", "reason", "error", "traceback", "failures", "stalls"],
                           r[1:], strict=True))
            for r in rows
        }  # fmt: skip
        done = all(v["status"] in ("Succeeded", "Failed", "Cancelled") for v in by_id.values())
        return by_id if done and len(by_id) == len(ids) else None

    result: dict[int, dict[str, Any]] = wait_for(all_done, timeout, f"items {ids} to finish")
    return result


def test_whatever_a_handler_raises_becomes_its_items_error_and_the_worker_goes_on(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """A surrogate in a DoNotRetry message, a __str__ that raises, a NUL, SystemExit(3),
    KeyboardInterrupt, a bare BaseException and a group holding a KeyboardInterrupt:
    each item is Failed or retried by its own policy with its text stored (escaped,
    not lost), never stalled, and the one Worker that ran them all is still running
    and still completes work."""
    kinds = ["Surrogate", "BrokenStr", "Nul", "Exit", "Interrupt", "Bare", "Group"]
    ids = {kind: enqueue(pg, kind, scope="hostile") for kind in kinds}
    with workers(tmp_path) as start:
        worker = start(dsn, *FAST, name="w1", app=HOSTILE)
        items = finished(pg, list(ids.values()), timeout=60)
        assert worker.proc.poll() is None, worker.output()
        quick = enqueue(pg, "Quick", scope="hostile")
        assert finished(pg, [quick], timeout=30)[quick]["status"] == "Succeeded"
        assert worker.proc.poll() is None, worker.output()
    by_kind = {kind: items[id] for kind, id in ids.items()}
    assert {kind: (v["status"], v["stalls"]) for kind, v in by_kind.items()} == {
        kind: ("Failed", 0) for kind in kinds
    }
    surrogate = by_kind["Surrogate"]
    assert surrogate["reason"] == "handler said not to retry"
    assert surrogate["error"] == "DoNotRetry: no such file: /media/caf\\udce9.txt"
    assert "caf\\udce9.txt" in surrogate["traceback"]
    assert by_kind["BrokenStr"]["error"] == ("BrokenStr: <str() of the error raised RuntimeError>")
    nul = by_kind["Nul"]
    assert (nul["reason"], nul["failures"]) == ("failed 2 of 2 attempts", 2)
    assert nul["error"] == "ValueError: before\\x00after"
    assert by_kind["Exit"]["error"] == "SystemExit: 3"
    assert by_kind["Interrupt"]["error"] == "KeyboardInterrupt"
    assert (by_kind["Bare"]["error"], by_kind["Bare"]["failures"]) == ("BaseException: bare", 2)
    assert by_kind["Group"]["error"].startswith("BaseExceptionGroup:")
    attempts = pg.execute(
        "SELECT outcome, error FROM work_attempts WHERE item_id = %s ORDER BY attempt",
        (ids["Nul"],),
    ).fetchall()
    assert attempts == [
        ("retried", "ValueError: before\\x00after"),
        ("failed", "ValueError: before\\x00after"),
    ]


def test_a_payload_python_cannot_decode_fails_its_own_item_only(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """Plain SQL stores a payload Python's json cannot read back (a 5,000-digit
    number): the Worker that claims it fails that item at once, with the reason, and
    goes on to the items claimed with it and after it."""
    poison = pg.execute(
        f"INSERT INTO work_items (kind, scope, payload) VALUES ('Quick', 'poison', {LONG_NUMBER})"
        " RETURNING id"
    ).fetchone()
    assert poison is not None
    others = [enqueue(pg, "Quick", scope="poison"), enqueue(pg, "Quick", scope="other")]
    with workers(tmp_path) as start:
        worker = start(dsn, *FAST, "--concurrency", "4", name="w1", app=HOSTILE)
        items = finished(pg, [poison[0], *others], timeout=60)
        assert worker.proc.poll() is None, worker.output()
    assert items[poison[0]]["status"] == "Failed"
    assert items[poison[0]]["reason"] == "payload cannot be decoded"
    assert items[poison[0]]["error"].startswith(
        "UndecodablePayload: the payload cannot be decoded: Exceeds the limit (4300 digits)"
    )
    assert [items[i]["status"] for i in others] == ["Succeeded", "Succeeded"]


async def test_the_store_reads_back_any_stored_payload(dsn: str, pg: Conn) -> None:
    """get_item of such an item answers, with the payload marked undecodable and the
    start of its text; an ordinary payload comes back decoded."""
    row = pg.execute(
        f"INSERT INTO work_items (kind, payload) VALUES ('Quick', {LONG_NUMBER}) RETURNING id"
    ).fetchone()
    assert row is not None
    plain = enqueue(pg, "Quick")
    async with open_store(dsn) as store:
        state = await store.get_item(row[0])
        ordinary = await store.get_item(plain)
    assert state is not None and ordinary is not None
    assert isinstance(state.payload, UndecodableValue)
    assert state.payload.text.startswith("[1111")
    assert "4300 digits" in state.payload.reason
    assert ordinary.payload == {}


@pytest.mark.parametrize("depth", [65, 3000])
def test_the_table_refuses_a_payload_nested_too_deeply_from_plain_sql(pg: Conn, depth: int) -> None:
    """The documented plain-SQL route meets the same depth bound as every Python path
    (64), by the constraint's name; 64 levels are taken."""
    deep = f"(repeat('[', {depth}) || repeat(']', {depth}))::jsonb"
    with pytest.raises(psycopg.errors.CheckViolation) as caught:
        pg.execute(f"INSERT INTO work_items (kind, payload) VALUES ('Quick', {deep})")
    assert caught.value.diag.constraint_name == "work_items_payload_depth"
    pg.execute(
        "INSERT INTO work_items (kind, payload)"
        " VALUES ('Quick', (repeat('[', 64) || repeat(']', 64))::jsonb)"
    )


#: A scope's claim lock, held as a claim of it in flight holds it (migration
#: 0010.own-locks): only a role that may UPDATE work_claim_locks can (a role without the
#: queue's grants cannot: tests/integration/test_own_locks.py).
HOLD_CLAIM_LOCK = "SELECT FROM work_claim_locks WHERE stripe = work_stripe(%s) FOR UPDATE"


def test_a_held_claim_lock_costs_a_claim_only_that_scope(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """A transaction holding a scope's claim lock for long (another claim of it, left
    open) costs claims that scope alone. With items of `victim` (first in line),
    `other` and unscoped, one Worker at concurrency 1 still claims `other` and the
    unscoped item while the lock is held, and `victim` once it is let go."""
    victim = enqueue(pg, "Quick", scope="victim")
    other, unscoped = enqueue(pg, "Quick", scope="other"), enqueue(pg, "Quick")
    stripes = pg.execute("SELECT work_stripe('victim') <> work_stripe('other')").fetchone()
    assert stripes == (True,)
    with psycopg.connect(dsn) as holder:
        holder.execute(HOLD_CLAIM_LOCK, ("victim",))
        with workers(tmp_path) as start:
            worker = start(dsn, *FAST, "--concurrency", "1", name="w1", app=HOSTILE)
            items = finished(pg, [other, unscoped], timeout=30)
            assert {items[other]["status"], items[unscoped]["status"]} == {"Succeeded"}
            status = pg.execute("SELECT status FROM work_items WHERE id = %s", (victim,))
            assert status.fetchone() == ("Queued",)
            holder.rollback()
            assert finished(pg, [victim], timeout=30)[victim]["status"] == "Succeeded"
            assert worker.proc.poll() is None, worker.output()


async def test_refused_claim_locks_never_empty_a_batch(dsn: str, pg: Conn) -> None:
    """Claims of one item each, with the claim locks of the first 20 scopes in line held
    elsewhere: each claim takes the next free scope, and the unscoped item, in order,
    never coming back empty while claimable work is due."""
    held = [enqueue(pg, "Quick", scope=f"held-{i:02}") for i in range(20)]
    free = [enqueue(pg, "Quick", scope=f"free-{i}") for i in range(3)] + [enqueue(pg, "Quick")]
    stripes = pg.execute(
        "SELECT count(DISTINCT work_stripe(s)) FROM unnest(%s::text[]) AS s",
        ([f"held-{i:02}" for i in range(20)] + [f"free-{i}" for i in range(3)],),
    ).fetchone()
    assert stripes == (23,)  # no free scope shares a held one's lock
    with psycopg.connect(dsn) as holder:
        for i in range(20):
            holder.execute(HOLD_CLAIM_LOCK, (f"held-{i:02}",))
        async with open_store(dsn) as store:
            claimed = [await store.claim_batch("w1", 60, 1, kinds=["Quick"]) for _ in range(5)]
    assert [[item.id for item in batch] for batch in claimed] == [[i] for i in free] + [[]]
    rows = pg.execute(
        "SELECT count(*) FROM work_items WHERE id = ANY(%s) AND status = 'Queued'", (held,)
    ).fetchone()
    assert rows == (20,)


async def test_a_fenced_transaction_begins_on_a_fresh_connection_after_its_backend_died(
    dsn: str, pg: Conn
) -> None:
    """Every pooled connection's backend terminated (a restart, or an operator's
    pg_terminate_backend): the next fenced transaction still begins, on a fresh one,
    instead of handing the handler a DatabaseUnavailable it would count as a failure."""
    item = enqueue(pg, "Quick")
    async with open_store(dsn, max_connections=2) as store:
        [claimed] = await store.claim_batch("w1", 60, 1, kinds=["Quick"])
        others = (
            " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        pg.execute("SELECT pg_terminate_backend(pid)" + others)
        wait_for(
            lambda: pg.execute("SELECT count(*)" + others).fetchone() == (0,),
            30,
            "the backends to be gone, not merely asked to go",
        )
        async with store.fenced_transaction(claimed.id, claimed.attempt) as tx:
            tx.complete()
    status = pg.execute(
        "SELECT status, completed_at IS NOT NULL FROM work_items WHERE id = %s", (item,)
    ).fetchone()
    assert status == (Status.RUNNING.value, True)  # its success committed (issue 31)


async def test_a_handler_that_loses_postgresql_in_its_transaction_stalls_not_fails(
    dsn: str, pg: Conn
) -> None:
    """The attempt's own transaction loses its connection mid-way (its backend is
    terminated between two statements): the handler's DatabaseUnavailable is not
    counted as a failure, even at max_attempts=1; the attempt writes nothing, and lease
    recovery requeues the item as a stall."""
    registry = Registry()
    attempts: list[int] = []

    @registry.handler("Blip", retry=RetryPolicy(max_attempts=1))
    async def blip(item: Any, ctx: Any) -> None:
        attempts.append(item.attempt)
        async with ctx.transaction() as tx:
            if item.attempt == 1:
                await tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            tx.complete()

    item = enqueue(pg, "Blip")
    settings = Settings(lease=3, heartbeat=0.5, poll=0.2, stop_grace=1, recovery_every=0.2)
    async with open_store(dsn) as store, trio.open_nursery() as nursery:
        worker = Worker(store, registry, settings, worker_id="w1", fail_stop=print)
        await nursery.start(worker.run)
        with trio.fail_after(30):
            while True:
                state = await store.get_item(item)
                if state is not None and state.status.is_terminal:
                    break
                await trio.sleep(0.1)
        worker.stop()
    assert state.status is Status.SUCCEEDED
    assert (state.failures, state.stalls, attempts) == (0, 1, [1, 2])
    assert worker.statistics().events.get("database_lost") == 1


def test_the_table_and_python_agree_on_what_is_blank(pg: Conn) -> None:
    """work_not_blank's class is Python's whitespace (str.strip, which every Python
    path uses), character by character over all of Unicode."""
    rows = pg.execute(
        "SELECT c FROM generate_series(1, 1114111) AS c"
        " WHERE c NOT BETWEEN 55296 AND 57343 AND NOT work_not_blank(chr(c))"
    ).fetchall()
    assert [c for (c,) in rows] == [c for c in range(1, 0x110000) if chr(c).isspace()]


@pytest.mark.parametrize("column", ["kind", "scope", "dedup_key"])
@pytest.mark.parametrize("name", [" ", "\u2028", "\t\n", "\u3000"])
def test_the_table_refuses_a_blank_name_from_plain_sql(pg: Conn, column: str, name: str) -> None:
    """A blank kind could never be served (no Registry takes it): refused by name, as
    enqueue refuses it."""
    values = {"kind": "Quick", "scope": None, "dedup_key": None, column: name}
    with pytest.raises(psycopg.errors.CheckViolation) as caught:
        pg.execute(
            "INSERT INTO work_items (kind, scope, dedup_key) VALUES (%s, %s, %s)",
            (values["kind"], values["scope"], values["dedup_key"]),
        )
    assert caught.value.diag.constraint_name == "work_items_names_not_blank"
