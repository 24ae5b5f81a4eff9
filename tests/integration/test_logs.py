"""What a Worker process writes: structured item lines, and never the DSN's password.

Each test drives a real Worker (`python -m trioworker run`) through the events that log
about items (a kind it leaves alone, a handler error and its retry, an expired lease taken
back, a cancel) and through a database outage (its connections killed, new ones
refused), at DEBUG level. Trust authentication accepts any password, so a DSN can
carry one the server never checks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.integration.test_cli import trioworker, with_password
from tests.support.database import Databases, with_dbname
from tests.support.processes import APP, ROOT, wait_for

FAST = ["--lease", "4", "--heartbeat", "1", "--poll", "1", "--stop-grace", "1"]
PASSWORD = "pw-Zq81xVv-secret"
Conn = psycopg.Connection[Any]


class Worker:
    """`python -m trioworker [global options] --dsn DSN run ...`, its output in a file."""

    def __init__(self, dsn: str, tmp_path: Path, options: list[str]) -> None:
        self.log_path = tmp_path / "worker.log"
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trioworker", *options, "--dsn", dsn, "run",
                 "--app", APP, "--worker-id", "logged", *FAST],
                cwd=ROOT,
                env={**os.environ, "TW_OBSERVER_LOG": str(tmp_path / "observer.jsonl")},
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    def output(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        """SIGTERM, and it must exit cleanly; SIGKILL if it does not."""
        try:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(timeout=60) == 0, self.output()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)


@contextmanager
def running_worker(dsn: str, tmp_path: Path, *options: str) -> Iterator[Worker]:
    worker = Worker(dsn, tmp_path, list(options))
    try:
        yield worker
    finally:
        if worker.proc.poll() is None:
            worker.proc.kill()
            worker.proc.wait(timeout=10)


@contextmanager
def outage(admin_dsn: str, dbname: str) -> Iterator[None]:
    """Kill every connection to the database and refuse new ones, until the block ends
    (the test's own `pg` connection dies too; it is not used meanwhile)."""
    name = sql.Identifier(dbname)
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(name))
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (dbname,),
            )
            yield
        finally:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(name))


def status_of(pg: Conn, id: int) -> str:
    return str(pg.execute("SELECT status FROM work_items WHERE id = %s", (id,)).fetchone()[0])  # type: ignore[index]


def insert(pg: Conn, kind: str, scope: str | None = None, payload: str = "{}") -> int:
    row = pg.execute(
        "INSERT INTO work_items (kind, scope, payload) VALUES (%s, %s, %s) RETURNING id",
        (kind, scope, payload),
    ).fetchone()
    return int(row[0])  # type: ignore[index]


def drive_through_failures(
    databases: Databases, dsn: str, worker: Worker, worker_dsn: str
) -> dict[str, int]:
    """Make the Worker log about items and ride out an outage; the ids involved."""
    with psycopg.connect(dsn, autocommit=True) as pg:
        ids = {
            "unknown": insert(pg, "NoSuchKind", "u1"),
            "erring": insert(pg, "Record", "e1", '{"seconds": "not a number"}'),
        }
        # An attempt of a Worker that vanished: Running, its lease already expired.
        ids["orphan"] = int(
            pg.execute(
                "INSERT INTO work_items (kind, scope, payload, status, attempt, worker_id,"
                " started_at, lease_expires_at)"
                " VALUES ('Record', 'o1', '{\"seconds\": 0}', 'Running', 1, 'gone',"
                " now() - interval '1 minute', now() - interval '1 second') RETURNING id"
            ).fetchone()[0]  # type: ignore[index]
        )
        ids["long"] = insert(pg, "Record", "l1", '{"seconds": 600}')
        wait_for(lambda: status_of(pg, ids["long"]) == "Running", 60, "the long item to start")
        assert trioworker("cancel", str(ids["long"]), dsn=worker_dsn).returncode == 0
        for name, status in [("orphan", "Succeeded"), ("long", "Cancelled")]:
            wait_for(lambda: status_of(pg, ids[name]) == status, 60, f"{name}: {status}")  # noqa: B023
        assert status_of(pg, ids["unknown"]) == "Queued"  # no handler here: left for others
        wait_for(lambda: worker.output().count("handler failed (") >= 2, 60, "two erring attempts")

    with outage(databases.admin_dsn, psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]):
        wait_for(
            lambda: (
                "cannot claim" in (out := worker.output())
                and out.count("not currently accepting connections") >= 2
            ),
            60,
            "the Worker's claims and reconnects to meet the outage",
        )
        after = len(worker.output())  # nothing reconnects before the outage ends
    wait_for(lambda: "listening for new work again" in worker.output()[after:], 90, "recovery")
    with psycopg.connect(dsn, autocommit=True) as pg:
        ids["after"] = insert(pg, "Record", None, '{"seconds": 0}')
        wait_for(lambda: status_of(pg, ids["after"]) == "Succeeded", 90, "work after the outage")
    return ids


