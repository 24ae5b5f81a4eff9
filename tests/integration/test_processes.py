"""`run --processes N`: N Worker processes under one supervisor, on real PostgreSQL."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psycopg

from tests.integration.test_worker import FAST
from tests.support.processes import observed, wait_for, workers
from trioworker._cli.supervisor import exit_code, final_status, worker_ids

Conn = psycopg.Connection[Any]


def advertised(pg: Conn) -> list[tuple[Any, ...]]:
    rows = pg.execute("SELECT id, pid, stopped_at IS NULL FROM work_workers ORDER BY id")
    return rows.fetchall()


def test_two_processes_are_two_workers_and_sigterm_drains_both(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """`run --processes 2`: two Workers advertised under their own ids and pids, both
    take work, and one SIGTERM to the supervisor drains both (their running items
    finish), marks both stopped, and exits 0."""
    with workers(tmp_path) as start:
        supervisor = start(dsn, *FAST, "--processes", "2", "--concurrency", "1", name="host")
        wait_for(lambda: len(advertised(pg)) == 2, timeout=30, what="two Workers advertised")
        rows = advertised(pg)
        assert [(id, alive) for id, _, alive in rows] == [("host-1", True), ("host-2", True)]
        pids = {pid for _, pid, _ in rows}
        assert len(pids) == 2 and supervisor.proc.pid not in pids
        pg.execute(
            "INSERT INTO work_items (kind, scope, payload) VALUES"
            " ('Record', 'a', '{\"seconds\": 1.5}'), ('Record', 'b', '{\"seconds\": 1.5}')"
        )
        wait_for(
            lambda: len([e for e in observed(tmp_path) if e["event"] == "start"]) == 2,
            timeout=20,
            what="both items to start",
        )
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=30) == 0, supervisor.output()
    assert {e["worker"] for e in observed(tmp_path) if e["event"] == "end"} == {"host-1", "host-2"}
    statuses = pg.execute("SELECT status FROM work_items").fetchall()
    assert statuses == [("Succeeded",), ("Succeeded",)]
    assert [alive for _, _, alive in advertised(pg)] == [False, False]


def test_a_second_sigint_stops_both_at_once_with_130(dsn: str, pg: Conn, tmp_path: Path) -> None:
    """SIGINT twice to the supervisor: each Worker stops at once, as one Worker would,
    and the supervisor exits 130."""
    with workers(tmp_path) as start:
        supervisor = start(dsn, *FAST, "--processes", "2", "--shutdown-grace", "600", name="h")
        pg.execute(
            "INSERT INTO work_items (kind, scope, payload) VALUES"
            " ('Record', 'a', '{\"seconds\": 900}'), ('Record', 'b', '{\"seconds\": 900}')"
        )
        wait_for(
            lambda: {e["worker"] for e in observed(tmp_path)} == {"h-1", "h-2"},
            timeout=30,
            what="an item started in each Worker",
        )
        supervisor.signal(signal.SIGINT)
        wait_for(lambda: supervisor.output().count("stopping: no new claims") == 2, 20,
                 "both Workers to stop claiming")  # fmt: skip
        supervisor.signal(signal.SIGINT)
        # At once, not after the shutdown grace (600 s): 130, and both items still
        # Running (a drain would have released them).
        assert supervisor.wait(timeout=60) == 130, supervisor.output()
    assert pg.execute("SELECT count(*) FROM work_items WHERE status = 'Running'").fetchone() == (2,)


def test_a_fail_stop_in_one_worker_drains_the_other_and_ends_the_supervisor_with_70(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """One Worker fail-stops (a handler swallows its cancel): it exits 70, the supervisor
    sends the other SIGTERM, which finishes its item and exits 0, and the supervisor
    exits 70."""
    with workers(tmp_path) as start:
        supervisor = start(dsn, *FAST, "--processes", "2", "--concurrency", "1", name="h")
        pg.execute("INSERT INTO work_items (kind, scope) VALUES ('IgnoreCancel', 'x')")
        pg.execute(
            "INSERT INTO work_items (kind, scope, payload)"
            " VALUES ('Record', 'y', '{\"seconds\": 3}')"
        )
        wait_for(
            lambda: len({e["worker"] for e in observed(tmp_path)}) == 2,
            timeout=30,
            what="an item started in each Worker",
        )
        pg.execute("UPDATE work_items SET cancel_requested = true WHERE kind = 'IgnoreCancel'")
        assert supervisor.wait(timeout=30) == 70, supervisor.output()
        output = supervisor.output()
    assert "fail-stop" in output
    assert "exited with 70 unasked: stopping the others" in output
    rows = pg.execute("SELECT kind, status FROM work_items ORDER BY kind").fetchall()
    assert rows == [("IgnoreCancel", "Running"), ("Record", "Succeeded")]
    stopped = pg.execute("SELECT count(*) FROM work_workers WHERE stopped_at IS NOT NULL")
    assert stopped.fetchone() == (1,)  # the drained one; the fail-stopped one just ended


def test_the_supervisor_exit_code_is_the_gravest_of_its_workers() -> None:
    """A fail-stop anywhere is 70, else an interrupt 130, else an id taken over 75, else
    any other end 1, else 0."""
    assert exit_code([0, 0]) == 0
    assert exit_code([0, 75]) == 75
    assert exit_code([1, 75]) == 75
    assert exit_code([75, 130]) == 130
    assert exit_code([70, 75]) == 70
    assert exit_code([0, 70]) == 70
    assert exit_code([130, 70, 1]) == 70
    assert exit_code([0, 130]) == 130
    assert exit_code([1, 130]) == 130
    assert exit_code([0, 1]) == 1
    assert exit_code([2, 0]) == 1


def test_one_worker_keeps_its_id_and_the_supervisor_ends_as_it_did() -> None:
    """One Worker runs under the id given and its supervisor ends with its status, or by
    the signal that killed it; N Workers are ID-1 .. ID-N and a signal among theirs is 1."""
    assert worker_ids("w", 1) == ["w"]
    assert worker_ids("w", 3) == ["w-1", "w-2", "w-3"]
    assert [final_status([c]) for c in (0, 1, 70, 130, -9)] == [0, 1, 70, 130, -9]
    assert final_status([0, -9]) == 1
    assert final_status([-9, 70]) == 70
