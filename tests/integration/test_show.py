"""Why an item failed, kept: `python -m trioworker show ID` and the Worker's logs."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import psycopg

from tests.integration.test_cli import trioworker
from tests.support.processes import wait_for, workers

Conn = psycopg.Connection[Any]
FAST = ["--lease", "4", "--heartbeat", "1", "--poll", "0.5"]


def test_a_failing_handlers_traceback_is_kept_and_shown(dsn: str, pg: Conn, tmp_path: Path) -> None:
    """A handler that raises KeyError is retried once, then fails. `show ID` prints its
    fields, payload, both attempts and the traceback; `show --json` carries the same;
    the Worker logged the traceback at WARNING for the retry and at ERROR at the end."""
    row = pg.execute(
        "INSERT INTO work_items (kind, scope, payload) VALUES ('Broken', 'cfg-7', '{\"p\": 1}')"
        " RETURNING id"
    ).fetchone()
    assert row is not None
    id = row[0]
    with workers(tmp_path) as start:
        worker = start(dsn, *FAST, "--log-format", "json", name="w")
        wait_for(
            lambda: (
                pg.execute("SELECT status FROM work_items WHERE id = %s", [id]).fetchone()
                == ("Failed",)
            ),
            30,
            "the item to fail",
        )
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    shown = trioworker("show", str(id), dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert f"item {id}  Broken  scope cfg-7  Failed (failed 2 of 2 attempts)" in text
    assert '"p": 1' in text
    assert "retried" in text and "failed" in text
    assert "Traceback (most recent call last)" in text
    assert "_look_up_the_path" in text and "KeyError: 'path'" in text
    details = json.loads(trioworker("show", str(id), "--json", dsn=dsn).stdout)
    assert [a["outcome"] for a in details["attempts"]] == ["retried", "failed"]
    assert all("KeyError: 'path'" in a["traceback"] for a in details["attempts"])
    assert details["item"]["traceback"].endswith("KeyError: 'path'\n")
    lines = [json.loads(line) for line in worker.output().splitlines()]
    logged = {(line["level"], line["message"].split(" (")[0]): line for line in lines
              if line.get("item_id") == id and "exception" in line}  # fmt: skip
    assert "KeyError: 'path'" in logged["WARNING", "handler failed"]["exception"]
    assert (
        "_look_up_the_path"
        in logged["ERROR", "handler failed for good: failed 2 of 2 attempts"]["exception"]
    )
    assert trioworker("show", "999999", dsn=dsn).returncode == 1


#: Item text that rich would read as markup, or a terminal as control sequences.
MARKUP_KIND = "[link=https://evil.example/]L[/link]"
OSC_KIND = "\x1b]0;PWNED\x07"
ERROR = "expected [int] got [str] [/data]"
#: A terminal's own styling (what rich writes with FORCE_COLOR), stripped before looking.
SGR = re.compile(r"\x1b\[[0-9;]*m")


def shown(*args: str, dsn: str) -> str:
    """What the command prints on a terminal 300 columns wide, without its colours; it
    must have succeeded and written no other control character."""
    result = trioworker(*args, dsn=dsn, env={"FORCE_COLOR": "1", "COLUMNS": "300"})
    assert result.returncode == 0, result.stderr
    text = SGR.sub("", result.stdout)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text), repr(text)
    return text


def test_status_and_show_print_item_text_literally(dsn: str, pg: Conn) -> None:
    """Kinds, scopes, dedup keys, errors, tracebacks, Worker ids, schedule names and
    paused scopes holding markup or escape sequences: `status` and `show` print each
    as it is (markup as its brackets, ESC and BEL as \\x1b and \\x07), never acting on
    it; `--json` carries the stored values exactly."""
    for kind in ("[/bold]", MARKUP_KIND, OSC_KIND):
        assert trioworker("enqueue", kind, "--scope", f"s{kind}", dsn=dsn).returncode == 0
    failed = pg.execute(
        "INSERT INTO work_items (kind, scope, status, attempt, failures, finished_at,"
        " reason, error, traceback, dedup_key) VALUES ('Crawl', %s, 'Failed', 1, 1, now(),"
        " 'failed 1 of 1 attempts', %s, %s, %s) RETURNING id",
        [OSC_KIND, ERROR, f"Traceback\nValueError: {ERROR} {OSC_KIND}\n", "[b]k[/b]"],
    ).fetchone()
    assert failed is not None
    pg.execute(
        "INSERT INTO work_attempts (item_id, attempt, worker_id, started_at, outcome, error,"
        " traceback) VALUES (%s, 1, %s, now(), 'failed', %s, 'tb')",
        [failed[0], OSC_KIND, ERROR],
    )
    pg.execute(
        "INSERT INTO work_items (kind, status, attempt, worker_id, started_at,"
        " lease_expires_at) VALUES ('Crawl', 'Running', 1, %s, now(), now() + interval '1 h')",
        ["[red]w[/red]"],
    )
    pg.execute(
        "INSERT INTO work_workers (id, host, pid, kinds, scopes, unscoped, concurrency)"
        " VALUES (%s, 'h', 1, %s, %s, true, 1)",
        ["[red]w[/red]", ["[/x]", OSC_KIND], ["[i]s[/i]"]],
    )
    pg.execute(
        "INSERT INTO work_schedules (name, kind, spec, next_due) VALUES (%s, %s, %s, now())",
        [MARKUP_KIND, "[/k]", "every 60s [/s]"],
    )
    pg.execute("INSERT INTO work_pauses (scope) VALUES (%s)", [f"p{OSC_KIND}"])

    status = shown("status", dsn=dsn)
    for text in ("[/bold]", MARKUP_KIND, "\\x1b]0;PWNED\\x07", ERROR, "[red]w[/red]", "[/x]",
                 "[i]s[/i]", "[/k]", "every 60s [/s]", "p\\x1b]0;PWNED\\x07"):  # fmt: skip
        assert text in status, text
    item = shown("show", str(failed[0]), dsn=dsn)
    for text in ("Crawl  scope \\x1b]0;PWNED\\x07", "[b]k[/b]", f"error: {ERROR}",
                 f"ValueError: {ERROR} \\x1b]0;PWNED\\x07"):  # fmt: skip
        assert text in item, text
    assert item.count(ERROR) == 3  # the error, its attempt's, the traceback's last line

    counts = json.loads(trioworker("status", "--json", dsn=dsn).stdout)["counts"]
    assert {"[/bold]", MARKUP_KIND, OSC_KIND} <= set(counts)
    details = json.loads(trioworker("show", str(failed[0]), "--json", dsn=dsn).stdout)
    assert (details["item"]["scope"], details["item"]["error"]) == (OSC_KIND, ERROR)
    assert details["attempts"][0]["worker_id"] == OSC_KIND


def test_show_renders_a_payload_python_cannot_decode(dsn: str, pg: Conn) -> None:
    """A payload of a 5,000-digit integer, stored by plain SQL (valid jsonb, past
    Python's 4,300 digits): `show` prints its reason and stored text, exit 0, and
    `show --json` gives it as {"undecodable": why, "text": the stored text, cut}.
    Needs the store's get_item to return it as an UndecodableValue."""
    row = pg.execute(
        "INSERT INTO work_items (kind, payload)"
        " VALUES ('K', ('[' || repeat('1', 5000) || ']')::jsonb) RETURNING id"
    ).fetchone()
    assert row is not None
    table = trioworker("show", str(row[0]), dsn=dsn)
    assert table.returncode == 0, table.stderr
    assert "(cannot be shown as JSON: " in table.stdout and "[1111111111" in table.stdout
    shown = trioworker("show", str(row[0]), "--json", dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    payload = json.loads(shown.stdout)["item"]["payload"]
    assert set(payload) == {"undecodable", "text"}
    assert payload["text"].startswith("[" + "1" * 1000) and payload["undecodable"]


def test_show_prints_counts_of_zero_as_zero(dsn: str, pg: Conn) -> None:
    """Priority, attempt, stalls and failures of 0 are shown as 0; what is unset (no
    dedup key, no worker, no cancel requested) as "-"."""
    row = pg.execute("INSERT INTO work_items (kind) VALUES ('K') RETURNING id").fetchone()
    assert row is not None
    shown = trioworker("show", str(row[0]), dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    fields = dict(
        re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in shown.stdout.splitlines()[1:8]
    )
    assert fields == {
        "priority": "0", "attempt": "0", "stalls": "0", "failures": "0",
        "dedup key": "-", "worker": "-", "cancel requested": "-",
    }  # fmt: skip


def test_show_says_why_a_queued_item_waits_and_json_lists_it(dsn: str, pg: Conn) -> None:
    """A Queued item of a paused kind that no Worker serves: `show` prints a `waiting:`
    line for each reason, and `show --json` has them under "waiting"."""
    pg.execute("SELECT work_pause_v1('Report', NULL)")
    row = pg.execute("INSERT INTO work_items (kind) VALUES ('Report') RETURNING id").fetchone()
    assert row is not None
    shown = trioworker("show", str(row[0]), dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    said = [line.strip() for line in shown.stdout.splitlines() if line.startswith("waiting:")]
    assert said == [
        "waiting: kind Report is paused",
        "waiting: no live Worker serves kind Report",
    ]
    as_json = trioworker("show", str(row[0]), "--json", dsn=dsn)
    assert json.loads(as_json.stdout)["waiting"] == [
        "kind Report is paused",
        "no live Worker serves kind Report",
    ]