def test_json_logs_carry_the_item_fields_on_every_item_line(
    databases: Databases, dsn: str, tmp_path: Path
) -> None:
    """With --log-format json every line the Worker writes is one JSON object, and every
    line about an item carries its id, attempt, kind, scope and the Worker's id."""
    with running_worker(dsn, tmp_path, "--log-format", "json", "--log-level", "DEBUG") as worker:
        ids = drive_through_failures(databases, dsn, worker, dsn)
        worker.stop()
    lines = [json.loads(line) for line in worker.output().splitlines()]  # each must parse
    assert lines and all({"ts", "level", "logger", "message"} <= line.keys() for line in lines)

    about_items = [
        line
        for line in lines
        if line["logger"] == "trioworker.executor" or "lease expired" in line["message"]
    ]
    for line in about_items:
        assert {"item_id", "attempt", "kind", "scope", "worker_id"} <= line.keys(), line
        assert line["worker_id"] == "logged", line
    by_id = {(line["item_id"], line["attempt"]): line for line in about_items}
    assert (ids["unknown"], 1) not in by_id  # never claimed: this Worker has no handler
    assert by_id[ids["erring"], 1]["kind"] == "Record"
    assert by_id[ids["erring"], 2]["scope"] == "e1"
    assert "lease expired" in by_id[ids["orphan"], 1]["message"]
    assert by_id[ids["long"], 1]["message"] == "stopped (cancel_requested)"


def test_the_password_never_appears_in_a_workers_output(
    databases: Databases, dsn: str, tmp_path: Path
) -> None:
    """A Worker whose DSN carries a password, at DEBUG level, through item failures and
    an outage, never writes the password (and does write the outage's errors)."""
    secret_dsn = with_password(dsn, PASSWORD)
    with running_worker(secret_dsn, tmp_path, "--log-level", "DEBUG") as worker:
        drive_through_failures(databases, dsn, worker, secret_dsn)
        worker.stop()
    output = worker.output()
    assert "DEBUG" in output and "not currently accepting connections" in output
    assert PASSWORD not in output


@pytest.mark.parametrize(
    ("args", "target"),
    [
        (["status"], "no_such_database"),
        (["status", "--json"], "port=1"),
        (["enqueue", "Record", "--scope", "s"], "no_such_database"),
        (["enqueue", "Record"], "port=1"),
        (["cancel", "1"], "port=1"),
        (["migrate"], "no_such_database"),
        (["run", "--app", APP, "--startup-timeout", "1"], "port=1"),
    ],
)
def test_command_errors_never_show_the_password(
    databases: Databases, args: list[str], target: str
) -> None:
    """A command that cannot reach its database says where it tried, at DEBUG level,
    in either log format, without the password."""
    if target == "port=1":
        dsn = f"host=127.0.0.1 port=1 user=postgres password={PASSWORD} dbname=x"
    else:
        dsn = with_password(with_dbname(databases.admin_dsn, target), PASSWORD)
    for fmt in ("text", "json"):
        result = trioworker("--log-level", "DEBUG", "--log-format", fmt, *args, dsn=dsn)
        assert result.returncode == 1, result.stderr
        assert "password=***" in result.stderr and target in result.stderr
        assert PASSWORD not in result.stdout + result.stderr


def test_text_logs_show_what_an_item_carries_escaped(dsn: str, pg: Conn, tmp_path: Path) -> None:
    """A Worker logging (as text) about an item whose scope holds an OSC sequence (sets
    a terminal's title) and whose handler fails: the lines show the scope escaped, and
    no control character but the line breaks reaches the output."""
    with running_worker(dsn, tmp_path) as worker:
        erring = insert(pg, "Record", "\x1b]0;PWNED\x07", '{"seconds": "soon"}')
        wait_for(lambda: "handler failed" in worker.output(), 60, "the handler to fail")
        worker.stop()
    output = worker.output()
    assert f"[item_id={erring} attempt=1 kind=Record scope=\\x1b]0;PWNED\\x07" in output
    assert "\x1b" not in output and "\x07" not in output
