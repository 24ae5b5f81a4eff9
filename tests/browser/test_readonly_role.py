"""The dashboard on the read-only role of docs/roles.md (docs/dashboard/readonly-role.sql).

Set up as an operator would: docs/roles.sql as a superuser, `migrate` as the migrator,
docs/grants.sql as the migrator, then the dashboard's script as the superuser. The
read-only dashboard serves every page through that role; an action attempted through
it is refused with a message (403), not an error page, and writes nothing. Roles are
cluster-wide, so the test names its own and drops them afterwards
(tests/support/roles.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from tests.browser.support import TOKEN, Dashboard, request
from tests.support.database import Databases
from tests.support.roles import RoleSetup

Conn = psycopg.Connection[Any]
PAGES = ["/", "/running", "/scopes", "/failures", "/workers", "/schedules", "/pauses"]


@pytest.fixture
def roles(databases: Databases) -> Iterator[RoleSetup]:
    """A database set up with the roles, migrated, with a few items in it."""
    roles = RoleSetup()
    try:
        with databases.database(migrated=False) as roles.db_dsn:
            roles.set_up()
            roles.run("dashboard/readonly-role.sql")
            with psycopg.connect(roles.dsn("trioworker_client"), autocommit=True) as client:
                client.execute(
                    "INSERT INTO work_items (kind, scope, payload)"
                    " SELECT 'Crawl', 'cfg-' || (n % 3), '{}' FROM generate_series(1, 7) AS n"
                )
            yield roles
    finally:
        roles.drop(databases.admin_dsn)


def test_the_read_only_role_serves_the_dashboard_and_cannot_act(
    roles: RoleSetup, browser: Chrome, start_dashboard: Any
) -> None:
    """Every page renders through the read-only role, with the database's numbers; with
    actions allowed, an action through that role answers 403 with a message, writes
    nothing, and the role itself can write nothing."""
    dsn = roles.dsn("trioworker_dashboard")
    read_only: Dashboard = start_dashboard(dsn)
    for page in [*PAGES, "/items/1"]:
        answer = request(read_only.url + page)
        assert answer.status == 200, (page, answer.body)
    browser.get(read_only.url + "/")
    cell = browser.find_element(
        By.CSS_SELECTOR, '#counts tr[data-kind="Crawl"] td[data-status="Queued"]'
    )
    assert cell.get_attribute("data-n") == "7"

    acting: Dashboard = start_dashboard(
        dsn, "--allow-actions", env={"TRIOWORKER_DASHBOARD_TOKEN": TOKEN}
    )
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    attempts = [("pause", {"scope": "cfg-1"}), ("cancel", {"id": 1}), ("retry", {"id": 2}),
                ("quiesce", {"scope": "cfg-2", "timeout": 1})]  # fmt: skip
    for action, form in attempts:
        answer = request(acting.url + f"/actions/{action}", "POST", form=form,
                         headers={**bearer, "Accept": "application/json"})  # fmt: skip
        assert answer.status == 403, (action, answer.body)
        assert "may not change the queue" in json.loads(answer.body)["message"]
    page = request(acting.url + "/actions/pause", "POST", form={"kind": "Crawl"}, headers=bearer)
    assert page.status == 403 and "may not change the queue" in page.body
    assert "Traceback" not in page.body and "Traceback" not in acting.output()

    with psycopg.connect(roles.db_dsn, autocommit=True) as admin:
        admin.execute("SET search_path = trioworker")
        assert admin.execute("SELECT count(*) FROM work_pauses").fetchone() == (0,)
        assert admin.execute(
            "SELECT count(*) FROM work_items WHERE status = 'Queued' AND NOT cancel_requested"
        ).fetchone() == (7,)
    with psycopg.connect(dsn, autocommit=True) as conn:
        writes = ["INSERT INTO work_pauses (kind) VALUES ('Crawl')",
                  "UPDATE work_items SET priority = 1", "DELETE FROM work_attempts"]  # fmt: skip
        for statement in writes:
            with pytest.raises((psycopg.errors.InsufficientPrivilege,
                                psycopg.errors.ReadOnlySqlTransaction)):  # fmt: skip
                conn.execute(statement)  # type: ignore[call-overload]
