"""The dashboard in a real browser, against a populated PostgreSQL and a live Worker.

One queue for the module (tests/browser/queue.py): a Worker process of
tests/browser/app.py, a read-only dashboard and one with actions allowed. The tests
run in this order and each reads the database at its own time: the pages, the live
refresh, the refusals, and last the actions (which change the queue).
Screenshots of the main pages go to docs/dashboard/*.png with
TRIOWORKER_RETAKE_SCREENSHOTS=1 (support.SCREENSHOTS).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import pytest
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from tests.browser.driving import click, notice, open_page, sign_in, until
from tests.browser.queue import APP, Conn, counts, ids, one, populate, settled
from tests.browser.support import (
    SCREENSHOTS,
    TOKEN,
    Dashboard,
    csrf_of,
    dashboards,
    request,
)
from tests.support.database import Databases
from tests.support.processes import WorkerProcess, wait_for, workers

STATUSES = ["Queued", "Running", "Succeeded", "Failed", "Cancelled"]


@attrs.frozen
class Queue:
    pg: Conn
    worker: WorkerProcess
    read_only: Dashboard
    actions: Dashboard


@pytest.fixture(scope="module")
def queue(databases: Databases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Queue]:
    tmp = tmp_path_factory.mktemp("dashboard")
    with (
        databases.database() as dsn,
        psycopg.connect(dsn, autocommit=True) as pg,
        workers(tmp) as start_worker,
        dashboards(tmp) as start_dashboard,
    ):
        populate(pg)
        worker = start_worker(dsn, "--concurrency", "4", "--poll", "0.5", "--heartbeat", "1",
                              "--lease", "20", name="w1", app=APP)  # fmt: skip
        read_only = start_dashboard(dsn)
        actions = start_dashboard(dsn, "--allow-actions", env={"TRIOWORKER_DASHBOARD_TOKEN": TOKEN})
        wait_for(lambda: settled(pg), 60, f"the Worker to settle the queue:\n{worker.output()}")
        yield Queue(pg, worker, read_only, actions)


def data(browser: Chrome, css: str, name: str = "data-n") -> str:
    value = until(
        browser, lambda: browser.find_element(By.CSS_SELECTOR, css).get_attribute(name),
        what=f"{css} [{name}]",
    )  # fmt: skip
    return str(value)


def texts(browser: Chrome, css: str) -> list[str]:
    return [
        str(e.get_attribute("textContent")) for e in browser.find_elements(By.CSS_SELECTOR, css)
    ]


def screenshot(browser: Chrome, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def test_every_page_shows_what_the_database_holds(  # noqa: PLR0915  one page after another
    browser: Chrome, queue: Queue
) -> None:
    """Overview, Running, Scopes, Failures, an item, Workers, Schedules and Pauses
    render, and their numbers are the database's; each is photographed for the docs."""
    pg, url = queue.pg, queue.read_only.url
    held = counts(pg)

    open_page(browser, url + "/")
    for kind in {k for k, _ in held}:
        for status in STATUSES:
            cell = f'#counts tr[data-kind="{kind}"] td[data-status="{status}"]'
            assert data(browser, cell) == str(held.get((kind, status), 0)), (kind, status)
    for status in STATUSES:
        total = sum(n for (_, s), n in held.items() if s == status)
        assert data(browser, f'#totals td[data-status="{status}"]') == str(total)
    assert data(browser, "#tile-running .value") == "3"
    due = one(pg, "SELECT count(*) FROM work_items WHERE status = 'Queued' AND run_after <= now()")
    assert data(browser, "#tile-queued [data-due]", "data-due") == str(due)
    assert data(browser, "#tile-queued [data-delayed]", "data-delayed") == "4"
    assert data(browser, "#tile-running [data-busy]", "data-busy") == "3"
    assert data(browser, "#tile-running [data-held]", "data-held") == "3"  # 2 cfg-1, 1 cfg-2
    assert data(browser, "#tile-workers .value") == "1"
    # The limit the app's Crawl handler declares, put in force by its Worker.
    assert data(browser, 'tr[data-limit="kind Crawl"] td[data-running]', "data-running") == "3"
    assert "3 of 4" in browser.find_element(By.CSS_SELECTOR, 'tr[data-limit="kind Crawl"]').text
    for status in ("Failed", "Cancelled", "Succeeded"):
        total = sum(n for (_, s), n in held.items() if s == status)
        assert data(browser, f"#tile-{status.lower()} .value") == str(total), status
    unserved = browser.find_element(By.ID, "unserved").text
    assert "Backup (3)" in unserved and "Report (1)" in unserved
    # The chart: every item finished within the hour is one of its bars' counts.
    finished = one(
        pg, "SELECT count(*) FROM work_items WHERE finished_at > now() - interval '59 min'"
    )
    # The chart takes the page's width (it left half a wide page empty).
    chart = browser.find_element(By.CSS_SELECTOR, "svg.chart")
    box = browser.find_element(By.CSS_SELECTOR, ".chart-box")
    assert chart.size["width"] >= 0.95 * box.size["width"] > 0
    bars = browser.find_elements(By.CSS_SELECTOR, "svg.chart rect[data-n]")
    assert sum(int(str(b.get_attribute("data-n"))) for b in bars) == finished
    assert not browser.find_elements(By.CSS_SELECTOR, "form.act")  # read-only: no actions
    assert browser.find_element(By.ID, "mode").text == "read-only"
    screenshot(browser, "overview")

    open_page(browser, url + "/running")
    running = ids(pg, "status = 'Running'")
    rows = browser.find_elements(By.CSS_SELECTOR, "#running tbody tr[data-id]")
    assert {int(str(r.get_attribute("data-id"))) for r in rows} == running
    for row in rows:
        assert "w1" in row.text and "Crawl" in row.text
    leases = texts(browser, "#running td[data-lease-left]")
    assert len(leases) == 3 and all("s" in lease for lease in leases)
    assert data(browser, "h1 .count") == "3"
    screenshot(browser, "running")

    open_page(browser, url + "/scopes")
    assert data(browser, '#scopes tr[data-scope="cfg-1"] td[data-waiting]', "data-waiting") == "2"
    assert "busy" in browser.find_element(By.CSS_SELECTOR, '#scopes tr[data-scope="cfg-1"]').text
    album9 = browser.find_element(By.CSS_SELECTOR, '#scopes tr[data-scope="album-9"]')
    assert "paused" in album9.text
    assert data(browser, '#scopes tr[data-scope="album-9"] td[data-waiting]', "data-waiting") == "2"
    screenshot(browser, "scopes")

    open_page(browser, url + "/failures")
    failed = ids(pg, "status = 'Failed'")
    shown = browser.find_elements(By.CSS_SELECTOR, "li.failure")
    assert {int(str(f.get_attribute("data-id"))) for f in shown} == failed
    for text in texts(browser, "li.failure"):
        assert "KeyError: 'codec'" in text and "_probe" in text and "Transcode" in text
    screenshot(browser, "failures")

    item = min(failed)
    open_page(browser, f"{url}/items/{item}")
    attempts = one(pg, "SELECT count(*) FROM work_attempts WHERE item_id = %s", [item])
    assert attempts == 2
    assert len(browser.find_elements(By.CSS_SELECTOR, "#attempts tr[data-attempt]")) == attempts
    payload = one(pg, "SELECT payload FROM work_items WHERE id = %s", [item])
    assert json.loads(browser.find_element(By.ID, "payload").text) == payload
    assert browser.find_element(By.CSS_SELECTOR, '[data-field="status"]').text == "Failed"
    assert not browser.find_elements(By.ID, "waiting")  # only a Queued item waits
    screenshot(browser, "item")

    # A Queued item says why it waits: its scope is paused (album-9), and a crawl
    # behind a running one of its storage config waits for it.
    held = min(ids(pg, "payload ->> 'photo' = 'held-1.jpg'"))
    open_page(browser, f"{url}/items/{held}")
    assert texts(browser, "#waiting li") == ["scope album-9 is paused"]
    behind = min(ids(pg, "kind = 'Crawl' AND scope = 'cfg-1' AND status = 'Queued'"))
    open_page(browser, f"{url}/items/{behind}")
    assert texts(browser, "#waiting li") == ["scope cfg-1 is full: 1 of 1 Running"]
    screenshot(browser, "item-waiting")

    open_page(browser, url + "/workers")
    assert data(browser, 'tr[data-worker="w1"]', "data-alive") == "yes"
    assert data(browser, 'tr[data-worker="old-box-1"]', "data-alive") == "no"
    assert "gone" in browser.find_element(By.CSS_SELECTOR, 'tr[data-worker="old-box-1"]').text
    assert "stopped" in browser.find_element(By.CSS_SELECTOR, 'tr[data-worker="night-shift"]').text
    assert data(browser, 'tr[data-worker="w1"] td[data-running]', "data-running") == "3"
    screenshot(browser, "workers")

    open_page(browser, url + "/schedules")
    schedule = browser.find_element(By.CSS_SELECTOR, 'tr[data-schedule="nightly-digest"]')
    assert "Digest" in schedule.text and "0 3 * * *" in schedule.text
    screenshot(browser, "schedules")

    open_page(browser, url + "/pauses")
    assert data(browser, 'tr[data-pause="scope:album-9"] td[data-held]', "data-held") == "2"
    assert data(browser, 'tr[data-pause="kind:Report"] td[data-held]', "data-held") == "1"
    screenshot(browser, "pauses")


