"""What the terminal is shown of item text: `_text.visible`, and `status`, `show` and
the text log format printing kinds, scopes, errors and payloads literally."""

from __future__ import annotations

import io
import logging
import re
import sys
from typing import Any

import pytest
from rich.console import Console, RenderableType

from trioworker._cli.show import render_item
from trioworker._cli.status import render
from trioworker._core.text import visible
from trioworker._store.reads import STATUS_ORDER
from trioworker._worker.logging import TextFormatter

#: rich's own styling on a terminal, stripped before looking at what the text became.
SGR = re.compile(r"\x1b\[[0-9;]*m")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


@pytest.mark.parametrize(
    ("text", "line", "block"),
    [
        ("plain [b]markup[/b] stays", "plain [b]markup[/b] stays", None),
        ("\x1b]0;PWNED\x07", "\\x1b]0;PWNED\\x07", None),  # OSC: sets the window title
        ("\x1b[2J\x9b31m", "\\x1b[2J\\x9b31m", None),  # CSI, and C1's one-byte CSI
        ("a\x00b\x7fc\x85d", "a\\x00b\\x7fc\\x85d", None),  # NUL, DEL, NEL
        ("one\ntwo\tthree\r", "one\\ntwo\\tthree\\r", "one\ntwo\tthree\\r"),
        ("\udce9t\u00e9", "\\udce9t\u00e9", None),  # a lone surrogate; é stays
        ("\u202eevil\u2066\u2028", "\\u202eevil\\u2066\\u2028", None),  # bidi, separator
        ("caf\u00e9 \u00a0 \U0001f600 \u4e2d", "caf\u00e9 \u00a0 \U0001f600 \u4e2d", None),
    ],
)
def test_visible_escapes_what_a_terminal_would_act_on(
    text: str, line: str, block: str | None
) -> None:
    """C0 and C1 controls, DEL, lone surrogates, bidirectional controls and line
    separators become their escapes; printable text (markup, accents, emoji, CJK) is
    left alone; with `lines`, newlines and tabs stay."""
    assert visible(text) == line
    assert visible(text, lines=True) == (line if block is None else block)


def terminal(renderable: RenderableType) -> str:
    """`renderable` as rich writes it to a colour terminal, its own styling stripped:
    what is left must hold no control character (no OSC link, title, bell)."""
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="standard", width=300).print(renderable)
    text = SGR.sub("", out.getvalue())
    assert not CONTROL.search(text.replace("\n", "")), repr(text)
    return text


def status_of(**rows: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "counts": {}, "totals": dict.fromkeys(STATUS_ORDER, 0), "running": [],
        "busy_scopes": 0, "recent_failures": [],
        "workers": [], "unserved_kinds": {}, "schedules": [], "pauses": [],
    }  # fmt: skip
    return {**base, **rows}


HOSTILE = ["[/bold]", "[link=https://evil.example/]L[/link]", "\x1b]0;PWNED\x07",
           "expected [int] got [str]", "[/data]", ":thumbs_up:"]  # fmt: skip


@pytest.mark.parametrize("text", HOSTILE)
def test_status_shows_item_text_as_it_is(text: str) -> None:
    """A kind, scope, error, Worker id, schedule and pause holding markup, emoji codes or
    escape sequences: `status` prints each literally and never fails on it."""
    counts = dict.fromkeys(STATUS_ORDER, 1)
    status = status_of(
        counts={text: counts},
        running=[{"id": 1, "kind": text, "scope": text, "attempt": 1, "worker_id": text,
                  "lease_left": 3.0}],
        recent_failures=[{"id": 2, "kind": "K", "scope": None, "finished_at": None,
                          "reason": text, "error": text}],
        workers=[{"id": text, "kinds": [text], "scopes": [text], "concurrency": 1,
                  "last_seen": None, "alive": True}],
        schedules=[{"name": text, "kind": text, "scope": None, "spec": text,
                    "next_due": "2026-12-01T00:00:00", "last_item": None}],
        pauses=[{"kind": text, "scope": None}, {"kind": None, "scope": text}],
        unserved_kinds={text: 3},
    )  # fmt: skip
    shown = terminal(render(status))
    assert shown.count(visible(text)) >= 13, shown  # every place it went in


@pytest.mark.parametrize("text", HOSTILE)
def test_show_shows_item_text_as_it_is(text: str) -> None:
    """The item's kind, scope, dedup key, Worker, error and traceback, its attempts'
    Workers, outcomes and errors, and its parents' and children's kinds: `show` prints
    each literally and never fails on it."""
    item = dict.fromkeys(("requested_at", "run_after", "started_at", "heartbeat_at",
                          "lease_expires_at", "finished_at"))  # fmt: skip
    item.update(id=7, kind=text, scope=text, status="Failed", reason=text, priority=0,
                attempt=1, stalls=0, failures=1, dedup_key=text, worker_id=text,
                cancel_requested=False, payload={"p": text}, error=text,
                traceback=f"Traceback\nValueError: {text}\n")  # fmt: skip
    attempt = {"attempt": 1, "worker_id": text, "started_at": None, "ended_at": None,
               "outcome": text, "error": text}  # fmt: skip
    relatives = {"parents": [{"id": 3, "kind": text, "status": "Failed"}],
                 "children": [{"id": 9, "kind": text, "status": "Cancelled"}]}  # fmt: skip
    shown = terminal(render_item({"item": item, "attempts": [attempt], **relatives}))
    assert shown.count(visible(text)) >= 12, shown  # (the payload is JSON: \\u001b)


