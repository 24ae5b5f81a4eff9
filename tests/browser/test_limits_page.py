"""The Scopes page with limits (issue 21): each scope's running limit and how many run,
and the `limit` action behind the token (HTTP only: no browser needed)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg

from tests.browser.support import TOKEN, Dashboard, request
from tests.support.database import Databases

Conn = psycopg.Connection[Any]
JSON = {"Accept": "application/json"}
BEARER = {**JSON, "Authorization": f"Bearer {TOKEN}"}


def test_the_scopes_page_shows_limits_and_sets_one_behind_the_token(
    databases: Databases, start_dashboard: Callable[..., Dashboard]
) -> None:
    """Scope S runs two items at its limit 2, T waits at the default 1: the page says
    2/2 and 0/1 default. With the token, `limit` sets T to 3 (the row is written) and
    refuses 0 and a non-number with 400, writing nothing; without it, 401."""
    with databases.database() as dsn, psycopg.connect(dsn, autocommit=True) as pg:
        pg.execute("SELECT work_set_limit_v1(NULL, 'S', 2)")
        pg.execute("INSERT INTO work_items (kind, scope) VALUES ('K', 'S'), ('K', 'S'), ('K', 'T')")
        assert (
            len(
                pg.execute(
                    "SELECT work_claim_v3('w', 60, 1, ARRAY['K'], ARRAY['S'], false)"
                ).fetchall()
            )
            == 1
        )
        assert (
            len(
                pg.execute(
                    "SELECT work_claim_v3('w', 60, 1, ARRAY['K'], ARRAY['S'], false)"
                ).fetchall()
            )
            == 1
        )
        dashboard = start_dashboard(
            dsn, "--allow-actions", env={"TRIOWORKER_DASHBOARD_TOKEN": TOKEN}
        )
        page = request(dashboard.url + "/scopes").body
        assert 'data-scope="S"' in page and 'data-limit="2" data-running="2"' in page
        assert 'data-limit="1" data-running="0"' in page and "default" in page

        def limits() -> list[tuple[Any, ...]]:
            return pg.execute("SELECT scope, running FROM work_limits ORDER BY scope").fetchall()

        form = {"scope": "T", "running": "3"}
        assert (
            request(dashboard.url + "/actions/limit", "POST", form=form, headers=JSON).status == 401
        )
        assert limits() == [("S", 2)]
        done = request(dashboard.url + "/actions/limit", "POST", form=form, headers=BEARER)
        assert done.status == 200, done.body
        assert json.loads(done.body)["message"] == "scope T: at most 3 Running"
        assert limits() == [("S", 2), ("T", 3)]
        for bad in ("0", "-1", "1.5", "two"):
            refused = request(
                dashboard.url + "/actions/limit", "POST", form={"scope": "T", "running": bad},
                headers=BEARER,
            )  # fmt: skip
            assert refused.status == 400, (bad, refused.body)
        rate = request(
            dashboard.url + "/actions/limit", "POST", form={"kind": "K", "rate": "0/s"},
            headers=BEARER,
        )  # fmt: skip
        assert rate.status == 400 and "at least one start" in json.loads(rate.body)["message"]
        assert limits() == [("S", 2), ("T", 3)]