def test_the_overview_updates_as_items_finish_without_a_reload(
    browser: Chrome, queue: Queue
) -> None:
    """Items enqueued while the overview is open show up as Succeeded by themselves:
    the page's live part is fetched again and swapped in; the page is never reloaded."""
    pg = queue.pg
    open_page(browser, queue.read_only.url + "/")
    before = int(data(browser, '#totals td[data-status="Succeeded"]'))
    browser.execute_script("window.notReloaded = true")
    pg.execute(
        "INSERT INTO work_items (kind, payload) SELECT 'Thumbnail', '{\"seconds\": 0.3}'"
        " FROM generate_series(1, 6)"
    )
    cell = '#totals td[data-status="Succeeded"]'
    until(browser, lambda: data(browser, cell) == str(before + 6), 30, "six more Succeeded")
    assert browser.execute_script("return window.notReloaded") is True
    assert one(pg, "SELECT count(*) FROM work_items WHERE status = 'Succeeded'") == before + 6
    assert browser.find_element(By.ID, "updated").text.startswith("updated")


def _state(pg: Conn) -> list[tuple[Any, ...]]:
    return [
        *pg.execute("SELECT kind, scope FROM work_pauses ORDER BY id").fetchall(),
        *pg.execute(
            "SELECT id, status, cancel_requested, attempt FROM work_items"
            " WHERE kind <> 'Thumbnail' ORDER BY id"
        ).fetchall(),
    ]


