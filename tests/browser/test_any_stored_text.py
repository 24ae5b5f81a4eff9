"""Whatever other programs stored, every page of the dashboard renders it: a payload
Python cannot decode, and kinds, scopes, errors and tracebacks holding HTML, template
and rich markup, terminal escapes (ESC, OSC) and bidirectional controls, all written
escaped, each control character as its visible escape. Numbers in query strings and
forms are ASCII digits only.

The rows go in as plain SQL, as any program may write them, inside the table's
constraints.
"""

from __future__ import annotations

import html
import re
import urllib.parse
from collections.abc import Iterator
from typing import Any

import markupsafe
import psycopg
import pytest
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from tests.browser.driving import open_page
from tests.browser.queue import Conn, one
from tests.browser.support import TOKEN, Dashboard, dashboards, request
from tests.support.database import Databases

HOSTILE = "<script>alert(1)</script> [/bold] {{ 7*7 }} \x1b]0;PWNED\x07 \u202egnp.exe &amp;"
#: HOSTILE as a page shows it: each control character written as its escape.
SHOWN = r"<script>alert(1)</script> [/bold] {{ 7*7 }} \x1b]0;PWNED\x07 \u202egnp.exe &amp;"
#: What no page may carry raw: C0 and C1 controls but tab and newline, DEL, and the
#: bidirectional controls.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
#: The Arabic-Indic digits, which int() and float() read as 0-9.
ARABIC_INDIC = str.maketrans("0123456789", "".join(chr(0x660 + d) for d in range(10)))
TEN = "10".translate(ARABIC_INDIC)

KIND, SCOPE, BUSY = f"kind:{HOSTILE}", f"scope:{HOSTILE}", f"busy:{HOSTILE}"
ERROR, REASON, WORKER = f"error:{HOSTILE}", f"reason:{HOSTILE}", f"worker:{HOSTILE}"
TRACEBACK = f'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: {HOSTILE}'
SCHEDULE = f"schedule:{HOSTILE}"

SETUP = """
INSERT INTO work_items (kind, scope, payload, status, attempt, failures, worker_id,
                        started_at, finished_at, reason, error, traceback, dedup_key)
VALUES (%(kind)s, %(scope)s, jsonb_build_object('html', %(hostile)s::text), 'Failed', 1, 1,
        %(worker)s, now() - interval '2 s', now(), %(reason)s, %(error)s, %(traceback)s,
        %(hostile)s);
INSERT INTO work_attempts (item_id, attempt, worker_id, started_at, outcome, error, traceback)
SELECT id, 1, %(worker)s, now() - interval '2 s', 'failed', %(error)s, %(traceback)s
FROM work_items WHERE kind = %(kind)s;
INSERT INTO work_items (kind, scope, status, attempt, worker_id, started_at, heartbeat_at,
                        lease_expires_at)
VALUES (%(kind)s, %(busy)s, 'Running', 1, %(worker)s, now(), now(), now() + interval '1 h');
INSERT INTO work_items (kind, scope) VALUES (%(kind)s, %(busy)s), (%(kind)s, %(scope)s);
INSERT INTO work_items (kind, payload) VALUES ('Poison', ('[' || repeat('1', 5000) || ']')::jsonb);
SELECT work_pause_v1(%(kind)s, NULL), work_pause_v1(NULL, %(scope)s);
INSERT INTO work_workers (id, host, pid, kinds, scopes, unscoped, concurrency)
VALUES (%(worker)s, %(hostile)s, 1, ARRAY[%(kind)s], ARRAY[%(scope)s], true, 1);
INSERT INTO work_schedules (name, kind, scope, spec, next_due)
VALUES (%(schedule)s, %(kind)s, %(scope)s, %(hostile)s, now() + interval '1 h');
"""


def _shown(text: str) -> str:
    """`text` (a field with HOSTILE in it) as it must appear in a page's HTML."""
    return str(markupsafe.escape(text.replace(HOSTILE, SHOWN)))


@pytest.fixture
def stored(databases: Databases, tmp_path: Any) -> Iterator[tuple[Conn, Dashboard, Dashboard]]:
    with (
        databases.database() as dsn,
        psycopg.connect(dsn, autocommit=True) as pg,
        dashboards(tmp_path) as start,
    ):
        params = {"kind": KIND, "scope": SCOPE, "busy": BUSY, "hostile": HOSTILE,
                  "error": ERROR, "reason": REASON, "worker": WORKER, "traceback": TRACEBACK,
                  "schedule": SCHEDULE}  # fmt: skip
        for statement in SETUP.split(";\n"):
            if statement.strip():
                pg.execute(statement, params)  # type: ignore[call-overload]
        yield (
            pg,
            start(dsn),
            start(dsn, "--allow-actions", env={"TRIOWORKER_DASHBOARD_TOKEN": TOKEN}),
        )


def _failed(pg: Conn) -> int:
    return int(one(pg, "SELECT id FROM work_items WHERE status = 'Failed'"))