def test_a_payloads_c1_controls_are_escaped_where_json_leaves_them() -> None:
    """JSON escapes C0 controls but not DEL or C1 (\\x9b is a one-byte CSI) nor a lone
    surrogate: `show` escapes those in the payload it prints."""
    item = dict.fromkeys(("requested_at", "run_after", "started_at", "heartbeat_at",
                          "lease_expires_at", "finished_at", "scope", "reason", "dedup_key",
                          "worker_id", "error", "traceback"))  # fmt: skip
    item.update(id=7, kind="K", status="Queued", priority=0, attempt=0, stalls=0, failures=0,
                cancel_requested=False, payload={"p": "\x9b2J\x7f\udce9 \x1b"})  # fmt: skip
    shown = terminal(render_item({"item": item, "attempts": []}))
    assert '"p": "\\x9b2J\\x7f\\udce9 \\u001b"' in shown


def test_text_log_lines_escape_what_items_carry() -> None:
    """A Worker's text log line about an item with ESC, BEL, a newline or a surrogate in
    its kind, scope or Worker id, in the message and in the traceback's exception: each
    shown escaped; the line and the traceback keep their own line breaks."""
    try:
        raise ValueError("bad \x1b]0;PWNED\x07 value")
    except ValueError:
        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "trioworker", logging.WARNING, __file__, 1, "handler failed (%s)",
        ("\x1b[2Jwiped\r",), exc_info,
    )  # fmt: skip
    record.__dict__.update(kind="K\x1b]8;;https://evil.example/\x07", scope="a\nb",
                           worker_id="w\udce9")  # fmt: skip
    lines = TextFormatter("%(levelname)s %(message)s").format(record).splitlines()
    assert lines[0] == (
        "WARNING handler failed (\\x1b[2Jwiped\\r)"
        " [kind=K\\x1b]8;;https://evil.example/\\x07 scope=a\\nb worker_id=w\\udce9]"
    )
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: bad \\x1b]0;PWNED\\x07 value"


def test_quiesce_and_the_final_error_line_escape_what_they_quote(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What quiesce says holds a scope (the item's kind, its Worker) and the one line a
    failed command ends with show control characters escaped."""
    from trioworker._cli.main import report
    from trioworker._core.model import ScopeHolder
    from trioworker._store.quiesce import describe

    holder = ScopeHolder(id=3, attempt=1, kind="K\x1b]0;t\x07", worker_id="w\x1b[2J",
                         cancel_requested=False, lease_left=2.0)  # fmt: skip
    assert describe(holder).startswith("item 3 (K\\x1b]0;t\\x07) attempt 1 on Worker w\\x1b[2J:")
    assert report("no such kind \x1b]0;t\x07", "", "text", 1) == 1
    assert capsys.readouterr().err == "trioworker: error: no such kind \\x1b]0;t\\x07\n"


def test_show_renders_a_payload_that_could_not_be_decoded() -> None:
    """A stored payload Python cannot decode (an UndecodableValue, as the store returns
    it): the table shows why and its stored text, escaped; `--json` gives it as
    {"undecodable": why, "text": the stored text}, the other fields exactly."""
    import json

    from trioworker._core.jsontext import UndecodableValue

    item = dict.fromkeys(("requested_at", "run_after", "started_at", "heartbeat_at",
                          "lease_expires_at", "finished_at", "scope", "reason", "dedup_key",
                          "worker_id", "error", "traceback"))  # fmt: skip
    payload = UndecodableValue("nested too deeply for Python to decode", "[[[[\x1b]0;t\x07")
    item.update(id=7, kind="K", status="Queued", priority=0, attempt=0, stalls=0, failures=0,
                cancel_requested=False, payload=payload)  # fmt: skip
    details = {"item": item, "attempts": []}
    shown = terminal(render_item(details))
    assert (
        "payload\n(cannot be shown as JSON: nested too deeply for Python to decode)\n"
        "[[[[\\x1b]0;t\\x07\n"
    ) in shown
    from trioworker._cli.show import to_json

    decoded = json.loads(to_json(details))
    assert decoded["item"]["payload"] == {
        "undecodable": "nested too deeply for Python to decode",
        "text": "[[[[\x1b]0;t\x07",
    }
    assert {k: v for k, v in decoded["item"].items() if k != "payload"} == {
        k: v for k, v in item.items() if k != "payload"
    }


def test_argparses_own_errors_escape_what_they_echo(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown argument holding escape sequences: argparse's error (exit 2) shows it
    escaped."""
    from trioworker._cli.main import build_parser

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["status", "\x1b]0;PWNED\x07"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.endswith("error: unrecognized arguments: \\x1b]0;PWNED\\x07\n")


@pytest.mark.parametrize(
    "word",
    ["disk-7", " ws ", "it's", "a;b $(c) `d` \\e", "t\x1b]0;x\x07", "n\nl\tt\u0085\u202e\u4e2d"],
)
def test_shell_word_is_the_same_word_to_bash(word: str) -> None:
    """A scope as printed in a command line to copy: bash reads it back as exactly that
    word, and the printed form holds no control character."""
    import subprocess

    from trioworker._core.text import shell_word

    quoted = shell_word(word)
    assert not CONTROL.search(quoted) and visible(quoted) == quoted
    echoed = subprocess.run(
        ["bash", "-c", f"printf %s {quoted}"], capture_output=True, check=True, timeout=10
    )
    assert echoed.stdout == word.encode()