def test_an_action_without_the_token_is_refused_and_changes_nothing(
    browser: Chrome, queue: Queue
) -> None:
    """Without the token (or its session's CSRF token, or from another site, or on
    the read-only dashboard) an action answers 401/403 and the database is unchanged."""
    pg, url, read_only = queue.pg, queue.actions.url, queue.read_only.url
    before = _state(pg)
    running = min(ids(pg, "status = 'Running'"))
    json_ = {"Accept": "application/json"}
    form = {"scope": "cfg-1"}

    assert request(url + "/actions/pause", "POST", form=form, headers=json_).status == 401
    wrong = {**json_, "Authorization": "Bearer not-the-token-at-all"}
    assert request(url + "/actions/pause", "POST", form=form, headers=wrong).status == 401
    assert request(url + "/actions/cancel", "POST", form={"id": running}).status == 401
    right = {**json_, "Authorization": f"Bearer {TOKEN}"}
    refused = request(read_only + "/actions/pause", "POST", form=form, headers=right)
    assert refused.status == 403 and "read-only" in json.loads(refused.body)["message"]

    assert request(url + "/login", "POST", form={"token": "wrong", "next": "/"}).status == 401
    signed_in = request(url + "/login", "POST", form={"token": TOKEN, "next": "/scopes"})
    assert signed_in.status == 303 and signed_in.headers["location"] == "/scopes"
    cookie = {"Cookie": str(signed_in.cookie())}
    csrf = csrf_of(request(url + "/scopes", headers=cookie).body)
    no_csrf = request(url + "/actions/pause", "POST", form=form, headers={**cookie, **json_})
    assert no_csrf.status == 403 and "CSRF" in no_csrf.body
    with_csrf = {**form, "csrf": csrf}
    other_site = {**cookie, **json_, "Origin": "http://evil.example"}
    assert request(url + "/actions/pause", "POST", form=with_csrf, headers=other_site).status == 403
    cross = {**cookie, **json_, "Sec-Fetch-Site": "cross-site"}
    assert request(url + "/actions/pause", "POST", form=with_csrf, headers=cross).status == 403
    rebound = {**cookie, **json_, "Host": "evil.example"}
    assert request(url + "/actions/pause", "POST", form=with_csrf, headers=rebound).status == 400
    assert request(url + "/actions/pause", form=form).status == 405  # GET changes nothing

    # In the browser, before signing in: no action is offered.
    browser.delete_all_cookies()
    open_page(browser, url + "/scopes")
    assert not browser.find_elements(By.CSS_SELECTOR, "form.act")
    assert browser.find_element(By.ID, "sign-in").text == "sign in to act"
    assert _state(pg) == before


