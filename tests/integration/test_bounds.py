"""The schema refuses what a Worker cannot run (issue 32), on real PostgreSQL.

Every time and counter that a claim, lease recovery, `show`, `status` or the dashboard
relies on is bounded (migrations/0001.queue.sql): plain SQL that would store a value
out of bounds is refused by the bound's name; the queue's own transitions carry a
counter past its bound one at a time, so a row at the bound stops nothing; a row that
slips past the schema anyway (a superuser's, with the triggers off) fails only its own
item, and `show` and the dashboard's item page show it.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.browser.support import dashboards, request
from tests.integration.test_cli import trioworker
from trioworker import (
    Registry,
    Settings,
    Status,
    Worker,
    WorkItem,
    open_store,
)

Conn = psycopg.Connection[Any]

#: The most plain SQL may set a counter to; the queue's transitions go past it by ones.
BOUND = 1_000_000_000
MAX_INT = 2**31 - 1
LOW = dt.datetime(1900, 1, 1, tzinfo=dt.UTC)
HIGH = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)
#: Times PostgreSQL holds that Python's datetime cannot (the last, once a time zone
#: east of UTC is applied), as the issue's red-team rows stored them.
UNREADABLE = [
    "infinity", "-infinity", "0044-03-15 00:00:00+00 BC", "10000-01-01 00:00:00+00",
    "9999-12-31 23:00:00+00",
]  # fmt: skip
#: work_items' times, each with the bound that holds it.
ITEM_TIMES = {
    "requested_at": "work_items_asked_times_in_range",
    "run_after": "work_items_asked_times_in_range",
    "lease_expires_at": "work_items_attempt_times_in_range",
    "heartbeat_at": "work_items_attempt_times_in_range",
    "started_at": "work_items_attempt_times_in_range",
    "finished_at": "work_items_attempt_times_in_range",
    "completed_at": "work_items_attempt_times_in_range",
}
#: Only a Running row may hold a lease or a noted success (other constraints).
RUNNING_ONLY = {"lease_expires_at", "completed_at"}
ONE_TRANSACTION = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def one(pg: Conn, query: str, params: Any = None) -> Any:
    row = pg.execute(query, params).fetchone()  # type: ignore[call-overload]
    assert row is not None
    return row[0] if len(row) == 1 else row


def insert_item(pg: Conn, running: bool = False, **columns: Any) -> int:
    """An unscoped Quick item with `columns` set; Running (with a lease an hour long,
    unless given) when asked."""
    values: dict[str, Any] = {"kind": "Quick"}
    if running:
        values |= {"status": "Running", "lease_expires_at": dt.datetime.now(dt.UTC)
                   + dt.timedelta(hours=1), "attempt": 1}  # fmt: skip
    values |= columns
    names = ", ".join(values)
    marks = ", ".join(["%s"] * len(values))
    return int(one(pg, f"INSERT INTO work_items ({names}) VALUES ({marks}) RETURNING id",
                   list(values.values())))  # fmt: skip


def refused_by(exc: pytest.ExceptionInfo[psycopg.errors.CheckViolation]) -> str | None:
    return exc.value.diag.constraint_name


@contextmanager
def rolled_back(pg: Conn) -> Iterator[None]:
    """One hypothesis example's writes, undone after it."""
    with pg.transaction(force_rollback=True):
        yield


def without_triggers(pg: Conn, query: str, params: Any = None) -> int:
    """Run an INSERT ... RETURNING id as a superuser past the queue's triggers
    (`session_replication_role = replica`): how a row out of bounds still gets in."""
    pg.execute("SET session_replication_role = replica")
    try:
        return int(one(pg, query, params))
    finally:
        pg.execute("RESET session_replication_role")


# -- counters ---------------------------------------------------------------------------


@pytest.mark.parametrize(("column", "running"), [("attempt", False), ("stalls", True),
                                                 ("failures", False)])  # fmt: skip
def test_plain_sql_cannot_store_a_counter_the_queue_cannot_add_to(
    pg: Conn, column: str, running: bool
) -> None:
    """The issue's rows: attempt 2147483647 (every claim of its kind failed on attempt +
    1), stalls 2147483647 on a Running row (every lease recovery failed on stalls + 1),
    failures the same: refused, by INSERT and by UPDATE, by the bound's name."""
    with pytest.raises(psycopg.errors.CheckViolation) as caught:
        insert_item(pg, running, **{column: MAX_INT})
    assert refused_by(caught) == "work_items_counters_bounded"
    item = insert_item(pg, running)
    with pytest.raises(psycopg.errors.CheckViolation) as caught:
        pg.execute(f"UPDATE work_items SET {column} = %s WHERE id = %s", [MAX_INT, item])
    assert refused_by(caught) == "work_items_counters_bounded"
    assert one(pg, f"SELECT {column} FROM work_items WHERE id = %s", [item]) == 0


