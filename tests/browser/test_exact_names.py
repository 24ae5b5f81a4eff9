"""The dashboard acts on exactly the kind or scope it shows, never a stripped or
otherwise changed name; a name a browser's form cannot send back as shown is refused.

A live Worker of tests/browser/app.py runs long Crawls in the scope `' ws '` (a space
either side) and in its look-alike `'ws'`; every action taken from the pages is then
checked against the database: it reached `' ws '`, and `'ws'` was never touched.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from tests.browser.driving import click, notice, open_page, sign_in, until
from tests.browser.queue import APP, Conn, one
from tests.browser.support import TOKEN, Dashboard, dashboards, request
from tests.support.database import Databases
from tests.support.processes import wait_for, workers

SCOPE = " ws "
LOOKALIKE = "ws"
ROW = f'#scopes tr[data-scope="{SCOPE}"]'
#: Names a form sends back changed: a CR in the page is read as LF, and a form posted
#: without the page's script sends each line break as CRLF.
UNSENDABLE = ["one\rCR", "two\nLF", "three\r\nCRLF"]

SETUP = """
INSERT INTO work_items (kind, scope, payload)
VALUES ('Crawl', %(scope)s, '{"root": "/srv/ws"}'), ('Crawl', %(lookalike)s, '{"root": "/srv/x"}'),
       ('Crawl', %(scope)s, '{"root": "/srv/ws/2"}')
"""


@pytest.fixture
def queue(databases: Databases, tmp_path: Any) -> Iterator[tuple[Conn, Dashboard]]:
    with (
        databases.database() as dsn,
        psycopg.connect(dsn, autocommit=True) as pg,
        workers(tmp_path) as start_worker,
        dashboards(tmp_path) as start_dashboard,
    ):
        pg.execute(SETUP, {"scope": SCOPE, "lookalike": LOOKALIKE})
        for name in UNSENDABLE:
            pg.execute("INSERT INTO work_items (kind, scope) VALUES ('Report', %s)", [name])
        worker = start_worker(dsn, "--concurrency", "3", "--poll", "0.5", "--heartbeat", "1",
                              "--lease", "20", name="w1", app=APP)  # fmt: skip
        wait_for(lambda: _running(pg) == sorted([SCOPE, LOOKALIKE]), 60,
                 f"both scopes' Crawls to run:\n{worker.output()}")  # fmt: skip
        yield pg, start_dashboard(dsn, "--allow-actions", env={"TRIOWORKER_DASHBOARD_TOKEN": TOKEN})


def _running(pg: Conn) -> list[str]:
    rows = pg.execute("SELECT scope FROM work_items WHERE status = 'Running'").fetchall()
    return sorted(r[0] for r in rows)


def _paused(pg: Conn) -> list[str]:
    rows = pg.execute("SELECT scope FROM work_pauses WHERE scope IS NOT NULL").fetchall()
    return sorted(r[0] for r in rows)


def _lookalike_untouched(pg: Conn) -> None:
    row = pg.execute(
        "SELECT status, cancel_requested FROM work_items WHERE scope = %s", [LOOKALIKE]
    ).fetchone()
    assert row == ("Running", False)
    assert LOOKALIKE not in _paused(pg)


def test_quiesce_pause_and_resume_reach_exactly_the_scope_shown(
    browser: Chrome, queue: tuple[Conn, Dashboard]
) -> None:
    """The scope `' ws '` is quiesced, resumed, paused and resumed again from the
    pages' buttons; each action reaches exactly `' ws '` in the database (its Running
    item stopped, its pause made and lifted) and never the look-alike `'ws'`."""
    pg, dashboard = queue
    first = one(pg, "SELECT min(id) FROM work_items WHERE scope = %s", [SCOPE])
    sign_in(browser, dashboard.url, TOKEN, "/scopes")
    row = until(browser, lambda: browser.find_element(By.CSS_SELECTOR, ROW))
    assert row.find_element(By.CSS_SELECTOR, "th").get_attribute("textContent") == SCOPE

    click(browser, f'{ROW} button[data-action="quiesce"]')
    notice(browser, "scope ' ws ' is quiet")
    assert one(pg, "SELECT status FROM work_items WHERE id = %s", [first]) == "Cancelled"
    assert _paused(pg) == [SCOPE]
    _lookalike_untouched(pg)

    click(browser, f'{ROW} button[data-action="resume"]')
    notice(browser, "scope ' ws ' resumed")
    assert _paused(pg) == []
    wait_for(lambda: _running(pg) == sorted([SCOPE, LOOKALIKE]), 30, "the next ' ws ' Crawl to run")

    click(browser, f'{ROW} button[data-action="pause"]')
    notice(browser, "scope ' ws ' paused")
    assert _paused(pg) == [SCOPE]

    open_page(browser, dashboard.url + "/pauses")
    click(browser, f'tr[data-pause="scope:{SCOPE}"] button[data-action="resume"]')
    notice(browser, "scope ' ws ' resumed")
    assert _paused(pg) == []
    _lookalike_untouched(pg)
    assert one(pg, "SELECT count(*) FROM work_items WHERE status = 'Cancelled'") == 1

    # The item page's scope link finds that scope, not its look-alike.
    open_page(browser, f"{dashboard.url}/items/{first}")
    browser.find_element(By.CSS_SELECTOR, "#fields a[href^='/scopes']").click()
    until(browser, lambda: browser.find_elements(By.CSS_SELECTOR, ROW), what="the scope found")
    shown = browser.find_elements(By.CSS_SELECTOR, "#scopes tr[data-scope]")
    assert [row.get_attribute("data-scope") for row in shown] == [SCOPE]


def test_a_name_a_form_cannot_send_back_is_refused_not_changed(
    browser: Chrome, queue: tuple[Conn, Dashboard]
) -> None:
    """Scopes with a CR, an LF or a CRLF in them: their pause buttons answer 400 with
    the reason, from the page's script and as a plain form post alike, and nothing is
    paused (neither the name shown nor what the browser sent instead)."""
    pg, dashboard = queue
    sign_in(browser, dashboard.url, TOKEN, "/scopes")
    for name in UNSENDABLE:
        start = name.split("\r")[0].split("\n")[0]
        click(browser, f'#scopes tr[data-scope^="{start}"] button[data-action="pause"]')
        said = notice(browser, "cannot act on a scope")
        assert "line break" in said, said
        browser.execute_script("document.getElementById('notice').textContent = ''")
    bearer = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}
    for name in UNSENDABLE:
        answer = request(dashboard.url + "/actions/pause", "POST", form={"scope": name},
                         headers=bearer)  # fmt: skip
        assert answer.status == 400 and "line break" in answer.body, answer.body
    # The plain post (the form without the script) of the first row.
    browser.execute_script(
        "const f = document.querySelector(arguments[0]).form;"
        "f.classList.remove('act'); f.submit();",
        '#scopes tr[data-scope^="two"] button[data-action="pause"]',
    )
    until(browser, lambda: browser.find_elements(By.ID, "outcome"), what="the outcome page")
    assert "line break" in browser.find_element(By.ID, "outcome").text
    assert _paused(pg) == []