def test_actions_with_the_token_work(browser: Chrome, queue: Queue) -> None:
    """Signed in with the token, the page's buttons pause, resume, retry, cancel and
    quiesce, each seen in the database; a script may use the token as a Bearer header."""
    pg, url = queue.pg, queue.actions.url
    bearer = {"Accept": "application/json", "Authorization": f"Bearer {TOKEN}"}
    paused = request(url + "/actions/pause", "POST", form={"kind": "Backup"}, headers=bearer)
    assert paused.status == 200 and json.loads(paused.body)["message"] == "kind Backup paused"
    assert one(pg, "SELECT count(*) FROM work_pauses WHERE kind = 'Backup'") == 1

    # Not a wait for the address to end with /scopes: the sign-in page's own does.
    sign_in(browser, url, TOKEN, next="/scopes")
    until(browser, lambda: browser.find_element(By.ID, "mode").text.startswith("actions on"),
          what="the page to say actions are on")  # fmt: skip

    click(browser, '#scopes tr[data-scope="cfg-3"] button[data-action="pause"]')
    notice(browser, "scope cfg-3 paused")
    assert one(pg, "SELECT count(*) FROM work_pauses WHERE scope = 'cfg-3'") == 1
    screenshot(browser, "scopes-actions")

    # Quiesce cfg-2: paused, its Crawl asked to stop, and waited for.
    crawl = one(pg, "SELECT id FROM work_items WHERE scope = 'cfg-2' AND status = 'Running'")
    click(browser, '#scopes tr[data-scope="cfg-2"] button[data-action="quiesce"]')
    notice(browser, "scope cfg-2 is quiet")
    assert one(pg, "SELECT status FROM work_items WHERE id = %s", [crawl]) != "Running"
    assert one(pg, "SELECT count(*) FROM work_pauses WHERE scope = 'cfg-2'") == 1

    # Cancel cfg-1's Crawl from the Running page: it leaves the page by itself.
    open_page(browser, url + "/running")
    crawl = one(pg, "SELECT id FROM work_items WHERE scope = 'cfg-1' AND status = 'Running'")
    click(browser, f'#running tr[data-id="{crawl}"] button[data-action="cancel"]')
    notice(browser, f"item {crawl} is running: asked it to stop")
    wait_for(lambda: one(pg, "SELECT status FROM work_items WHERE id = %s", [crawl])
             == "Cancelled", 20, "the Crawl to stop")  # fmt: skip
    until(browser, lambda: not browser.find_elements(By.CSS_SELECTOR, f'tr[data-id="{crawl}"]'),
          what="the cancelled item to leave the Running page")  # fmt: skip

    # Retry a failure: it runs (and fails) again, two more attempts after the retry's
    # own mark in its history (attempt 3).
    open_page(browser, url + "/failures")
    failed = min(ids(pg, "status = 'Failed'"))
    click(browser, f'li.failure[data-id="{failed}"] button[data-action="retry"]')
    notice(browser, f"item {failed} queued again")
    wait_for(lambda: one(pg, "SELECT attempt FROM work_items WHERE id = %s", [failed]) == 5,
             20, "the retried item's two new attempts")  # fmt: skip

    # Resume the kind paused at the start, from the Pauses page.
    open_page(browser, url + "/pauses")
    click(browser, 'tr[data-pause="kind:Backup"] button[data-action="resume"]')
    notice(browser, "kind Backup resumed")
    assert one(pg, "SELECT count(*) FROM work_pauses WHERE kind = 'Backup'") == 0
    log = queue.actions.output()
    assert "pause by 127.0.0.1: scope cfg-3 paused" in log and TOKEN not in log
