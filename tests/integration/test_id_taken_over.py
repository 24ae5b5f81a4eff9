"""A Worker process stopped (SIGSTOP) for longer than its liveness window, whose id
another Worker took over meanwhile: resumed, it stops claiming, its attempt ends by its
fence, and it exits 75 saying why, once (issue 35, item 10). Real processes, real
PostgreSQL."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psycopg

from tests.support.processes import observed, wait_for, workers

#: lease 4 s: an advertisement every second (a quarter lease), seen as gone after three.
FAST = ["--lease", "4", "--heartbeat", "1", "--poll", "0.5", "--shutdown-grace", "2"]
Conn = psycopg.Connection[tuple[object, ...]]


def enqueue(pg: Conn, seconds: float) -> int:
    row = pg.execute(
        "INSERT INTO work_items (kind, payload) VALUES ('Record', %s) RETURNING id",
        [psycopg.types.json.Jsonb({"seconds": seconds})],
    ).fetchone()
    assert row is not None
    return int(str(row[0]))


def holder_pid(pg: Conn) -> object:
    row = pg.execute("SELECT pid FROM work_workers WHERE id = 'w1'").fetchone()
    return None if row is None else row[0]


def test_a_resumed_worker_whose_id_was_taken_over_stops_and_exits_75(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """A (w1), idle, is SIGSTOPped with its supervisor past its liveness window; B starts
    as w1 and takes the id over. Work is queued; A, resumed: one ERROR naming the
    takeover, no attempt started, exit status 75; B keeps the id (A recorded no stop
    over its row), runs every item, and stops cleanly."""
    with workers(tmp_path) as start:
        a = start(dsn, *FAST, name="w1")
        a_pid = a.worker_pid()
        wait_for(lambda: holder_pid(pg) == a_pid, 30, "A holding w1")
        wait_for(lambda: "worker w1 ready" in a.output(), 30, "A ready")
        a.pause()
        time.sleep(5)  # past three advertisements (3 s)
        b = start(dsn, *FAST, "--worker-id", "w1", name="w1-b")
        b_pid = b.worker_pid()
        wait_for(lambda: holder_pid(pg) == b_pid, 30, "B holding w1")
        wait_for(lambda: "worker w1 ready" in b.output(), 30, "B ready")
        b.pause()  # so that the queued items wait for whichever claims first
        items = [enqueue(pg, 0.2) for _ in range(3)]
        a.resume()
        code = a.wait(30)
        b.resume()
        a_log = a.output()
        assert code == 75, a_log
        assert a_log.count("ERROR") == 1, a_log
        assert a_log.count("id was taken over while it seemed gone") == 1, a_log
        assert "worker id 'w1' is in use by a live Worker" in a_log
        assert "stopping: no new claims" in a_log
        assert holder_pid(pg) == b_pid
        wait_for(
            lambda: pg.execute("SELECT count(*) FROM work_items WHERE status = 'Succeeded'")
            .fetchone() == (len(items),),
            60,
            "B finishing every item",
        )  # fmt: skip
        assert {e["pid"] for e in observed(tmp_path) if e["event"] == "start"} == {b_pid}
        b.signal(signal.SIGTERM)
        assert b.wait(30) == 0, b.output()