@ONE_TRANSACTION
@given(column=st.sampled_from(["attempt", "stalls", "failures"]), value=st.integers(0, MAX_INT))
@example(column="attempt", value=BOUND)
@example(column="attempt", value=BOUND + 1)
@example(column="stalls", value=BOUND + 1)
@example(column="failures", value=MAX_INT)
def test_a_counter_is_set_to_at_most_the_bound(pg: Conn, column: str, value: int) -> None:
    """Any value up to 1,000,000,000 is taken, by INSERT and by UPDATE; any above it is
    refused by work_items_counters_bounded."""
    for write in ("insert", "update"):
        with rolled_back(pg):
            try:
                if write == "insert":
                    insert_item(pg, **{column: value})
                else:
                    item = insert_item(pg)
                    pg.execute(f"UPDATE work_items SET {column} = %s WHERE id = %s", [value, item])
            except psycopg.errors.CheckViolation as exc:
                assert (write, value > BOUND) == (write, True), exc
                assert exc.diag.constraint_name == "work_items_counters_bounded"
            else:
                assert (write, value > BOUND) == (write, False)


async def test_past_the_bound_a_counter_moves_one_at_a_time_as_the_queue_moves_it(
    dsn: str, pg: Conn
) -> None:
    """Items at the bound stop nothing: a claim takes them with the rest of its batch
    (attempt + 1), a failure counts (failures + 1), a release and a second claim go on
    (attempt + 2), lease recovery stalls one (stalls + 1). Past the bound plain SQL may
    move a counter by one too, but not jump it."""
    at_bound = insert_item(pg, attempt=BOUND, failures=BOUND)
    stalled = insert_item(pg, stalls=BOUND)
    others = [insert_item(pg) for _ in range(3)]
    async with open_store(dsn) as store:
        batch = await store.claim_batch("w1", 60, 10, kinds=["Quick"])
        by_id = {item.id: item for item in batch}
        assert sorted(by_id) == sorted([at_bound, stalled, *others])
        assert by_id[at_bound].attempt == BOUND + 1
        assert await store.release(at_bound, BOUND + 1)
        [again] = await store.claim_batch("w1", 60, 1, kinds=["Quick"])
        assert (again.id, again.attempt) == (at_bound, BOUND + 2)
        assert await store.fail(at_bound, BOUND + 2, "gave up")
        pg.execute("UPDATE work_items SET lease_expires_at = now() - interval '1 s'"
                   " WHERE id = %s", [stalled])  # fmt: skip
        [recovered] = await store.recover_expired_leases(max_stalls=MAX_INT)
        assert (recovered.id, recovered.stalls, recovered.status) == (
            stalled, BOUND + 1, Status.QUEUED,
        )  # fmt: skip
    row = one(pg, "SELECT attempt, failures, status FROM work_items WHERE id = %s", [at_bound])
    assert row == (BOUND + 2, BOUND + 1, "Failed")
    with pytest.raises(psycopg.errors.CheckViolation) as caught:
        pg.execute("UPDATE work_items SET attempt = attempt + 2 WHERE id = %s", [at_bound])
    assert refused_by(caught) == "work_items_counters_bounded"
    pg.execute("UPDATE work_items SET attempt = attempt + 1 WHERE id = %s", [at_bound])
    pg.execute("UPDATE work_items SET attempt = %s WHERE id = %s", [BOUND, at_bound])


# -- times ------------------------------------------------------------------------------


@pytest.mark.parametrize("column", ["requested_at", "run_after"])
def test_plain_sql_cannot_store_a_time_python_cannot_hold(pg: Conn, column: str) -> None:
    """The issue's rows: requested_at 'infinity' (the claim committed its batch Running,
    then could not read it), '-infinity', a BC date, the year 10000, and a time that
    becomes the year 10000 east of UTC; run_after the same. Refused by INSERT and by
    UPDATE, by the bound's name."""
    item = insert_item(pg)
    for value in UNREADABLE:
        with pytest.raises(psycopg.errors.CheckViolation) as caught:
            insert_item(pg, **{column: value})
        assert refused_by(caught) == "work_items_asked_times_in_range", value
        with pytest.raises(psycopg.errors.CheckViolation) as caught:
            pg.execute(f"UPDATE work_items SET {column} = %s WHERE id = %s", [value, item])
        assert refused_by(caught) == "work_items_asked_times_in_range", value


