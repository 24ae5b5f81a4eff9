"""`python -m trioworker dashboard` as users start it, and the browser tests' own rules.

What it refuses before it listens (exit 2 for usage, 1 for runtime errors), what it
says when it starts, and that a machine without chromium fails the browser tests with
the way to install it (unless TRIOWORKER_SKIP_BROWSER=1 asks to skip them).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver import Chrome

from tests.browser.support import (
    CHROMEDRIVER,
    CHROMIUM,
    TOKEN,
    Dashboard,
    request,
    require_browser,
)
from tests.integration.test_cli import trioworker
from tests.support.database import Databases
from tests.support.processes import ROOT

#: (options, the token in the environment, what the one line of error says).
BAD_OPTIONS = [
    (["--port", "70000"], None, "argument --port: must be at least 0 and at most 65535"),
    (["--port", "http"], None, "argument --port: must be an integer"),
    (["--allow-actions"], None, "--allow-actions needs a token: set $TRIOWORKER_DASHBOARD_TOKEN"),
    (["--allow-actions"], "short", "token is too short"),
    (["--token-file", "/etc/hostname"], None, "--token-file goes with --allow-actions"),
    (["--allow-actions", "--token-file", "/nonexistent/t"], None, "cannot read --token-file"),
    (["--allow-actions", "--token", "s3cret"], None, "unrecognized arguments: --token ***"),
]

#: Runs each case through `main` in one child process (a process per case costs about
#: two seconds), then once more without the dashboard's extra; prints [code, stderr]s.
CHILD = """
import contextlib, io, json, os, sys
from trioworker._cli.main import main

def run(argv, token):
    os.environ.pop("TRIOWORKER_DASHBOARD_TOKEN", None)
    if token is not None:
        os.environ["TRIOWORKER_DASHBOARD_TOKEN"] = token
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(["--dsn", "host=/nonexistent", "dashboard", *argv])
        except SystemExit as exit:
            code = exit.code
    return [code, err.getvalue()]

results = [run(argv, token) for argv, token in json.loads(sys.argv[1])]
for name in [m for m in sys.modules if m.startswith(("trioworker.dashboard", "jinja2"))]:
    del sys.modules[name]
sys.modules["jinja2"] = None  # the dashboard's extra missing
results.append(run([], None))
print(json.dumps(results))
"""


def test_bad_options_are_a_usage_error_and_so_is_a_missing_extra() -> None:
    """A bad port, actions without a token (or with a short one), a token file that
    cannot be read: one line, exit 2, before anything connects. There is no --token
    option, not even as an abbreviation of --token-file (a value shows in `ps`).
    Without the dashboard's extra, it names the extra to install, exit 2."""
    cases = json.dumps([[args, token] for args, token, _ in BAD_OPTIONS])
    child = subprocess.run([sys.executable, "-c", CHILD, cases], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert child.returncode == 0, child.stderr
    results = json.loads(child.stdout)
    expected = [m for _, _, m in BAD_OPTIONS] + ["pip install starlette hypercorn jinja2"]
    for (code, stderr), message in zip(results, expected, strict=True):
        assert code == 2, (message, stderr)
        assert message in stderr and "Traceback" not in stderr, (message, stderr)
    assert results[-1][1].count("\n") == 1


def test_it_refuses_an_unmigrated_database_and_a_port_in_use(
    databases: Databases, dsn: str
) -> None:
    """An unmigrated database and a port another process holds are each one line,
    exit 1."""
    with databases.database(migrated=False) as empty:
        result = trioworker("dashboard", "--port", "0", dsn=empty)
    assert result.returncode == 1 and "run `python -m trioworker migrate`" in result.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = trioworker("dashboard", "--port", str(port), dsn=dsn)
    assert result.returncode == 1, result.stderr
    assert f"cannot listen on 127.0.0.1 port {port}" in result.stderr
    assert result.stderr.count("\n") == 1


def test_it_says_where_it_listens_and_whether_it_may_act(
    dsn: str, tmp_path: Path, start_dashboard: Any
) -> None:
    """At start it logs its URL, on 127.0.0.1 by default, read-only or with actions;
    the token comes from a file (or the environment) and never shows in a log."""
    read_only: Dashboard = start_dashboard(dsn)
    assert read_only.url.startswith("http://127.0.0.1:")
    assert f"dashboard listening on {read_only.url} (read-only)" in read_only.output()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    acting: Dashboard = start_dashboard(dsn, "--allow-actions", "--token-file", str(token_file))
    assert f"{acting.url} (actions allowed with the token)" in acting.output()
    bearer = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}
    answer = request(acting.url + "/actions/pause", "POST", form={"kind": "K"}, headers=bearer)
    assert answer.status == 200, answer.body
    assert TOKEN not in acting.output() and "can be read by other users" not in acting.output()
    assert request(acting.url + "/healthz").body == "ok\n"


def test_chromium_runs_headless_with_a_fresh_profile(browser: Chrome) -> None:
    """The browser the tests drive is headless chromium, driven by WebDriver."""
    assert "HeadlessChrome" in browser.execute_script("return navigator.userAgent")
    assert browser.execute_script("return navigator.webdriver") is True


def test_without_chromium_the_browser_tests_fail_saying_how_to_install_it() -> None:
    """Chromium missing: the browser fixture FAILS the test, naming
    scripts/install-browser.sh; only TRIOWORKER_SKIP_BROWSER=1 makes it a skip."""
    missing = Path("/nonexistent/chromium")
    with pytest.raises(pytest.fail.Exception, match=r"scripts/install-browser\.sh"):
        require_browser({}, missing, CHROMEDRIVER)
    with pytest.raises(pytest.fail.Exception, match="TRIOWORKER_SKIP_BROWSER=1"):
        require_browser({"TRIOWORKER_SKIP_BROWSER": "0"}, missing, CHROMEDRIVER)
    with pytest.raises(pytest.skip.Exception):
        require_browser({"TRIOWORKER_SKIP_BROWSER": "1"}, missing, CHROMEDRIVER)
    require_browser({}, CHROMIUM, CHROMEDRIVER)  # here, both are installed
