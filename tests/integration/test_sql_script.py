"""`python -m trioworker sql`: the queue's migrations as one script for an application's
own migration tool. Applied to an empty database it gives exactly docs/schema.sql, and
leaves yoyo's bookkeeping as `migrate` would, so Workers and a later `migrate` agree."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support.database import Databases
from tests.support.processes import ROOT
from tests.support.schema import describe
from trioworker import QUEUE_MIGRATION_HEAD, check_schema, migrate

UNREACHABLE = "host=127.0.0.1 port=1 dbname=x connect_timeout=1"


def trioworker(*args: str, dsn: str = UNREACHABLE) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIOWORKER", "PG"))}
    return subprocess.run(
        [sys.executable, "-m", "trioworker", "--dsn", dsn, *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture
def empty_dsn(databases: Databases) -> Iterator[str]:
    with databases.database(migrated=False) as dsn:
        yield dsn


def apply(dsn: str, script: str) -> None:
    """As a migration tool would: one transaction, the script as one string."""
    with psycopg.connect(dsn) as conn:
        conn.execute(script)  # type: ignore[arg-type]  (a script, not a literal)


def bookkeeping(dsn: str) -> list[tuple[Any, ...]]:
    """yoyo's tables as the catalog describes them, and the migrations they record."""
    with psycopg.connect(dsn) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type, character_maximum_length,"
            " is_nullable FROM information_schema.columns"
            " WHERE table_schema = 'public' AND table_name LIKE '\\_yoyo%'"
            " ORDER BY table_name, ordinal_position"
        ).fetchall()
        keys = conn.execute(
            "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid::regclass::text LIKE '\\_yoyo%' ORDER BY 1"
        ).fetchall()
        applied = conn.execute(
            "SELECT migration_hash, migration_id FROM _yoyo_migration ORDER BY 2"
        ).fetchall()
        versions = conn.execute("SELECT version FROM _yoyo_version").fetchall()
        logged = conn.execute("SELECT migration_id, operation FROM _yoyo_log ORDER BY 1").fetchall()
    return [*columns, *keys, *applied, *versions, *logged]


def test_the_script_gives_the_schema_snapshot_and_yoyos_record(
    empty_dsn: str, databases: Databases
) -> None:
    """The output of `sql`, applied to an empty database in one transaction, describes
    exactly as docs/schema.sql; yoyo's tables then hold what `migrate` leaves, so the
    Worker's schema check passes and `migrate` finds nothing to do."""
    result = trioworker("sql")
    assert result.returncode == 0, result.stderr
    apply(empty_dsn, result.stdout)
    with psycopg.connect(empty_dsn) as conn:
        assert describe(conn) == (ROOT / "docs" / "schema.sql").read_text()
    check_schema(empty_dsn)
    with databases.database(migrated=False) as by_migrate:
        migrate(by_migrate)
        assert bookkeeping(empty_dsn) == bookkeeping(by_migrate)
    again = trioworker("migrate", dsn=empty_dsn)
    assert again.returncode == 0 and again.stdout == "schema is up to date\n", again


def test_the_script_connects_to_nothing_and_says_nothing_else() -> None:
    """`sql` runs with no database at all (the DSN points nowhere) and prints only the
    script: no "no DSN given" line, nothing on stderr."""
    result = trioworker("sql")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("-- trioworker's migrations 0001.queue to ")
    assert f"-- migration {QUEUE_MIGRATION_HEAD}\n" in result.stdout


def test_from_starts_at_a_migration_and_an_unknown_one_is_a_usage_error() -> None:
    """`--from ID` starts there (the first migration: everything); an ID that is not
    one of the queue's is exit 2, naming those that are."""
    assert trioworker("sql", "--from", "0001.queue").stdout == trioworker("sql").stdout
    last = trioworker("sql", "--from", QUEUE_MIGRATION_HEAD)
    assert last.returncode == 0
    assert f"-- migration {QUEUE_MIGRATION_HEAD}\n" in last.stdout
    unknown = trioworker("sql", "--from", "0099.nothing")
    assert unknown.returncode == 2
    assert "no queue migration '0099.nothing': the queue's migrations are 0001.queue" in (
        unknown.stderr
    )


def test_an_application_migration_after_the_script_applies_on_top(empty_dsn: str) -> None:
    """After the script, an application's own yoyo migrations (which depend on the
    queue's last) apply with `migrate --app`, and nothing of the queue's again."""
    apply(empty_dsn, trioworker("sql").stdout)
    result = trioworker("migrate", "--app", "examples.media:registry", dsn=empty_dsn)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["applied 0001.media-library"]
