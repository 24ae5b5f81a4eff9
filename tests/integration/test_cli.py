"""The command line as users run it: `python -m trioworker ...`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from tests.support.database import Databases, with_dbname
from tests.support.processes import ROOT

Conn = psycopg.Connection[Any]


def trioworker(
    *args: str, dsn: str | None = None, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if k != "TRIOWORKER_DSN"}, **(env or {})}
    if dsn is not None:
        env["TRIOWORKER_DSN"] = dsn
    return subprocess.run(
        [sys.executable, "-m", "trioworker", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def with_password(dsn: str, password: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["password"] = password
    return psycopg.conninfo.make_conninfo(**params)


@pytest.mark.parametrize(
    "args",
    [[], ["run"], ["migrate"], ["enqueue"], ["status"], ["cancel"], ["demo"]],
)
def test_help_everywhere(args: list[str]) -> None:
    """Every command answers --help."""
    result = trioworker(*args, "--help")
    assert result.returncode == 0 and "usage:" in result.stdout


def test_enqueue_prints_the_id_and_status_shows_it(dsn: str, pg: Conn) -> None:
    """enqueue prints the new id; status --json counts it; cancel cancels it."""
    result = trioworker("enqueue", "Crawl", "--scope", "7", "--payload", '{"path": "/m"}', dsn=dsn)
    assert result.returncode == 0, result.stderr
    item_id = int(result.stdout.strip())
    row = pg.execute("SELECT kind, scope, payload FROM work_items WHERE id = %s", (item_id,))
    assert row.fetchone() == ("Crawl", "7", {"path": "/m"})
    again = trioworker("enqueue", "Crawl", "--dedup-key", "k", dsn=dsn)
    same = trioworker("enqueue", "Crawl", "--dedup-key", "k", dsn=dsn)
    assert again.stdout == same.stdout and "already queued" in same.stderr
    status = json.loads(trioworker("status", "--json", dsn=dsn).stdout)
    assert status["counts"]["Crawl"]["Queued"] == 2
    table = trioworker("status", dsn=dsn)
    assert table.returncode == 0 and "Work items by kind and status" in table.stdout
    cancelled = trioworker("cancel", str(item_id), dsn=dsn)
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
    assert trioworker("cancel", "999999", dsn=dsn).returncode == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", "Crawl", "--payload", "{nope"], "--payload is not valid JSON"),
        (["enqueue", ""], "kind must not be empty"),
        (["enqueue", "Crawl", "--scope", ""], "scope must not be empty"),
        (["enqueue", "Crawll", "--app", "tests.apps.recording:registry"], "unknown kind 'Crawll'"),
    ],
)
def test_bad_enqueue_input_is_one_clear_line_and_writes_nothing(
    dsn: str, pg: Conn, args: list[str], message: str
) -> None:
    """Bad input: a one-line error, exit 2 (a usage error), nothing written."""
    result = trioworker(*args, dsn=dsn)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert pg.execute("SELECT count(*) FROM work_items").fetchone() == (0,)


@pytest.mark.parametrize(
    ("app", "message"),
    [
        ("tests.apps.nosuch:registry", "cannot import 'tests.apps.nosuch'"),
        ("tests.apps.recording:nosuch", "has no 'nosuch'"),
        ("tests.apps.recording:not_a_registry", "is a object, not a trioworker.Registry"),
    ],
)
def test_a_bad_app_is_one_clear_line(dsn: str, app: str, message: str) -> None:
    """run with an --app that cannot be loaded: one line naming the problem, exit 1
    (one not even of the form MODULE:ATTR is a usage error, exit 2)."""
    result = trioworker("run", "--app", app, dsn=dsn)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and message in result.stderr
    malformed = trioworker("run", "--app", "tests.apps.recording", dsn=dsn)
    assert malformed.returncode == 2 and "must look like MODULE:ATTR" in malformed.stderr
    assert result.stderr.count("\n") == 1 and message in result.stderr


def test_an_unreachable_database_is_one_clear_line_without_the_password() -> None:
    """run against a server that does not answer gives up after --startup-timeout with
    one line that names the target but not the password."""
    dsn = "host=127.0.0.1 port=1 user=app password=hunter2 dbname=media"
    result = trioworker(
        "run", "--app", "tests.apps.recording:registry", "--startup-timeout", "1", dsn=dsn
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("trioworker: error: cannot connect to PostgreSQL (")
    assert "port=1" in last and "hunter2" not in result.stderr


def test_a_wrong_database_name_is_not_retried(databases: Databases) -> None:
    """A database that does not exist is a configuration error: no retry loop."""
    dsn = with_password(with_dbname(databases.admin_dsn, "no_such_database"), "hunter2")
    result = trioworker("run", "--app", "tests.apps.recording:registry", dsn=dsn, timeout=20)
    assert result.returncode == 1
    assert 'database "no_such_database" does not exist' in result.stderr
    assert "retrying" not in result.stderr and "hunter2" not in result.stderr


def test_a_bad_dsn_is_one_clear_line() -> None:
    """An unparseable DSN is refused before anything connects."""
    result = trioworker("status", dsn="host=db password=hunter2 port")
    assert result.returncode == 1 and result.stderr.startswith("trioworker: error: bad DSN")
    assert "hunter2" not in result.stderr


def test_run_refuses_an_unmigrated_database(databases: Databases) -> None:
    """A Worker will not start on a database that lacks migrations, and says what to do."""
    with databases.database(migrated=False) as dsn:
        result = trioworker("run", "--app", "tests.apps.recording:registry", dsn=dsn)
    assert result.returncode == 1 and "python -m trioworker migrate" in result.stderr


def test_bad_settings_are_refused(dsn: str) -> None:
    """A heartbeat too slow for the lease is refused with the reason (a usage error)."""
    result = trioworker(
        "run", "--app", "tests.apps.recording:registry", "--lease", "10", "--heartbeat", "6",
        dsn=dsn,
    )  # fmt: skip
    assert result.returncode == 2 and "shorter than half the lease" in result.stderr
