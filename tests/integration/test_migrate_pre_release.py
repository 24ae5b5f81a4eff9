"""A database made by the pre-release chain of migrations (0001.baseline .. 0011.roles,
squashed into 0001.queue for the first release) is refused by name, with what to do,
by `migrate`, `check_schema` and a Worker's start: never half-migrated."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from yoyo import get_backend, read_migrations

from tests.support.database import Databases
from trioworker import QUEUE_MIGRATION_HEAD, SchemaNotReady, check_schema, migrate
from trioworker._postgres.migrate import PRE_RELEASE_MIGRATIONS, yoyo_uri

#: Stand-ins for the pre-release files: yoyo records a migration by its id, which is
#: all the refusal reads (the old files are no longer shipped).
PRE_RELEASE = {
    "0001.baseline": "CREATE TABLE work_items (id bigint PRIMARY KEY, status text);",
    "0002.limits": "-- depends: 0001.baseline\nCREATE TABLE work_limits (id bigint);",
    "0011.roles": "-- depends: 0002.limits\nCREATE FUNCTION work_retry_v2() RETURNS int"
    " LANGUAGE sql AS 'SELECT 1';",
}


@pytest.fixture
def pre_release_dsn(databases: Databases, tmp_path: Path) -> Iterator[str]:
    """A database whose yoyo bookkeeping says a pre-release chain was applied."""
    for name, body in PRE_RELEASE.items():
        (tmp_path / f"{name}.sql").write_text(body + "\n")
    with databases.database(migrated=False) as dsn:
        backend = get_backend(yoyo_uri(dsn))
        try:
            with backend.lock():
                backend.apply_migrations(backend.to_apply(read_migrations(str(tmp_path))))
        finally:
            backend.connection.close()
        yield dsn


def applied(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT migration_id FROM _yoyo_migration ORDER BY 1").fetchall()
    return [r[0] for r in rows]


def test_the_pre_release_ids_are_not_the_baselines() -> None:
    """The baseline's id is none of the pre-release chain's, so a database that has
    those applied is never taken for one that has the baseline."""
    assert QUEUE_MIGRATION_HEAD not in PRE_RELEASE_MIGRATIONS
    assert set(PRE_RELEASE) <= PRE_RELEASE_MIGRATIONS


def test_migrate_and_check_schema_refuse_a_pre_release_schema(pre_release_dsn: str) -> None:
    """`migrate` and `check_schema` say the database was made by a pre-release schema
    and what to do; the baseline is not applied over it."""
    for call in (migrate, check_schema):
        with pytest.raises(SchemaNotReady) as refused:
            call(pre_release_dsn)
        message = str(refused.value)
        assert "made by a pre-release trioworker schema" in message
        assert "0001.baseline, 0002.limits, 0011.roles" in message
        assert "Drop and re-create the database" in message
        assert "python -m trioworker migrate" in message
    assert applied(pre_release_dsn) == sorted(PRE_RELEASE)
    with psycopg.connect(pre_release_dsn) as conn:
        [(functions,)] = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE proname LIKE 'work\\_%\\_v1'"
        ).fetchall()
    assert functions == 0  # nothing of the baseline was created


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRIOWORKER_DSN": dsn}
    return subprocess.run(
        [sys.executable, "-m", "trioworker", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_cli_and_a_workers_start_refuse_a_pre_release_schema(pre_release_dsn: str) -> None:
    """`python -m trioworker migrate`, `run` (a Worker's start, also with --migrate) and
    `status` exit 1 with the refusal, and leave the database as it was."""
    for args in (
        ["migrate"],
        ["run", "--app", "tests.apps.chaos:registry"],
        ["run", "--migrate", "--app", "tests.apps.chaos:registry"],
        ["status"],
    ):
        result = cli(pre_release_dsn, *args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert "made by a pre-release trioworker schema" in result.stderr, args
        assert "Drop and re-create the database" in result.stderr, args
    assert applied(pre_release_dsn) == sorted(PRE_RELEASE)


def test_a_pre_release_schema_in_a_named_schema_says_which(
    databases: Databases, tmp_path: Path
) -> None:
    """In a schema of its own, the refusal names the schema and how to drop it."""
    for name, body in PRE_RELEASE.items():
        (tmp_path / f"{name}.sql").write_text(body + "\n")
    with databases.database(migrated=False) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA q")
        backend = get_backend(yoyo_uri(dsn, "q"))
        try:
            with backend.lock():
                backend.apply_migrations(backend.to_apply(read_migrations(str(tmp_path))))
        finally:
            backend.connection.close()
        with pytest.raises(SchemaNotReady, match="DROP SCHEMA q CASCADE"):
            check_schema(dsn, schema="q")
        with pytest.raises(SchemaNotReady, match="trioworker --schema q migrate"):
            migrate(dsn, schema="q")