@ONE_TRANSACTION
@given(
    column=st.sampled_from(sorted(ITEM_TIMES)),
    when=st.datetimes(dt.datetime(1800, 1, 1), dt.datetime(9999, 12, 30), timezones=st.just(dt.UTC))
    | st.sampled_from(UNREADABLE),
)
@example(column="requested_at", when=LOW)
@example(column="requested_at", when=LOW - dt.timedelta(microseconds=1))
@example(column="run_after", when=HIGH)
@example(column="run_after", when=HIGH + dt.timedelta(microseconds=1))
@example(column="lease_expires_at", when=HIGH + dt.timedelta(microseconds=1))
@example(column="heartbeat_at", when=LOW - dt.timedelta(microseconds=1))
@example(column="completed_at", when="infinity")
@example(column="finished_at", when="-infinity")
def test_an_items_time_is_finite_from_1900_to_9000(
    pg: Conn, column: str, when: dt.datetime | str
) -> None:
    """Each of an item's times is taken from 1900-01-01 to 9000-01-01 (UTC), both
    included, by INSERT and by UPDATE; anything else (a microsecond outside, an
    infinity, a BC date, the year 10000) is refused by the bound that holds it."""
    inside = isinstance(when, dt.datetime) and LOW <= when <= HIGH
    running = column in RUNNING_ONLY
    for write in ("insert", "update"):
        with rolled_back(pg):
            try:
                if write == "insert":
                    insert_item(pg, running, **{column: when})
                else:
                    item = insert_item(pg, running)
                    pg.execute(f"UPDATE work_items SET {column} = %s WHERE id = %s", [when, item])
            except psycopg.errors.CheckViolation as exc:
                assert not inside, (write, exc)
                assert exc.diag.constraint_name == ITEM_TIMES[column]
            else:
                assert inside, write


#: For each other table something decodes: what to set up, a statement that stores
#: `v` where a time goes (or a number SQL makes an interval of), the bound that holds
#: it, values it refuses and one it takes. '-infinity' is a rate slot's and a failover
#: guard's sentinel ("never used", "holds nothing"), which only SQL reads: they keep it.
NUMBERS = [float("nan"), float("inf"), 604801.0]
OTHER_TABLES: dict[str, tuple[str | None, str, str, list[Any], Any]] = {
    "work_attempts": (
        "INSERT INTO work_items (kind) VALUES ('Quick')",
        "INSERT INTO work_attempts (item_id, attempt, outcome, ended_at)"
        " SELECT id, 1, 'failed', %(v)s FROM work_items",
        "work_attempts_times_in_range", UNREADABLE, "now",
    ),
    "work_workers": (
        None,
        "INSERT INTO work_workers (id, host, pid, kinds, unscoped, concurrency, last_seen)"
        " VALUES ('w', 'h', 1, '{Quick}', true, 1, %(v)s)",
        "work_workers_times_in_range", UNREADABLE, "now",
    ),
    "work_workers.advertise_every": (
        None,
        "INSERT INTO work_workers (id, host, pid, kinds, unscoped, concurrency, advertise_every)"
        " VALUES ('w', 'h', 1, '{Quick}', true, 1, %(v)s)",
        "work_workers_advertise_every_sane", NUMBERS, 10.0,
    ),
    "work_schedules": (
        None,
        "INSERT INTO work_schedules (name, kind, spec, next_due)"
        " VALUES ('s', 'Quick', 'every 60', %(v)s)",
        "work_schedules_times_in_range", UNREADABLE, "now",
    ),
    "work_pauses": (
        None, "INSERT INTO work_pauses (kind, paused_at) VALUES ('Quick', %(v)s)",
        "work_pauses_times_in_range", UNREADABLE, "now",
    ),
    "work_limits": (
        None, "INSERT INTO work_limits (kind, running, updated_at) VALUES ('Quick', 1, %(v)s)",
        "work_limits_times_in_range", UNREADABLE, "now",
    ),
    "work_unsettled_scopes": (
        None, "INSERT INTO work_unsettled_scopes (scope, noted_at) VALUES ('s', %(v)s)",
        "work_unsettled_scopes_times_in_range", UNREADABLE, "now",
    ),
    "work_rate_slots": (
        "SELECT work_set_limit_v1('Quick', NULL, NULL, 5, 60)",
        "UPDATE work_rate_slots SET started_at = %(v)s",
        "work_rate_slots_times_in_range", UNREADABLE[:1] + UNREADABLE[2:], "-infinity",
    ),
    "work_failover_guard": (
        None,
        "INSERT INTO work_failover_guard (timeline, held_until) VALUES (1, %(v)s)"
        " ON CONFLICT (singleton) DO UPDATE SET held_until = excluded.held_until",
        "work_failover_guard_times_in_range", UNREADABLE[:1] + UNREADABLE[2:], "-infinity",
    ),
    "work_failover_guard.lease": (
        None,
        "INSERT INTO work_failover_guard (timeline, lease) VALUES (1, %(v)s)"
        " ON CONFLICT (singleton) DO UPDATE SET lease = excluded.lease",
        "work_failover_guard_lease_sane", NUMBERS, 60.0,
    ),
}  # fmt: skip


