"""Scheduling and operating, as operators meet them: Worker processes, the CLI, and
PostgreSQL, in real time (lease 4 s, heartbeat 1 s, stop grace 1 s)."""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import trio
import trio_asyncio

from tests.integration.test_cli import trioworker
from tests.support.populate import insert_finished
from tests.support.processes import observed, wait_for, workers
from trioworker import NewItem, Status, open_store

FAST = ["--lease", "4", "--heartbeat", "1", "--poll", "1", "--stop-grace", "1"]
APP = "tests.apps.operating:registry"
Conn = psycopg.Connection[Any]


class RolledBack(Exception):
    pass


def ticks(pg: Conn) -> list[dt.datetime]:
    rows = pg.execute(
        "SELECT run_after FROM work_items WHERE kind = 'Tick' ORDER BY run_after"
    ).fetchall()
    return [row[0] for row in rows]


def gaps(due: list[dt.datetime]) -> list[float]:
    return [round((b - a).total_seconds(), 3) for a, b in itertools.pairwise(due)]


def ticks_done(pg: Conn, since: dt.datetime | None = None) -> int:
    """How many Ticks have Succeeded (of those enqueued after `since`)."""
    (count,) = pg.execute(
        "SELECT count(*) FROM work_items WHERE kind = 'Tick' AND status = 'Succeeded'"
        " AND (%(since)s::timestamptz IS NULL OR requested_at > %(since)s)",
        {"since": since},
    ).fetchone() or (0,)
    return int(count)


def more_ticks(pg: Conn, n: int, what: str) -> None:
    """Wait until `n` more Ticks have Succeeded: the schedule goes on."""
    done = ticks_done(pg)
    wait_for(lambda: ticks_done(pg) >= done + n, 30, what)


def blocked_here(pg: Conn) -> int:
    """How many statements of this database wait on a lock another session of it holds
    (waits on other databases' sessions, which share some locks, are not counted)."""
    (count,) = pg.execute(
        "SELECT count(*) FROM pg_stat_activity AS w"
        " WHERE w.datname = current_database() AND w.pid <> pg_backend_pid()"
        " AND EXISTS (SELECT FROM pg_stat_activity AS b"
        "             WHERE b.pid = ANY(pg_blocking_pids(w.pid))"
        "               AND b.datname = current_database())"
    ).fetchone() or (0,)
    return int(count)


def db_now(pg: Conn) -> dt.datetime:
    (now,) = pg.execute("SELECT now()").fetchone() or ()
    return now  # type: ignore[no-any-return]


