"""The server's cost an item (issue 32, migrations/0001.queue.sql), on real
PostgreSQL: the finish and the requeue read only their batch, the slot trigger does not
fire where no slot exists, no CHECK on a column the transitions never write is tested
again on every UPDATE (the same bounds still refuse a bad row by name), and the index
lease recovery no longer has is not missed."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import trio

from tests.support.stores import opened
from trioworker import Context, NewItem, PostgresStore, Registry, Settings, Worker, WorkItem
from trioworker._postgres.queries import WRITTEN as QUERIES
from trioworker.dashboard._reader import QUERIES as DASHBOARD_QUERIES

Conn = psycopg.Connection[Any]

#: Running items beside the batch, as in `bench e2e` (2 Workers x 32, claims of 128).
RUNNING = 256
BATCH = 100


def running_items(pg: Conn, n: int, *, kind: str = "Noop") -> list[tuple[int, int]]:
    """n unscoped items claimed (Running), as (id, attempt), in id order."""
    pg.execute(
        "INSERT INTO work_items (kind) SELECT %s FROM generate_series(1, %s)", (kind, n + 50)
    )
    rows = pg.execute(
        "SELECT id, attempt FROM work_claim_v3('w1', 60, %s, ARRAY[%s]) ORDER BY id", (n, kind)
    ).fetchall()
    assert len(rows) == n
    return [(int(r[0]), int(r[1])) for r in rows]


def nested_plans(pg: Conn, statement: str, params: tuple[Any, ...]) -> Iterator[dict[str, Any]]:
    """The plans auto_explain gives of every statement `statement` runs, nested ones
    too (JSON, with the rows each node read), in a transaction rolled back after."""
    notices: list[str] = []
    pg.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    with pg.transaction(force_rollback=True):
        pg.execute("LOAD 'auto_explain'")
        for name, value in [
            ("log_min_duration", "0"), ("log_nested_statements", "on"),
            ("log_analyze", "on"), ("log_timing", "off"), ("log_format", "json"),
            ("log_level", "notice"),
        ]:  # fmt: skip
            pg.execute("SELECT set_config(%s, %s, true)", (f"auto_explain.{name}", value))
        pg.execute(statement, params).fetchall()
    for message in notices:
        if "plan:" in message:
            yield json.loads(message.split("plan:", 1)[1])


def rows_read(node: dict[str, Any], table: str = "work_items") -> int:
    """The rows a plan read of `table`: those its scans returned or filtered out, and
    those its joins compared and threw away."""
    loops = int(node.get("Actual Loops", 1))
    read = int(node.get("Rows Removed by Join Filter", 0))
    if node.get("Relation Name") == table and "Scan" in node["Node Type"]:
        read += (int(node["Actual Rows"]) + int(node.get("Rows Removed by Filter", 0))) * loops
    return read + sum(rows_read(child, table) for child in node.get("Plans", []))


def update_plans(plans: Iterator[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plans of the statements that updated work_items, or locked its rows."""
    found = []
    for plan in plans:
        text = plan["Query Text"]
        if "UPDATE work_items AS w" in text or "FOR UPDATE OF w" in text:
            found.append(plan["Plan"])
    return found


def test_a_finish_reads_only_its_batch_however_many_items_run(pg: Conn) -> None:
    """A finish of 100 items beside 256 Running reads those 100 rows and no others (it
    read every Running row once for each item: 25,600 rows)."""
    attempts = running_items(pg, RUNNING)
    batch = attempts[::2][:BATCH]
    plans = update_plans(
        nested_plans(
            pg,
            "SELECT * FROM work_finish_v1(%s, %s, 'Succeeded', NULL, NULL, false, NULL)",
            ([i for i, _ in batch], [a for _, a in batch]),
        )
    )
    assert len(plans) == 1
    assert rows_read(plans[0]) == BATCH