@pytest.mark.parametrize("table", sorted(OTHER_TABLES))
def test_the_other_tables_refuse_what_a_reader_cannot_decode(pg: Conn, table: str) -> None:
    """Attempt history, Workers, schedules, pauses, limits, rate slots, unsettled scopes
    and the failover guard (what `show`, `status`, the dashboard and the claim read)
    refuse a time Python cannot hold, and a NaN, an Infinity or more than a week where
    SQL makes an interval of a number of seconds, by the bound's name; an ordinary value
    is taken."""
    setup, statement, bound, bad, good = OTHER_TABLES[table]
    if setup is not None:
        pg.execute(setup)  # type: ignore[arg-type]
    for value in bad:
        with pytest.raises(psycopg.errors.CheckViolation) as caught:
            pg.execute(statement, {"v": value})  # type: ignore[arg-type]
        assert refused_by(caught) == bound, value
    pg.execute(statement, {"v": good})  # type: ignore[arg-type]


# -- a row past the schema ---------------------------------------------------------------


async def test_a_claimed_row_whose_time_python_cannot_hold_is_read_with_its_batch(
    dsn: str, pg: Conn
) -> None:
    """A row stored past the schema with requested_at 'infinity' is claimed with three
    others, and the batch is read: that item names requested_at as undecodable (its
    field None), the others come whole."""
    poison = without_triggers(
        pg, "INSERT INTO work_items (kind, requested_at) VALUES ('Quick', 'infinity') RETURNING id"
    )
    others = [insert_item(pg) for _ in range(3)]
    async with open_store(dsn) as store:
        batch = await store.claim_batch("w1", 60, 10, kinds=["Quick"])
    by_id = {item.id: item for item in batch}
    assert sorted(by_id) == sorted([poison, *others])
    assert by_id[poison].undecodable == (
        ("requested_at", "cannot be decoded: timestamp too large (after year 10K): 'infinity'"),
    )
    assert by_id[poison].requested_at is None
    assert all(by_id[i].undecodable == () and by_id[i].requested_at for i in others)


async def test_a_row_the_worker_cannot_decode_fails_alone_and_its_batch_runs(
    dsn: str, pg: Conn
) -> None:
    """Two rows stored past the schema (requested_at 'infinity', and a BC date) and
    three ordinary ones, claimed in one batch: the two end Failed at once, through the
    Worker's one write, with an error naming requested_at and why; the other three run
    and succeed; the Worker goes on."""
    poison = [
        without_triggers(pg, "INSERT INTO work_items (kind, requested_at) VALUES ('Quick', %s)"
                             " RETURNING id", [when])
        for when in ("infinity", "0044-03-15 00:00:00+00 BC")
    ]  # fmt: skip
    others = [insert_item(pg) for _ in range(3)]
    registry = Registry()
    ran: list[int] = []

    @registry.handler("Quick")
    async def quick(item: WorkItem, ctx: Any) -> None:
        ran.append(item.id)

    settings = Settings(lease=4, heartbeat=1, poll=0.2, stop_grace=1, recovery_every=0.5,
                        concurrency=8)  # fmt: skip
    async with open_store(dsn) as store, trio.open_nursery() as nursery:
        worker = Worker(store, registry, settings, worker_id="w1", fail_stop=print)
        await nursery.start(worker.run)
        with trio.fail_after(30):
            while True:  # read by plain SQL: the store could not read the poison rows before
                finished = one(pg, "SELECT count(*) FROM work_items WHERE id = ANY(%s)"
                               " AND status IN ('Succeeded', 'Failed', 'Cancelled')",
                               [[*poison, *others]])  # fmt: skip
                if finished == 5:
                    break
                await trio.sleep(0.1)
        worker.stop()
    rows = {r[0]: r[1:] for r in pg.execute(
        "SELECT id, status, reason, error, started_at, stalls FROM work_items WHERE id = ANY(%s)",
        [[*poison, *others]])}  # fmt: skip
    assert sorted(ran) == sorted(others)
    assert {rows[i][0] for i in others} == {"Succeeded"}
    infinity, bc = rows[poison[0]], rows[poison[1]]
    assert infinity[0:2] == ("Failed", "requested_at cannot be decoded")
    assert infinity[2] == ("UndecodableValue: requested_at cannot be decoded: timestamp too"
                           " large (after year 10K): 'infinity'")  # fmt: skip
    assert bc[0:2] == ("Failed", "requested_at cannot be decoded")
    assert (infinity[4], bc[4]) == (0, 0), "failed at once, not stalled"
    assert bc[2].startswith("UndecodableValue: requested_at cannot be decoded: timestamp too"
                            " small (before year 1): '0044-03-15")  # fmt: skip
    assert len({rows[i][3] for i in [*poison, *others]}) == 1, "claimed in one batch"


