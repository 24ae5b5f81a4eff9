"""The roles of docs/roles.md, set up as an operator would, under names of a test's own.

Roles are cluster-wide: each `RoleSetup` gives every role a name with a suffix of its
own (the scripts are run with the documented names replaced), so tests on databases
side by side never share one, and `drop` removes them once their database is gone.
"""

from __future__ import annotations

import uuid

import psycopg
from psycopg import sql

from tests.support.processes import ROOT
from trioworker import migrate

#: The documented role names (docs/roles.sql, docs/dashboard/readonly-role.sql).
DOCUMENTED = ("trioworker_migrator", "trioworker_client", "trioworker_worker",
              "trioworker_operator", "trioworker_dashboard")  # fmt: skip


class RoleSetup:
    """A database's roles: `name["trioworker_worker"]` is the Worker role's name here."""

    def __init__(self, db_dsn: str = "") -> None:
        suffix = uuid.uuid4().hex[:8]
        self.name = {role: f"tw_{role.removeprefix('trioworker_')}_{suffix}" for role in DOCUMENTED}
        self.db_dsn = db_dsn  # the test database, once made

    def script(self, path: str) -> str:
        """docs/`path`, with this setup's role names."""
        text = (ROOT / "docs" / path).read_text()
        for documented, ours in self.name.items():
            text = text.replace(documented, ours)
        return text

    def dsn(self, role: str) -> str:
        """The test database's DSN as `role` (a documented name: trioworker_worker)."""
        params = psycopg.conninfo.conninfo_to_dict(self.db_dsn)
        params["user"] = self.name[role]
        return psycopg.conninfo.make_conninfo(**params)

    def run(self, path: str, as_role: str | None = None) -> None:
        """Run docs/`path` in the test database, as `as_role` (None: the superuser)."""
        dsn = self.db_dsn if as_role is None else self.dsn(as_role)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(self.script(path))  # type: ignore[call-overload]

    def set_up(self) -> None:
        """docs/roles.sql, `migrate` as the migrator, docs/grants.sql: each twice, as
        an operator may (each is safe to run again)."""
        for _ in range(2):
            self.run("roles.sql")
        migrate(self.dsn("trioworker_migrator"))
        for _ in range(2):
            self.run("grants.sql", as_role="trioworker_migrator")

    def drop(self, admin_dsn: str) -> None:
        """Drop every role (after their database: roles outlive it)."""
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            for role in reversed(self.name.values()):
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