def test_a_requeue_reads_only_its_rows(pg: Conn) -> None:
    """A release of 10 items beside 256 Running locks and reads those 10 rows alone."""
    attempts = running_items(pg, RUNNING)
    batch = attempts[-10:]
    plans = update_plans(
        nested_plans(
            pg,
            "SELECT * FROM work_requeue_v1(%s, %s, 'release')",
            ([i for i, _ in batch], [a for _, a in batch]),
        )
    )
    locking = [p for p in plans if rows_read(p) > 0]
    assert locking, plans
    assert rows_read(locking[0]) == len(batch)


def test_the_finish_still_fences_by_attempt_and_takes_the_latest_asked(pg: Conn) -> None:
    """By primary key, the attempt still fences: a stale attempt finishes nothing, an
    item asked twice (a stale and its current attempt) is finished once, and ids asked
    in any order are each matched to their own attempt."""
    attempts = running_items(pg, 6)
    (a, n), (b, m), (c, k), (d, j), *_ = attempts
    pg.execute("UPDATE work_items SET attempt = attempt + 1 WHERE id = %s", (b,))
    done = pg.execute(
        "SELECT f FROM work_finish_v1(%s, %s, 'Succeeded', NULL, NULL, false, NULL) AS f"
        " ORDER BY f",
        ([d, b, a, c, c], [j, m, n, k - 1, k]),
    ).fetchall()
    assert [r[0] for r in done] == [a, c, d]  # b's attempt moved on: fenced out
    assert pg.execute("SELECT status FROM work_items WHERE id = %s", (b,)).fetchone() == (
        "Running",
    )