def stored_past_the_schema(pg: Conn) -> int:
    """A Failed item whose requested_at is 'infinity', run_after '-infinity' and
    finished_at in the year 10000, with one attempt that ended at 'infinity' (its
    table's CHECK dropped for it, as only an owner can): its id."""
    item = without_triggers(
        pg,
        "INSERT INTO work_items (kind, status, attempt, failures, requested_at, run_after,"
        " finished_at, reason) VALUES ('Quick', 'Failed', 1, 1, 'infinity', '-infinity',"
        " '10000-01-01 00:00:00+00', 'broken') RETURNING id",
    )
    pg.execute("ALTER TABLE work_attempts DROP CONSTRAINT IF EXISTS work_attempts_times_in_range")
    pg.execute(
        "INSERT INTO work_attempts (item_id, attempt, started_at, ended_at, outcome)"
        " VALUES (%s, 1, '0044-03-15 00:00:00+00 BC', 'infinity', 'failed')",
        [item],
    )
    return item


def test_show_shows_a_row_with_times_python_cannot_hold(dsn: str, pg: Conn) -> None:
    """`show ID` of such an item answers (exit 0), each such time as its stored text
    and why; `show --json` gives each as {"undecodable": why, "text": the stored text}."""
    item = stored_past_the_schema(pg)
    # Wide, as on a wide terminal: at 80 columns (pytest-xdist's workers have COLUMNS=80)
    # rich wraps the attempts' times across lines.
    shown = trioworker("show", str(item), dsn=dsn, env={"COLUMNS": "300"})
    assert shown.returncode == 0, shown.stderr
    assert "infinity (cannot be decoded: timestamp too large" in shown.stdout
    assert "-infinity (cannot be decoded: timestamp too small" in shown.stdout
    assert "0044-03-15 00:00:00+00 BC (cannot be decoded" in shown.stdout
    as_json = trioworker("show", str(item), "--json", dsn=dsn)
    assert as_json.returncode == 0, as_json.stderr
    details = json.loads(as_json.stdout)
    assert details["item"]["requested_at"] == {
        "undecodable": "cannot be decoded: timestamp too large (after year 10K): 'infinity'",
        "text": "infinity",
    }
    assert details["item"]["finished_at"]["text"] == "10000-01-01 00:00:00+00"
    assert details["attempts"][0]["ended_at"]["text"] == "infinity"
    assert details["item"]["status"] == "Failed"


def test_the_dashboards_item_page_shows_a_row_with_times_python_cannot_hold(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """The dashboard's page of such an item answers 200 with each such time as its
    stored text and why, where it answered that the database did not."""
    item = stored_past_the_schema(pg)
    with dashboards(tmp_path) as start:
        board = start(dsn)
        answer = request(f"{board.url}/items/{item}")
    assert answer.status == 200, answer.body[-2000:]
    for text in (
        "infinity (cannot be decoded: timestamp too large",
        "-infinity (cannot be",
        "10000-01-01 00:00:00+00 (cannot be",
        "0044-03-15 00:00:00+00 BC (cannot be",
    ):
        assert text in answer.body, text  # fmt: skip
