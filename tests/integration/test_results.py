"""Results and durable steps end to end on real PostgreSQL (issue 34): Worker processes,
every client, the `wait` and `show` commands, a SIGKILL between a step's function and
its record, and two attempts of one item racing to record."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
import trio

from tests.integration.test_cli import trioworker
from tests.support.processes import kill_workers, observed, wait_for, workers
from tests.support.stores import RecoveryPassStore, opened
from trioworker import (
    AsyncClient,
    Client,
    Context,
    ItemNotSucceeded,
    Lost,
    Registry,
    Settings,
    Worker,
    WorkItem,
    open_store,
)

APP = "tests.apps.results:registry"
FAST = ["--lease", "4", "--heartbeat", "1", "--poll", "0.5", "--stop-grace", "1"]
Conn = psycopg.Connection[Any]


def status_of(pg: Conn, id: int) -> str | None:
    row = pg.execute("SELECT status FROM work_items WHERE id = %s", [id]).fetchone()
    return None if row is None else str(row[0])


def test_results_through_every_client_show_and_the_wait_command(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """A Worker process runs the items; Client, AsyncClient and the Trio store wait for
    each result; `show` prints it, `show --json` has "result"; `wait` prints it (exit
    0), names the status and error of a Failed item (exit 1), times out (exit 124),
    and refuses bad usage (exit 2)."""
    value = {"thumbnail": "/t/a.jpg", "size": [320, 240], "note": "ünïcode"}
    with Client(dsn) as client:
        ok = client.enqueue("Result", payload={"value": value}).id
        bare = client.enqueue("Result", payload={}).id
        bad = client.enqueue("Result", payload={"fail": "no such frame"}).id
        later = client.enqueue("Result", payload={"value": 1}, run_after=dt.timedelta(hours=1)).id
        with workers(tmp_path) as start:
            start(dsn, *FAST, name="w", app=APP)
            assert client.result(ok, timeout=30) == value
            assert client.result(bare, timeout=30) is None
            with pytest.raises(ItemNotSucceeded, match="Failed") as failed:
                client.result(bad, timeout=30)
            assert failed.value.status == "Failed"
            assert failed.value.error == "DoNotRetry: no such frame"

            async def through_asyncio() -> Any:
                async with AsyncClient(dsn) as aclient:
                    return await aclient.result(ok, timeout=30)

            assert asyncio.run(through_asyncio()) == value

            async def through_trio() -> Any:
                async with open_store(dsn) as store:
                    return await store.result(ok, timeout=30)

            assert trio.run(through_trio) == value
            with pytest.raises(TimeoutError):
                client.result(later, timeout=0.5)

    waited = trioworker("wait", str(ok), "--timeout", "30s", dsn=dsn)
    assert (waited.returncode, json.loads(waited.stdout)) == (0, value), waited.stderr
    assert trioworker("wait", str(bare), dsn=dsn).stdout == "null\n"
    failed_wait = trioworker("wait", str(bad), "--timeout", "30s", dsn=dsn)
    assert failed_wait.returncode == 1 and failed_wait.stdout == ""
    assert f"item {bad} ended Failed" in failed_wait.stderr
    assert "DoNotRetry: no such frame" in failed_wait.stderr
    started = time.monotonic()
    timed_out = trioworker("wait", str(later), "--timeout", "1s", dsn=dsn)
    assert timed_out.returncode == 124, timed_out.stderr
    assert f"item {later} had not ended after 1s" in timed_out.stderr
    assert time.monotonic() - started >= 1  # it waited (one that never gave up: 60 s, killed)
    assert trioworker("wait", "abc", dsn=dsn).returncode == 2
    assert trioworker("wait", str(ok), "--timeout", "30", dsn=dsn).returncode == 2
    assert trioworker("wait", "999999", "--timeout", "1s", dsn=dsn).returncode == 1

    shown = trioworker("show", str(ok), dsn=dsn, env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "result" in shown.stdout and '"/t/a.jpg"' in shown.stdout
    details = json.loads(trioworker("show", str(ok), "--json", dsn=dsn).stdout)
    assert details["result"] == value and details["item"]["result"] == value
    assert json.loads(trioworker("show", str(bad), "--json", dsn=dsn).stdout)["result"] is None


def test_sigkill_between_a_steps_function_and_its_record_runs_it_again_recorded_once(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """The step's function returns while the test holds the item's row, so its record
    waits; the Worker is SIGKILLed there. Lease recovery requeues the item and another
    Worker runs it: the function runs again (it was never recorded), its record is
    made once, by the second attempt, and the item succeeds."""
    gate = tmp_path / "gate"
    row = pg.execute(
        "INSERT INTO work_items (kind, payload) VALUES ('GatedStep', %s) RETURNING id",
        [json.dumps({"gate": str(gate)})],
    ).fetchone()
    assert row is not None
    id = row[0]
    with workers(tmp_path) as start, psycopg.connect(dsn) as holder:
        first = start(dsn, *FAST, name="first", app=APP)
        wait_for(lambda: [e for e in observed(tmp_path) if e["event"] == "fn-start"], 30,
                 "the step's function to start")  # fmt: skip
        holder.execute("SELECT 1 FROM work_items WHERE id = %s FOR UPDATE", [id])
        gate.touch()
        wait_for(lambda: [e for e in observed(tmp_path) if e["event"] == "fn-return"], 30,
                 "the step's function to return")  # fmt: skip
        # Its record waits for the row: a backend of the Worker's waits on a lock.
        wait_for(
            lambda: (
                pg.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND application_name <> ''"
                ).fetchone()
                == (1,)
            ),
            30,
            "the step's record to wait for the row",
        )
        kill_workers(first.proc)
        holder.rollback()
        assert pg.execute("SELECT count(*) FROM work_steps").fetchone() == (0,)
        start(dsn, *FAST, name="second", app=APP)
        wait_for(lambda: status_of(pg, id) == "Succeeded", 60, "the item to succeed")
    runs = [(e["event"], e["attempt"]) for e in observed(tmp_path)]
    assert runs == [("fn-start", 1), ("fn-return", 1), ("fn-start", 2), ("fn-return", 2)]
    steps = pg.execute("SELECT name, attempt, result FROM work_steps WHERE item_id = %s", [id])
    assert steps.fetchall() == [("scan", 2, 2)]
    result = pg.execute("SELECT result FROM work_items WHERE id = %s", [id]).fetchone()
    assert result == ({"step ran in attempt": 2},)


async def test_two_attempts_of_one_item_the_stale_ones_step_and_result_are_refused(
    dsn: str, pg: Conn
) -> None:
    """Attempt 1's lease runs out (its heartbeats are far apart) and lease recovery
    gives the item to attempt 2, on another Worker, while attempt 1's step function and
    another item's handler still run. Attempt 1's step record is refused (it stops as
    lost), and so is its result (fenced out); attempt 2 runs the step again, records it
    and stores its result."""
    gates = {1: trio.Event(), 2: trio.Event()}
    first_attempts: list[int] = []
    both_started = trio.Event()
    raised: list[BaseException] = []
    registry = Registry()

    @registry.handler("Racing")
    async def racing(item: WorkItem, ctx: Context) -> Any:
        if item.attempt == 1:
            first_attempts.append(item.id)
            if len(first_attempts) == 2:
                both_started.set()

        async def scan() -> int:
            await gates[item.attempt].wait()
            return item.attempt

        if item.payload == "step":
            try:
                return {"step": await ctx.step("scan", scan)}
            except Lost as exc:
                raised.append(exc)
                raise
        await gates[item.attempt].wait()
        return {"returned by attempt": item.attempt}

    slow = Settings(lease=60, heartbeat=25, poll=0.2, recovery_every=1000, stop_grace=1)
    async with (
        opened(RecoveryPassStore(dsn)) as first,
        open_store(dsn) as second,
        open_store(dsn) as admin,
    ):
        step_item = (await admin.enqueue("Racing", payload="step")).id
        result_item = (await admin.enqueue("Racing", payload="result")).id
        async with trio.open_nursery() as nursery:
            one = Worker(
                first,
                registry,
                attrs.evolve(slow, concurrency=2),
                worker_id="one",
                fail_stop=pytest.fail,
            )
            await nursery.start(one.run)
            with trio.fail_after(10):
                await both_started.wait()
                await first.first_pass.wait()  # or it may hold a row the test's recovery skips
            pg.execute(
                "UPDATE work_items SET lease_expires_at = now() - interval '1 second'"
                " WHERE id = ANY(%s)",
                [[step_item, result_item]],
            )
            recovered = await second.recover_expired_leases(max_stalls=3)
            assert {r.id for r in recovered} == {step_item, result_item}
            fast = Settings(lease=4, heartbeat=1, poll=0.2, stop_grace=1, concurrency=2)
            two = Worker(second, registry, fast, worker_id="two", fail_stop=pytest.fail)
            await nursery.start(two.run)
            gates[1].set()  # attempt 1's step and handler return now: both are refused
            gates[2].set()
            assert await second.result(step_item, timeout=20) == {"step": 2}
            assert await second.result(result_item, timeout=20) == {"returned by attempt": 2}
            nursery.cancel_scope.cancel()
    assert len(raised) == 1 and "no longer owns the item" in str(raised[0])
    rows = pg.execute("SELECT item_id, name, attempt, result FROM work_steps")
    assert rows.fetchall() == [(step_item, "scan", 2, 2)]
    states = pg.execute("SELECT id, status, attempt FROM work_items ORDER BY id")
    assert states.fetchall() == [(step_item, "Succeeded", 2), (result_item, "Succeeded", 2)]


def test_the_schema_bounds_a_result_and_a_steps_value_as_a_payload(pg: Conn) -> None:
    """Plain SQL (even the owner's) cannot store a result or a step's value nested
    deeper than 64 or over 128 KiB: refused by the bound's name, as a CHECK would be (64
    empty lists, a payload's bound, are stored)."""
    id = pg.execute("INSERT INTO work_items (kind) VALUES ('K') RETURNING id").fetchone()[0]  # type: ignore[index]
    deep = "[" * 65 + "]" * 65
    big = json.dumps("x" * 131_072)
    for value, bound in [(deep, "work_items_result_bounded"), (big, "work_items_result_bounded")]:
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            pg.execute("UPDATE work_items SET result = %s::jsonb WHERE id = %s", [value, id])
        assert refused.value.diag.constraint_name == bound
    for value, bound in [(deep, "work_steps_result_depth"), (big, "work_steps_result_fits")]:
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            pg.execute(
                "INSERT INTO work_steps (item_id, name, attempt, result) VALUES (%s, 'n', 1, %s)",
                [id, value],
            )
        assert refused.value.diag.constraint_name == bound
    pg.execute("UPDATE work_items SET result = %s::jsonb WHERE id = %s", ["[" * 64 + "]" * 64, id])
