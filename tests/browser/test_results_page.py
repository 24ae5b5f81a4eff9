"""The dashboard's item page shows a Succeeded item's result and the item's recorded
steps (issue 34), written escaped whatever they hold."""

from __future__ import annotations

import json
from pathlib import Path

import markupsafe
import psycopg

from tests.browser.queue import one
from tests.browser.support import dashboards, request
from tests.support.database import Databases

HOSTILE = "<script>alert(1)</script> {{ 7*7 }}"


def test_the_item_page_shows_the_result_and_the_steps(databases: Databases, tmp_path: Path) -> None:
    """A Succeeded item's page has its result (as JSON, escaped) and a Steps table:
    each step's name, the attempt that recorded it and its value; an item without
    steps has no such table, and a Queued item no result."""
    with (
        databases.database() as dsn,
        psycopg.connect(dsn, autocommit=True) as pg,
        dashboards(tmp_path) as start,
    ):
        done = one(pg, "INSERT INTO work_items (kind, status, attempt, started_at, finished_at,"
                       " result) VALUES ('Crawl', 'Succeeded', 2, now(), now(), %s) RETURNING id",
                   [json.dumps({"folders": 2, "note": HOSTILE})])  # fmt: skip
        pg.execute(
            "INSERT INTO work_steps (item_id, name, attempt, result)"
            " VALUES (%s, 'scan /photos/2024', 1, '[\"a.jpg\"]'), (%s, %s, 2, '7')",
            [done, done, f"scan {HOSTILE}"],
        )
        queued = one(pg, "INSERT INTO work_items (kind) VALUES ('Crawl') RETURNING id")
        dashboard = start(dsn)
        page = request(f"{dashboard.url}/items/{done}")
        assert page.status == 200, page.body[-2000:]
        assert "<h2>Result</h2>" in page.body and 'id="result"' in page.body
        assert str(markupsafe.escape(HOSTILE)) in page.body and "<script>alert" not in page.body
        assert '<table id="steps">' in page.body
        assert "scan /photos/2024" in page.body and "a.jpg" in page.body
        assert str(markupsafe.escape(f"scan {HOSTILE}")) in page.body
        other = request(f"{dashboard.url}/items/{queued}")
        assert other.status == 200
        assert 'id="result"' not in other.body and 'id="steps"' not in other.body
