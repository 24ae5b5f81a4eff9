"""How the dashboard's pages read (issue 20): every column heading sits over its
column as the numbers below it do (the Scopes page's headers sat left of their
right-aligned numbers), and the header's "updated" clock is UTC on the 24-hour clock,
like the "as of" line below every page."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from tests.browser.driving import open_page, until
from tests.browser.queue import APP, Conn
from tests.browser.support import Dashboard, dashboards
from tests.support.database import Databases
from tests.support.processes import ROOT, wait_for, workers

#: For each table on the page: (heading, its alignment, the first row's cell below it,
#: that cell's alignment), wherever the two differ.
MISALIGNED = """
const out = [];
for (const table of document.querySelectorAll("#live table")) {
  const heads = table.querySelectorAll("thead th");
  const row = [...table.querySelectorAll("tbody tr")].find((r) => !r.querySelector("[colspan]"));
  if (!row) continue;
  heads.forEach((th, i) => {
    const cell = row.children[i];
    if (!cell || !th.textContent.trim()) return;
    const a = getComputedStyle(th).textAlign, b = getComputedStyle(cell).textAlign;
    const norm = (x) => (x === "start" || x === "left" || x === "-webkit-left" ? "left" : x);
    if (norm(a) !== norm(b)) out.push([table.id, th.textContent.trim(), norm(a), norm(b)]);
  });
}
return out;
"""


@pytest.fixture
def queue(databases: Databases, tmp_path: Any) -> Iterator[tuple[Conn, Dashboard]]:
    """Running Crawls in two scopes, more queued behind one, a third scope paused."""
    with (
        databases.database() as dsn,
        psycopg.connect(dsn, autocommit=True) as pg,
        workers(tmp_path) as start_worker,
        dashboards(tmp_path) as start_dashboard,
    ):
        pg.execute(
            "INSERT INTO work_items (kind, scope) VALUES ('Crawl', 'cfg-1'), ('Crawl', 'cfg-1'),"
            " ('Crawl', 'cfg-2'), ('Crawl', 'cfg-3')"
        )
        subprocess.run(
            [sys.executable, "-m", "trioworker", "--dsn", dsn, "pause", "--scope", "cfg-3"],
            cwd=ROOT, check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        worker = start_worker(dsn, "--concurrency", "3", "--poll", "0.5", "--heartbeat", "1",
                              "--lease", "20", name="w1", app=APP)  # fmt: skip
        running = "SELECT count(*) FROM work_items WHERE status = 'Running'"
        wait_for(lambda: pg.execute(running).fetchone() == (2,), 60,
                 f"two Crawls to run:\n{worker.output()}")  # fmt: skip
        yield pg, start_dashboard(dsn)


@pytest.mark.parametrize("page", ["/scopes", "/running", "/workers", "/pauses"])
def test_every_heading_is_aligned_with_its_column(
    browser: Chrome, queue: tuple[Conn, Dashboard], page: str
) -> None:
    """A heading over right-aligned numbers is right-aligned too."""
    _, dashboard = queue
    open_page(browser, dashboard.url + page)
    until(browser, lambda: browser.find_elements(By.CSS_SELECTOR, "#live tbody tr"))
    assert browser.execute_script(MISALIGNED) == []


def test_the_header_clock_is_utc_on_the_24_hour_clock(
    browser: Chrome, queue: tuple[Conn, Dashboard]
) -> None:
    """The header's clock reads "updated 15:04:05 UTC", never the browser's local
    12-hour "3:04:05 PM"."""
    _, dashboard = queue
    open_page(browser, dashboard.url + "/scopes")
    stamp = until(
        browser, lambda: browser.find_element(By.ID, "updated").text, what="the updated stamp"
    )
    assert re.fullmatch(r"updated \d\d:\d\d:\d\d UTC", stamp), stamp
    asof = browser.find_element(By.CSS_SELECTOR, ".asof").text
    assert asof.endswith("UTC, by the database's clock"), asof
