"""How long the overview of a 10,000-item queue takes to render (docs/dashboard.md).

The target is under a second; the bound here is a generous 3 s (the machine is
shared and noisy). A page's time is what its reader waits, and the documented target is
in seconds, so the bound is one too; the test runs alone (tests/support/alone.py), no
other test of the run competing for the cores. The measured figures are printed on
every run:

    ./dev test tests/browser/test_overview_speed.py
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg
import pytest
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from tests.browser.support import Dashboard, request

ITEMS = 10_000
BOUND = 3.0
#: 10,000 items: 6,000 Succeeded over the last hour, 400 Failed (with a traceback and
#: an attempt each), 100 Cancelled, 50 Running, 3,450 Queued of which 1,000 delayed,
#: across 12 kinds and 350 scopes; and 20 Workers.
POPULATE = """
INSERT INTO work_items (kind, scope, payload, status, attempt, failures, requested_at,
                        run_after, started_at, finished_at, reason, error, traceback)
SELECT 'Kind' || (n % 12), 's' || (n % 300), jsonb_build_object('n', n), st, 1,
       CASE WHEN st = 'Failed' THEN 1 ELSE 0 END, t, t, t, t,
       CASE WHEN st = 'Failed' THEN 'failed 1 of 1 attempts' END,
       CASE WHEN st = 'Failed' THEN 'KeyError: ''path''' END,
       CASE WHEN st = 'Failed' THEN repeat('  File "handler.py", line 7, in run' || chr(10), 20) END
FROM generate_series(1, 6500) AS n,
     LATERAL (SELECT CASE WHEN n <= 6000 THEN 'Succeeded' WHEN n <= 6400 THEN 'Failed'
                          ELSE 'Cancelled' END,
                     now() - make_interval(secs => (n % 3590)::float8)) AS x(st, t);
INSERT INTO work_attempts (item_id, attempt, worker_id, started_at, ended_at, outcome, error)
SELECT id, 1, 'w-1', started_at, finished_at, 'failed', error
FROM work_items WHERE status = 'Failed';
INSERT INTO work_items (kind, scope, status, attempt, worker_id, requested_at, run_after,
                        started_at, heartbeat_at, lease_expires_at)
SELECT 'Kind' || (n % 12), 'run-' || n, 'Running', 1, 'w-' || (n % 20),
       now() - interval '2 min', now() - interval '2 min', now() - interval '1 min',
       now() - interval '5 s', now() + interval '55 s'
FROM generate_series(1, 50) AS n;
INSERT INTO work_items (kind, scope, payload, run_after)
SELECT 'Kind' || (n % 12), CASE WHEN n % 10 = 0 THEN NULL ELSE 's' || (n % 350) END,
       jsonb_build_object('n', n),
       CASE WHEN n <= 1000 THEN now() + make_interval(mins => n) ELSE now() END
FROM generate_series(1, 3450) AS n;
INSERT INTO work_workers (id, host, pid, kinds, scopes, unscoped, concurrency)
SELECT 'w-' || n, 'host-' || (n % 4), 1000 + n, ARRAY['Kind' || (n % 12)], NULL, true, 4
FROM generate_series(0, 19) AS n;
ANALYZE;
"""


@pytest.mark.alone
def test_the_overview_of_10000_items_renders_within_the_bound(
    dsn: str, pg: psycopg.Connection[Any], browser: Chrome, start_dashboard: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """GET / of a 10,000-item queue takes well under 3 s (the target is 1 s): its
    median over 7 requests after a warm-up, and in the browser, page to load event."""
    pg.execute(POPULATE)  # type: ignore[call-overload]
    assert pg.execute("SELECT count(*) FROM work_items").fetchone() == (ITEMS,)
    dashboard: Dashboard = start_dashboard(dsn)
    url = dashboard.url + "/"
    for _ in range(2):
        assert request(url).status == 200
    took, database = [], []
    for _ in range(7):
        started = time.perf_counter()
        answer = request(url)
        took.append(time.perf_counter() - started)
        assert answer.status == 200 and 'data-n="10000"' in answer.body
        timing = dict(p.split(";dur=") for p in answer.headers["server-timing"].split(", "))
        database.append(float(timing["db"]) / 1000)
    browser.get(url)
    assert browser.find_element(By.CSS_SELECTOR, "#totals td:last-child").text == "10,000"
    loaded = (
        browser.execute_script(
            "const n = performance.getEntriesByType('navigation')[0];"
            " return n.loadEventEnd > 0 ? n.loadEventEnd : performance.now();"
        )
        / 1000
    )
    median = statistics.median(took)
    with capsys.disabled():
        print(
            f"\noverview of {ITEMS:,} items: median {median * 1000:.0f} ms, max"
            f" {max(took) * 1000:.0f} ms over {len(took)} GETs (database reads: median"
            f" {statistics.median(database) * 1000:.0f} ms); in chromium, loaded in"
            f" {loaded * 1000:.0f} ms"
        )
    assert median < BOUND
    assert loaded < BOUND