def test_an_item_whose_payload_python_cannot_decode_is_shown(
    browser: Chrome, stored: tuple[Conn, Dashboard, Dashboard]
) -> None:
    """A payload of one 5,000-digit integer (valid jsonb, past Python's digit limit):
    its page answers 200 and shows why it cannot be shown as JSON, and its text."""
    pg, read_only, _ = stored
    poison = one(pg, "SELECT id FROM work_items WHERE kind = 'Poison'")
    answer = request(f"{read_only.url}/items/{poison}")
    assert answer.status == 200, answer.body[-2000:]
    assert "cannot be shown as JSON" in answer.body and "[" + "1" * 1000 in answer.body
    open_page(browser, f"{read_only.url}/items/{poison}")
    payload = browser.find_element(By.ID, "payload").text
    assert payload.startswith("(cannot be shown as JSON: ") and "1" * 1000 in payload


def test_every_page_writes_stored_text_escaped(
    browser: Chrome, stored: tuple[Conn, Dashboard, Dashboard]
) -> None:
    """Markup, template syntax, terminal escapes and bidi controls in kinds, scopes,
    reasons, errors, tracebacks, Workers and schedules: every page and its live part
    answer 200 with each written escaped, no control character raw; in chromium no
    script runs and the text reads as stored, its controls as escapes."""
    pg, read_only, _ = stored
    item = f"/items/{_failed(pg)}"
    expected = {
        "/": [KIND],
        "/running": [KIND, BUSY, WORKER],
        "/scopes": [SCOPE, BUSY, KIND],
        "/failures": [KIND, SCOPE, REASON, ERROR, TRACEBACK],
        "/workers": [WORKER, HOSTILE, KIND, SCOPE],
        "/schedules": [SCHEDULE, KIND, SCOPE, HOSTILE],
        "/pauses": [KIND, SCOPE],
        item: [KIND, SCOPE, REASON, ERROR, TRACEBACK, WORKER, HOSTILE],
    }
    for path, fields in expected.items():
        for headers in ({}, {"X-Trioworker-Fragment": "1"}):
            answer = request(read_only.url + path, headers=headers)
            assert answer.status == 200, (path, answer.body[-2000:])
            assert "<script>alert" not in answer.body, path
            raw = RAW_CONTROL.search(answer.body)
            assert raw is None, (path, raw and answer.body[raw.start() - 80 : raw.end() + 80])
            for field in fields:
                assert _shown(field) in answer.body, (path, field)
    for path in expected:
        open_page(browser, read_only.url + path)  # an alert() would fail the next call
        assert browser.title.endswith("· trioworker"), path
        live = str(browser.find_element(By.ID, "live").get_attribute("textContent"))
        assert SHOWN in live and "\x1b" not in live, path


def test_action_forms_carry_each_name_exactly(stored: tuple[Conn, Dashboard, Dashboard]) -> None:
    """Signed in, the pages with actions answer 200 and their forms' hidden fields hold
    each kind and scope exactly as stored (escape sequences and all), so an action
    reaches the name whose escapes the page shows."""
    _, _, acting = stored
    signed_in = request(acting.url + "/login", "POST", form={"token": TOKEN, "next": "/"})
    cookie = {"Cookie": str(signed_in.cookie())}
    sent: set[str] = set()
    for path in ["/scopes", "/pauses"]:
        answer = request(acting.url + path, headers=cookie)
        assert answer.status == 200 and "<script>alert" not in answer.body, path
        fields = re.findall(r'<input type="hidden" name="(?:kind|scope)" value="([^"]*)">',
                            answer.body)  # fmt: skip
        sent |= {html.unescape(value) for value in fields}
    assert {KIND, SCOPE, BUSY} <= sent


def test_ids_and_numbers_are_ascii_digits_only(
    stored: tuple[Conn, Dashboard, Dashboard],
) -> None:
    """`/items?id=` an Arabic-Indic digit one finds nothing rather than item 1; an offset,
    a form's id or a quiesce timeout in other digits is refused with 400, changing
    nothing."""
    pg, read_only, acting = stored
    first = one(pg, "SELECT min(id) FROM work_items")
    arabic = str(first).translate(ARABIC_INDIC)
    assert int(arabic) == first  # what int() makes of it
    found = request(f"{read_only.url}/items?{urllib.parse.urlencode({'id': arabic})}")
    assert found.status == 404, found.headers
    assert request(f"{read_only.url}/items?id={first}").status == 303  # ASCII: found
    offset = request(f"{read_only.url}/failures?{urllib.parse.urlencode({'offset': TEN})}")
    assert offset.status == 400
    bearer = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}
    before = pg.execute(
        "SELECT id, status, cancel_requested FROM work_items ORDER BY id"
    ).fetchall()
    for action, form in [
        ("cancel", {"id": arabic}),
        ("retry", {"id": arabic}),
        ("quiesce", {"scope": "quiet-one", "timeout": TEN}),
    ]:
        answer = request(f"{acting.url}/actions/{action}", "POST", form=form, headers=bearer)
        assert answer.status == 400, (action, answer.body)
    after = pg.execute("SELECT id, status, cancel_requested FROM work_items ORDER BY id").fetchall()
    assert after == before
    assert one(pg, "SELECT count(*) FROM work_pauses WHERE scope = 'quiet-one'") == 0
