"""Why an item failed, kept: `python -m trioworker show ID` and the Worker's logs."""

from __future__ import annotations

import json
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