def test_three_workers_enqueue_each_due_time_once_and_one_catch_up_after_a_pause(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """Three Worker processes carry `every=1`: each due time is enqueued once, when it
    is the latest due, also while one is killed and restarted; after all three are
    stopped for 5 s (by the database's clock), one catch-up item, not five. Each wait is
    for what the database shows, so a slow machine makes it slower, not wrong."""
    with workers(tmp_path) as start:
        procs = [start(dsn, *FAST, name=f"w{n}", app=APP) for n in range(3)]
        wait_for(lambda: ticks(pg), 30, "the first Tick")
        more_ticks(pg, 3, "three Ticks")
        procs[1].signal(signal.SIGKILL)
        procs[1].wait(10)
        more_ticks(pg, 2, "two Ticks without w1")
        procs[1] = start(dsn, *FAST, name="w1-again", app=APP)
        wait_for(lambda: "ready" in procs[1].output(), 30, "w1 ready again")
        more_ticks(pg, 2, "two Ticks with w1 back")
        for proc in procs:
            proc.pause()  # the supervisor and its Worker
        stopped_at = db_now(pg)
        wait_for(lambda: db_now(pg) >= stopped_at + dt.timedelta(seconds=5), 30, "5 s stopped")
        resumed_at = db_now(pg)
        for proc in procs:
            proc.resume()
        wait_for(lambda: ticks_done(pg, since=resumed_at), 30, "a Tick after the resume")
        for proc in procs:
            proc.signal(signal.SIGTERM)
        for proc in procs:
            assert proc.wait(30) == 0, proc.output()

    due = ticks(pg)
    assert len(set(due)) == len(due)  # no due time twice
    # Each Tick was enqueued for the latest due time when it was fired (in the transaction
    # that read the database's now()), never for one it had missed earlier.
    late = pg.execute(
        "SELECT run_after, requested_at FROM work_items WHERE kind = 'Tick'"
        " AND NOT (run_after <= requested_at AND requested_at < run_after + interval '1 s')"
    ).fetchall()
    assert late == []
    # On the schedule's grid, one a second while some Worker ran: a second is skipped
    # only if every Worker was a whole second late to fire it.
    spaced = gaps(due)
    assert all(g == int(g) >= 1 for g in spaced), spaced
    before = gaps([d for d in due if d <= stopped_at])
    assert before.count(1.0) > len(before) / 2, before
    # Of the due times that passed while all were stopped, at most one has an item: the
    # latest, enqueued after the resume; the wait spans the stop.
    missed = [d for d in due if stopped_at < d <= resumed_at]
    assert len(missed) <= 1, (missed, stopped_at, resumed_at)
    catch_up = next(d for d in due if d > stopped_at)
    (enqueued_at,) = (
        pg.execute(
            "SELECT requested_at FROM work_items WHERE kind = 'Tick' AND run_after = %s", [catch_up]
        ).fetchone()
        or ()
    )
    assert enqueued_at >= resumed_at
    last_before = max(d for d in due if d <= stopped_at)
    assert (catch_up - last_before).total_seconds() >= 4.0, (last_before, catch_up)
    # Each attempt ran once. An item runs again only if it was in flight when its Worker
    # was killed or stopped past its lease: recovery counted a stall for each re-run.
    starts = [(e["id"], e["attempt"]) for e in observed(tmp_path) if e["event"] == "start"]
    assert len(set(starts)) == len(starts), starts
    started = Counter(item_id for item_id, _ in starts)
    stalls = dict(pg.execute("SELECT id, stalls FROM work_items WHERE kind = 'Tick'").fetchall())
    for item_id, runs in started.items():
        assert runs - 1 <= stalls[item_id], (item_id, runs, stalls[item_id])
    assert sum(runs - 1 for runs in started.values()) <= 2  # two outages
    statuses = pg.execute("SELECT status, count(*) FROM work_items GROUP BY status").fetchall()
    assert dict(statuses).get("Succeeded", 0) == len(started) >= len(due) - 1
    status = trioworker("status", dsn=dsn)
    assert "Tick" in status.stdout and "every 1s" in status.stdout, status.stdout


def test_ten_thousand_items_in_one_transaction(dsn: str, pg: Conn) -> None:
    """enqueue_many in the caller's transaction: all 10,000 or, rolled back, none."""
    items = [NewItem("Bulk", scope=f"s{n % 50}", payload={"n": n}) for n in range(10_000)]

    async def main() -> tuple[float, int]:
        async with open_store(dsn, call_timeout=60) as store:
            with contextlib.suppress(RolledBack):
                async with store.transaction() as tx:
                    await store.enqueue_many(items[:10], tx=tx)
                    raise RolledBack
            began = time.monotonic()
            async with store.transaction() as tx:
                enqueued = await store.enqueue_many(items, tx=tx)
            return time.monotonic() - began, len({e.id for e in enqueued})

    took, distinct = trio_asyncio.run(main)
    print(f"enqueue_many: 10,000 items in one transaction in {took:.2f}s")
    assert distinct == 10_000
    (count,) = pg.execute("SELECT count(*) FROM work_items").fetchone() or ()
    assert count == 10_000
    heads = pg.execute("SELECT count(*) FROM work_items WHERE is_head").fetchone()
    assert heads == (50,)  # one head per scope line: the batch settled its lines


def test_enqueue_from_a_file_is_all_or_nothing_and_names_the_bad_line(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    lines = [json.dumps({"kind": "Crawl", "scope": "7", "payload": {"n": n}}) for n in range(5)]
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join([*lines[:3], '{"kind": "Crawl", "delay": -1}', *lines[3:]]) + "\n")
    bad = trioworker("enqueue", "--from", str(path), dsn=dsn)
    assert bad.returncode == 2 and "line 4" in bad.stderr, bad.stderr
    assert pg.execute("SELECT count(*) FROM work_items").fetchone() == (0,)
    path.write_text("\n".join(lines) + "\n")
    good = trioworker("enqueue", "--from", str(path), dsn=dsn)
    assert good.returncode == 0, good.stderr
    assert len(good.stdout.split()) == 5
    assert pg.execute("SELECT count(*) FROM work_items").fetchone() == (5,)


def test_retry_and_prune_on_a_populated_database(dsn: str, pg: Conn) -> None:
    """retry --failed --kind brings failed items back with a fresh budget; prune deletes
    old finished rows only."""
    insert_finished(pg, 2_000, status="Succeeded", days_ago=10)
    insert_finished(pg, 300, status="Failed", days_ago=10, kind="Crawl")
    insert_finished(pg, 200, status="Failed", days_ago=1, kind="Purge")
    pg.execute(
        "INSERT INTO work_items (kind, scope)"
        " SELECT 'Crawl', 's' || n FROM generate_series(1, 100) AS n"
    )
    retried = trioworker("retry", "--failed", "--kind", "Purge", dsn=dsn)
    assert retried.returncode == 0 and retried.stdout.startswith("retried 200 item(s)"), retried
    back = pg.execute(
        "SELECT count(*), max(failures), min(attempt) FROM work_items"
        " WHERE kind = 'Purge' AND status = 'Queued'"
    ).fetchone()
    assert back == (200, 0, 2)  # a fresh budget; the count goes on, the retry noted as one
    pruned = trioworker("prune", "--older-than", "7d", "--batch", "500", dsn=dsn)
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.startswith("deleted 2300 Succeeded/Failed/Cancelled item(s)"), pruned
    left = dict(pg.execute("SELECT status, count(*) FROM work_items GROUP BY status").fetchall())
    assert left == {"Queued": 300}


def test_prune_holds_no_lock_for_long_and_leaves_queued_and_running_alone(
    dsn: str, pg: Conn
) -> None:
    """200,000 old finished rows, pruned in batches of 1,000 while a Worker-like prober
    enqueues, claims and completes: each batch is one statement of at most 1,000 rows,
    the prober goes on between them and never waits on a lock, and Queued and Running
    rows stay."""
    insert_finished(pg, 200_000, status="Succeeded", days_ago=30)
    pg.execute("INSERT INTO work_items (kind) SELECT 'Keep' FROM generate_series(1, 50)")
    pg.execute("ANALYZE work_items")

    async def main() -> tuple[int, list[int], list[str], int]:
        batches: list[int] = []  # the rows each batch deleted
        ended: list[str] = []  # "batch" and "probe", in the order they ended
        lock_waits = 0  # looks that found a statement waiting on another's lock
        async with open_store(dsn, call_timeout=30) as store:
            running = await store.claim("prober", 60, kinds=["Keep"])
            assert running is not None

            async def probe(cancel_scope: trio.CancelScope) -> None:
                while not cancel_scope.cancel_called:
                    item = await store.enqueue("Probe", scope="p")
                    claimed = await store.claim("prober", 60, kinds=["Probe"])
                    assert claimed is not None and claimed.id == item.id
                    assert await store.complete(claimed.id, claimed.attempt)
                    ended.append("probe")

            async def watch(cancel_scope: trio.CancelScope) -> None:
                nonlocal lock_waits
                while not cancel_scope.cancel_called:
                    lock_waits += await trio.to_thread.run_sync(blocked_here, pg)
                    await trio.sleep(0.01)

            def on_batch(rows: int, seconds: float) -> None:
                batches.append(rows)
                ended.append("batch")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(probe, nursery.cancel_scope)
                nursery.start_soon(watch, nursery.cancel_scope)
                deleted = await store.delete_finished(
                    dt.timedelta(days=7), batch=1000, on_batch=on_batch
                )
                nursery.cancel_scope.cancel()
        return deleted, batches, ended, lock_waits

    deleted, batches, ended, lock_waits = trio_asyncio.run(main)
    probes = ended.count("probe")
    print(f"prune: {deleted} rows in {len(batches)} batches; prober rounds {probes}")
    assert deleted == 200_000
    # Each batch its own statement of at most 1,000 rows: no lock held for longer.
    assert len(batches) >= 200 and max(batches) <= 1000, batches
    # The prober went on while the prune did, and none of its statements ever waited on
    # a lock the prune held (nor the prune on one of the prober's).
    first, last = ended.index("batch"), len(ended) - 1 - ended[::-1].index("batch")
    assert "probe" in ended[first:last], "the prober made no round during the prune"
    assert lock_waits == 0
    kept = pg.execute(
        "SELECT status, count(*) FROM work_items WHERE kind = 'Keep' GROUP BY status"
    ).fetchall()
    assert dict(kept) == {"Queued": 49, "Running": 1}
    # The prober's own, finished just now (its last round may be cut off after its write).
    (probed,) = (
        pg.execute(
            "SELECT count(*) FROM work_items WHERE kind = 'Probe' AND status = 'Succeeded'"
        ).fetchone()
        or ()
    )
    assert probed - probes in (0, 1)


def test_a_paused_scope_waits_while_others_run_and_resume_releases_it(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """disk-a paused: its items, enqueued first, wait while disk-b's run; resumed, they
    run too."""
    assert trioworker("pause", "--scope", "disk-a", dsn=dsn).returncode == 0
    for scope in ("disk-a", "disk-b"):
        for _ in range(3):
            trioworker(
                "enqueue", "Hold", "--scope", scope, "--payload", '{"seconds": 0.05}', dsn=dsn
            )
    status = trioworker("status", dsn=dsn)
    assert "Paused (not claimed; running items go on): scope disk-a" in status.stdout

    def finished(scope: str) -> int:
        row = pg.execute(
            "SELECT count(*) FROM work_items WHERE scope = %s AND status = 'Succeeded'", [scope]
        ).fetchone()
        return int(row[0]) if row else 0

    with workers(tmp_path) as start:
        start(dsn, *FAST, name="w0", app=APP)
        wait_for(lambda: finished("disk-b") == 3, 30, "disk-b's items")
        # Passed over, not merely not yet seen: every claim that took one of disk-b's
        # items (one at a time: concurrency 1) had disk-a's, enqueued before them and so
        # first in claim order, due and Queued.
        never_run = pg.execute(
            "SELECT count(*) FROM work_items WHERE scope = 'disk-a' AND attempt = 0"
        ).fetchone()
        assert never_run == (3,)
        assert trioworker("resume", "--scope", "disk-a", dsn=dsn).returncode == 0
        wait_for(lambda: finished("disk-a") == 3, 30, "disk-a's items after resume")


def quiesce(dsn: str, scope: str) -> tuple[Any, dt.datetime]:
    result = trioworker("quiesce", "--scope", scope, "--timeout", "60", dsn=dsn, timeout=90)
    with psycopg.connect(dsn) as conn:
        (now,) = conn.execute("SELECT now()").fetchone() or ()
    return result, now


def test_quiesce_waits_for_the_lease_when_a_handler_ignores_its_cancel(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """A handler shielded against its cancel: the Worker fail-stops after its stop
    grace, and quiesce returns 0 only once the item's lease has expired."""
    with workers(tmp_path) as start:
        worker = start(dsn, *FAST, name="w0", app=APP)
        trioworker("enqueue", "Stubborn", "--scope", "disk-a", dsn=dsn)
        wait_for(lambda: [e for e in observed(tmp_path) if e["event"] == "start"], 30, "start")
        result, returned_at = quiesce(dsn, "disk-a")
        assert worker.wait(30) == 70, worker.output()  # the fail-stop
    (lease_expired_at,) = (
        pg.execute(
            "SELECT lease_expires_at FROM work_items WHERE scope = 'disk-a' AND status = 'Running'"
            " UNION ALL SELECT now() - interval '1 hour' LIMIT 1"
        ).fetchone()
        or ()
    )
    assert result.returncode == 0, result.stderr
    assert "is quiet" in result.stdout and "lease expired" in result.stdout, result.stdout
    assert returned_at >= lease_expired_at  # not before: the attempt might still write


def test_quiesce_returns_once_the_cancelled_item_is_written(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """A handler that stops when cancelled: quiesce returns once its fenced write
    (Cancelled) is in, not at its lease's end; the scope stays paused."""
    with workers(tmp_path) as start:
        start(dsn, *FAST, name="w0", app=APP)
        long = ["--payload", '{"seconds": 60}']
        trioworker("enqueue", "Hold", "--scope", "disk-a", *long, dsn=dsn)
        trioworker("enqueue", "Hold", "--scope", "disk-a", *long, dsn=dsn)
        wait_for(lambda: [e for e in observed(tmp_path) if e["event"] == "start"], 30, "start")
        result, returned_at = quiesce(dsn, "disk-a")
        # Still paused: an item enqueued after disk-a's second one, and so after it in
        # claim order, runs; disk-a's stays Queued.
        later = trioworker("enqueue", "Hold", "--scope", "disk-b", dsn=dsn).stdout.split()[-1]
        wait_for(
            lambda: pg.execute("SELECT status FROM work_items WHERE id = %s", [int(later)])
            .fetchone() == ("Succeeded",),
            30,
            "an item of another scope to run",
        )  # fmt: skip
        rows = pg.execute(
            "SELECT status, finished_at FROM work_items WHERE scope = 'disk-a' ORDER BY id"
        ).fetchall()
    assert result.returncode == 0, result.stderr
    assert [r[0] for r in rows] == [Status.CANCELLED.value, Status.QUEUED.value]
    # It returned because the attempt ended with its write (after it), not because its
    # lease ran out: that would say "lease expired", and the lease never did.
    assert "which has ended" in result.stdout and "lease expired" not in result.stdout, result
    assert returned_at >= rows[0][1]
