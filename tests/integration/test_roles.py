"""The least-privilege roles of docs/roles.md, as an operator sets them up.

docs/roles.sql (as a superuser), `migrate` as the migrator, docs/grants.sql as the
migrator; then a Worker process runs as the Worker role and completes work, while that
role can change no schema and cannot migrate. Roles are cluster-wide, so the test
gives them names of its own and drops them afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.integration.test_cli import trioworker
from tests.support.database import Databases
from tests.support.processes import ROOT, wait_for, workers

Conn = psycopg.Connection[Any]


class Roles:
    def __init__(self) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.migrator = f"tw_migrator_{suffix}"
        self.worker = f"tw_worker_{suffix}"
        self.db_dsn = ""  # the test database, once made

    def script(self, name: str) -> str:
        text = (ROOT / "docs" / name).read_text()
        return text.replace("trioworker_migrator", self.migrator).replace(
            "trioworker_worker", self.worker
        )

    def dsn(self, role: str) -> str:
        params = psycopg.conninfo.conninfo_to_dict(self.db_dsn)
        params["user"] = role
        return psycopg.conninfo.make_conninfo(**params)


@pytest.fixture
def roles(databases: Databases) -> Iterator[Roles]:
    """An empty database with docs/roles.sql applied by the superuser."""
    roles = Roles()
    try:
        with databases.database(migrated=False) as roles.db_dsn:
            with psycopg.connect(roles.db_dsn, autocommit=True) as admin:
                admin.execute(roles.script("roles.sql"))  # type: ignore[call-overload]
            yield roles
    finally:  # roles outlive their database: drop them after it
        with psycopg.connect(databases.admin_dsn, autocommit=True) as admin:
            for role in (roles.worker, roles.migrator):
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


DDL = [
    "ALTER TABLE work_items ADD COLUMN sneaky integer",
    "DROP INDEX work_items_one_running_per_scope_slot",
    "CREATE TABLE sneaky (id integer)",
    "CREATE TABLE public.sneaky (id integer)",
    "CREATE FUNCTION sneaky() RETURNS integer LANGUAGE sql AS 'SELECT 1'",
    "DROP TRIGGER work_items_arrive ON work_items",
    "TRUNCATE work_items CASCADE",
    "UPDATE _yoyo_migration SET migration_hash = migration_hash",
    "DELETE FROM yoyo_lock",
]


def test_a_worker_runs_as_the_worker_role_which_cannot_change_the_schema(
    roles: Roles, tmp_path: Path
) -> None:
    """The Worker role cannot migrate; the migrator can; then a Worker process connected
    as the Worker role completes queued items, yet every DDL statement (and any write to
    the migration bookkeeping) fails for lack of privilege."""
    worker_dsn, migrator_dsn = roles.dsn(roles.worker), roles.dsn(roles.migrator)

    refused = trioworker("migrate", dsn=worker_dsn)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "may not change the schema" in refused.stderr
    with psycopg.connect(roles.db_dsn) as admin:
        assert admin.execute("SELECT to_regclass('trioworker.work_items')").fetchone() == (None,)

    migrated = trioworker("migrate", dsn=migrator_dsn)
    assert migrated.returncode == 0, migrated.stderr
    with psycopg.connect(migrator_dsn, autocommit=True) as migrator:
        migrator.execute(roles.script("grants.sql"))  # type: ignore[call-overload]
        owner = migrator.execute(
            "SELECT tableowner FROM pg_tables WHERE tablename = 'work_items'"
        ).fetchone()
        assert owner == (roles.migrator,)

    with psycopg.connect(worker_dsn, autocommit=True) as conn:
        for statement in DDL:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)  # type: ignore[call-overload]

    ids = []
    for args in (["--scope", "s1"], []):
        result = trioworker(
            "enqueue", "Record", "--payload", '{"seconds": 0}', *args, dsn=worker_dsn
        )
        assert result.returncode == 0, result.stderr
        ids.append(int(result.stdout))
    with workers(tmp_path) as start, psycopg.connect(roles.db_dsn, autocommit=True) as admin:
        worker = start(worker_dsn, "--poll", "1", name="least-privilege")

        def done() -> bool:
            rows = admin.execute(
                "SELECT status FROM trioworker.work_items WHERE id = ANY(%s)", (ids,)
            ).fetchall()
            return rows == [("Succeeded",), ("Succeeded",)]

        wait_for(done, 60, "the Worker role's Worker to complete both items")
        users = admin.execute(
            "SELECT DISTINCT usename FROM pg_stat_activity WHERE application_name = %s",
            ("trioworker least-privilege",),
        ).fetchall()
        assert users == [(roles.worker,)], worker.output()
        assert "permission denied" not in worker.output()

    status = trioworker("status", "--json", dsn=worker_dsn)
    assert status.returncode == 0 and '"Succeeded": 2' in status.stdout
    again = trioworker("migrate", dsn=worker_dsn)  # nothing pending: reading is allowed
    assert again.returncode == 0 and again.stdout == "schema is up to date\n", again.stderr