def take_slot_calls(pg: Conn, statement: str, params: tuple[Any, ...] = ()) -> int:
    """How often `statement` called work_items_take_slot (PL/pgSQL function statistics,
    of this transaction alone)."""
    with pg.transaction():
        pg.execute("SET LOCAL track_functions = 'pl'")
        pg.execute(statement, params).fetchall()
        row = pg.execute(
            "SELECT COALESCE(sum(calls), 0) FROM pg_stat_xact_user_functions"
            " WHERE funcname = 'work_items_take_slot'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_slot_trigger_fires_only_where_a_slot_exists(pg: Conn) -> None:
    """A claim of unscoped items of a kind without a limit does not call the slot
    trigger; a claim of a scoped item, or of a kind with a limit, still does, and the
    limit still holds."""
    pg.execute("INSERT INTO work_items (kind) SELECT 'Free' FROM generate_series(1, 20)")
    claim = "SELECT * FROM work_claim_v3('w1', 60, %s, ARRAY[%s])"
    assert take_slot_calls(pg, claim, (10, "Free")) == 0
    pg.execute("INSERT INTO work_items (kind, scope) VALUES ('Free', 's1')")
    assert take_slot_calls(pg, claim, (20, "Free")) >= 1
    pg.execute("SELECT work_set_limit_v1('Capped', NULL, 2)")
    pg.execute("INSERT INTO work_items (kind) SELECT 'Capped' FROM generate_series(1, 5)")
    assert take_slot_calls(pg, claim, (5, "Capped")) >= 1
    slots = pg.execute(
        "SELECT kind_slot FROM work_items WHERE kind = 'Capped' AND status = 'Running'"
        " ORDER BY kind_slot"
    ).fetchall()
    assert slots == [(1,), (2,)]


#: The columns the queue's transitions write (claim, heartbeat, finish, requeue,
#: recovery, settle, cancel, the slots); every other column is written by an enqueue,
#: a retry's run_after, or by hand.
WRITTEN = {
    "status", "is_head", "attempt", "stalls", "failures", "worker_id", "lease_expires_at",
    "heartbeat_at", "started_at", "finished_at", "completed_at", "reason", "error",
    "traceback", "cancel_requested", "scope_slot", "kind_slot",
}  # fmt: skip


def test_no_check_of_work_items_tests_only_columns_no_transition_writes(pg: Conn) -> None:
    """PostgreSQL tests every CHECK of a table on every UPDATE of a row: each CHECK left
    on work_items names a column the transitions write, so none is tested in vain."""
    rows = pg.execute(
        "SELECT c.conname, array_agg(a.attname::text)"
        " FROM pg_constraint AS c"
        " JOIN pg_attribute AS a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)"
        " WHERE c.conrelid = 'work_items'::regclass AND c.contype = 'c'"
        " GROUP BY c.conname ORDER BY c.conname"
    ).fetchall()
    assert rows
    idle = [name for name, columns in rows if not set(columns) & WRITTEN]
    assert idle == []


DEEP = "[" * 65 + "]" * 65
#: (column, a value out of bounds as SQL text, the bound that refuses it)
BAD = [
    ("kind", "''", "work_items_kind_sane"),
    ("kind", "repeat('k', 201)", "work_items_kind_sane"),
    ("kind", "' '", "work_items_names_not_blank"),
    ("scope", "''", "work_items_names_not_blank"),  # (before scope_sane, by name)
    ("scope", "repeat('s', 201)", "work_items_scope_sane"),
    ("scope", "E'\\u2028'", "work_items_names_not_blank"),
    ("dedup_key", "''", "work_items_dedup_key_sane"),
    ("dedup_key", "repeat('d', 201)", "work_items_dedup_key_sane"),
    ("dedup_key", "E'\\t'", "work_items_names_not_blank"),
    ("priority", "1001", "work_items_priority_sane"),
    ("priority", "-1001", "work_items_priority_sane"),
    ("payload", f"'{DEEP}'::jsonb", "work_items_payload_depth"),
    ("payload", "jsonb_build_array(repeat('p', 131072))", "work_items_payload_fits"),
    ("trace_context", "'[]'::jsonb", "work_items_trace_context_sane"),
    ("trace_context", "'{\"a\": 1}'::jsonb", "work_items_trace_context_sane"),
    ("trace_context", "jsonb_build_object('a', repeat('t', 8200))",
     "work_items_trace_context_sane"),
    ("requested_at", "'infinity'", "work_items_asked_times_in_range"),
    ("run_after", "'0044-03-15 00:00:00+00 BC'", "work_items_asked_times_in_range"),
]  # fmt: skip


@pytest.mark.parametrize(("column", "value", "bound"), BAD)
def test_a_bad_row_is_refused_by_its_bounds_name_on_insert_and_update(
    pg: Conn, column: str, value: str, bound: str
) -> None:
    """Each bound on what an enqueue asks for refuses a row breaking it, by the bound's
    name (SQLSTATE 23514, as its CHECK did), whether inserted or updated by hand."""
    columns, values = ("kind", "'Quick'") if column != "kind" else ("priority", "0")
    with pytest.raises(psycopg.errors.CheckViolation) as caught:
        pg.execute(f"INSERT INTO work_items ({columns}, {column}) VALUES ({values}, {value})")
    assert caught.value.diag.constraint_name == bound
    assert bound in (caught.value.diag.message_primary or "")
    row = pg.execute("INSERT INTO work_items (kind) VALUES ('Quick') RETURNING id").fetchone()
    assert row is not None
    with pytest.raises(psycopg.errors.CheckViolation) as caught:
        pg.execute(f"UPDATE work_items SET {column} = {value} WHERE id = %s", row)
    assert caught.value.diag.constraint_name == bound


def test_rows_within_bounds_are_stored_at_the_edges(pg: Conn) -> None:
    """The bounds' edges are inside: 200 characters, priority +-1000, 64 levels of
    nesting, a trace context of strings; NULLs where a column may be NULL."""
    nested = "[" * 64 + "]" * 64
    pg.execute(
        "INSERT INTO work_items (kind, scope, dedup_key, priority, payload, trace_context)"
        " VALUES (repeat('k', 200), repeat('s', 200), repeat('d', 200), 1000, %s::jsonb,"
        ' \'{"traceparent": "00-x"}\')',
        (nested,),
    )
    pg.execute("INSERT INTO work_items (kind, priority) VALUES ('Quick', -1000)")


#: The two indexes that hold every Running row between them: the rows with a kind slot,
#: and the Running rows without one.
RUNNING_INDEXES = {"work_items_one_running_per_kind_slot", "work_items_running_unslotted_kind"}


def scans_of(node: dict[str, Any], table: str = "work_items") -> list[tuple[str, str]]:
    """Each scan of `table` in a plan, as (node type, index name or ""), the index scans
    under a bitmap heap scan included."""
    found = []
    if node.get("Relation Name") == table and "Scan" in node["Node Type"]:
        found.append((node["Node Type"], node.get("Index Name", "")))
    if node["Node Type"] == "Bitmap Index Scan":
        found.append((node["Node Type"], node["Index Name"]))
    for child in node.get("Plans", []):
        found += scans_of(child, table)
    return found


def assert_reads_the_running_indexes(plan: dict[str, Any]) -> None:
    """The plan finds the Running rows through both of their indexes (rows it already
    knows, by primary key), never by reading the table."""
    scans = scans_of(plan)
    assert not [s for s in scans if s[0] == "Seq Scan"], scans
    indexes = {index for kind, index in scans if kind != "Bitmap Heap Scan"}
    assert RUNNING_INDEXES <= indexes <= RUNNING_INDEXES | {"work_items_pkey"}, scans


def test_lease_recovery_reads_the_running_rows_without_the_lease_index(pg: Conn) -> None:
    """The index a claim and every heartbeat wrote for lease recovery alone is gone;
    recovery reads the Running rows (at most the Workers' concurrency) from the two
    indexes that hold them, not the table, and still takes back the expired ones."""
    assert pg.execute("SELECT to_regclass('work_items_running_lease')").fetchone() == (None,)
    attempts = running_items(pg, 20)
    expired = [i for i, _ in attempts[:3]]
    pg.execute(
        "UPDATE work_items SET lease_expires_at = now() - interval '1 second' WHERE id = ANY(%s)",
        (expired,),
    )
    plans = [
        p for p in nested_plans(pg, "SELECT * FROM work_recover_v1(3, 100)", ())
        if "lease_expires_at < now()" in p["Query Text"] and "LIMIT p_batch" in p["Query Text"]
    ]  # fmt: skip
    assert len(plans) == 1
    assert_reads_the_running_indexes(plans[0]["Plan"])
    assert rows_read(plans[0]["Plan"]) == 20
    recovered = pg.execute("SELECT id FROM work_recover_v1(3, 100) ORDER BY id").fetchall()
    assert [r[0] for r in recovered] == expired


def test_held_leases_and_running_items_read_the_running_indexes(pg: Conn) -> None:
    """The other readers of every Running row (held_leases, the operations' and the
    dashboard's running items) read them from the same two indexes, rows with a kind
    slot among them."""
    pg.execute("INSERT INTO work_limits (kind, running) VALUES ('Limited', 5)")
    running_items(pg, 3, kind="Limited")
    running_items(pg, 10)
    pg.execute(
        "UPDATE work_items SET lease_expires_at = now() - interval '1 hour'"
        " WHERE status = 'Running'"
    )
    plans = [
        p for p in nested_plans(pg, "SELECT * FROM work_held_leases_v1(10)", ())
        if "lease_expires_at < now()" in p["Query Text"]
    ]  # fmt: skip
    assert len(plans) == 1
    assert_reads_the_running_indexes(plans[0]["Plan"])
    for statement in (QUERIES["running_items"], DASHBOARD_QUERIES["running"]):
        with pg.transaction(force_rollback=True):
            pg.execute("SET LOCAL enable_seqscan = off")
            (plan,) = pg.execute("EXPLAIN (FORMAT JSON) " + statement, {"limit": 10}).fetchone()  # type: ignore[misc]
        assert_reads_the_running_indexes(plan[0]["Plan"])


# -- the finish of a batch and the next claim, in one round trip ----------------------


async def test_finish_and_claim_fences_the_finish_and_still_claims(
    store: PostgresStore, pg: Conn
) -> None:
    """A stale attempt's completion is refused in the combined call as in a finish of its
    own (its item stays Running), the current one's applies, and the claim still takes
    the due items it may."""
    a, b = (await store.enqueue("Noop")).id, (await store.enqueue("Noop")).id
    running = await store.claim_batch("w1", 30, 2, kinds=["Noop"])
    assert [i.id for i in running] == [a, b]
    waiting = [(await store.enqueue("Noop")).id for _ in range(3)]
    ia, ib = running
    applied, claimed = await store.complete_and_claim(
        [(ia.id, ia.attempt), (ib.id, ib.attempt - 1)], "w2", 30, 5, kinds=["Noop"]
    )
    assert applied == {a}
    assert [i.id for i in claimed] == waiting
    assert {i.attempt for i in claimed} == {1}
    statuses = dict(pg.execute("SELECT id, status FROM work_items").fetchall())
    assert statuses == {a: "Succeeded", b: "Running", **dict.fromkeys(waiting, "Running")}


async def test_finish_and_claim_keeps_the_scope_rule(store: PostgresStore, pg: Conn) -> None:
    """The claim sees the finish before it: a scope whose Running item the call finished
    gives the claim its next item; a scope whose completion was fenced out stays busy,
    and its next item waits."""
    await store.enqueue("Noop", scope="s"), await store.enqueue("Noop", scope="t")
    first = await store.claim_batch("w1", 30, 2, kinds=["Noop"])
    s_next = (await store.enqueue("Noop", scope="s")).id
    t_next = (await store.enqueue("Noop", scope="t")).id
    on = {i.scope: i for i in first}
    applied, claimed = await store.complete_and_claim(
        [(on["s"].id, on["s"].attempt), (on["t"].id, on["t"].attempt + 1)],
        "w2", 30, 5, kinds=["Noop"],
    )  # fmt: skip
    assert applied == {on["s"].id}
    assert [i.id for i in claimed] == [s_next]
    row = pg.execute("SELECT status FROM work_items WHERE id = %s", (t_next,)).fetchone()
    assert row == ("Queued",)
    [(running,)] = pg.execute(
        "SELECT count(*) FROM work_items WHERE scope = 't' AND status = 'Running'"
    ).fetchall()
    assert running == 1


async def test_a_worker_finishes_and_claims_in_one_round_trip(dsn: str) -> None:
    """With items waiting, a Worker sends its completions and its next claim together:
    it makes fewer claim and finish calls than it runs batches, every item succeeds, and
    no item runs twice."""
    calls: Counter[str] = Counter()

    class Counted(PostgresStore):
        async def claim_batch(self, *args: Any, **kwargs: Any) -> list[WorkItem]:
            calls["claim"] += 1
            return await super().claim_batch(*args, **kwargs)

        async def complete_batch(self, *args: Any, **kwargs: Any) -> set[int]:
            calls["finish"] += 1
            return await super().complete_batch(*args, **kwargs)

        async def complete_and_claim(
            self, *args: Any, **kwargs: Any
        ) -> tuple[set[int], list[WorkItem]]:
            calls["finish_and_claim"] += 1
            return await super().complete_and_claim(*args, **kwargs)

    registry = Registry()
    ran: Counter[int] = Counter()

    @registry.handler("Noop")
    async def noop(item: WorkItem, ctx: Context) -> None:
        ran[item.id] += 1

    items = 300
    async with opened(Counted(dsn, call_timeout=10.0)) as store:
        await store.enqueue_many([NewItem("Noop") for _ in range(items)])
        all_done = trio.Event()
        completed = Counter[str]()

        class Completions:
            def observe(self, event: str, kind: str, value: float | None = None) -> None:
                completed[event] += value is None
                if completed["complete"] == items:
                    all_done.set()

        worker = Worker(
            store, registry, Settings(concurrency=8), fail_stop=pytest.fail, metrics=Completions()
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(60):
                await all_done.wait()
            worker.stop()
    assert sorted(ran) == sorted(set(ran)) and len(ran) == items and set(ran.values()) == {1}
    assert calls["finish_and_claim"] > 0
    # Apart: a claim and a finish for each batch. Together: one call for most.
    assert calls["finish"] + calls["claim"] < calls["finish_and_claim"], calls
