"""What the dashboard's tests share: the browser, dashboard processes, plain HTTP.

The browser is Debian's chromium, driven by its chromedriver through Selenium; nothing
is downloaded at run time (scripts/install-browser.sh installs both with apt-get).
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.processes import ROOT

#: Debian's paths; the tests of the "browser missing" message point these elsewhere.
CHROMIUM = Path(os.environ.get("TRIOWORKER_TEST_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("TRIOWORKER_TEST_CHROMEDRIVER", "/usr/bin/chromedriver"))
SKIP_ENV = "TRIOWORKER_SKIP_BROWSER"
#: Where the dashboard's screenshots go: docs/dashboard with TRIOWORKER_RETAKE_SCREENSHOTS=1
#: (to retake the documentation's), else a scratch folder, so a test run leaves the
#: work tree as it found it.
SCREENSHOTS = (
    ROOT / "docs" / "dashboard"
    if os.environ.get("TRIOWORKER_RETAKE_SCREENSHOTS") == "1"
    else Path(tempfile.gettempdir()) / f"trioworker-screenshots-{os.getuid()}"
)
#: Chromium's switches: headless, no sandbox (containers), and nothing that calls home.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--window-size=1280,960",
]
TOKEN = "browser-test-token-0123456789abcdef"


def browser_problem(chromium: Path = CHROMIUM, chromedriver: Path = CHROMEDRIVER) -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    missing = [str(p) for p in (chromium, chromedriver) if not os.access(p, os.X_OK)]
    if not missing:
        return None
    return (
        f"the dashboard's browser tests need Debian's chromium and chromedriver; missing:"
        f" {', '.join(missing)}. Install them with scripts/install-browser.sh (apt-get"
        f" install chromium chromium-driver), or set {SKIP_ENV}=1 to skip these tests."
    )


def require_browser(
    environ: Mapping[str, str], chromium: Path = CHROMIUM, chromedriver: Path = CHROMEDRIVER
) -> None:
    """Skip when TRIOWORKER_SKIP_BROWSER=1 asks to; else FAIL (never skip) when the
    browser is missing, saying how to install it."""
    import pytest

    if environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1: the browser tests are skipped")
    problem = browser_problem(chromium, chromedriver)
    if problem:
        pytest.fail(problem, pytrace=False)


class Dashboard:
    """A `python -m trioworker dashboard` process on a free port."""

    def __init__(self, dsn: str, log_path: Path, *args: str, env: Mapping[str, str]) -> None:
        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trioworker", "--dsn", dsn, "dashboard", "--port", "0", *args],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.url = self._wait_for_url()

    def _wait_for_url(self, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r"dashboard listening on (http://\S+)", self.output())
            if found:
                return found[1]
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"the dashboard exited {self.proc.returncode}:\n{self.output()}"
                )
            time.sleep(0.05)
        raise AssertionError(f"the dashboard did not start in {timeout}s:\n{self.output()}")

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


@contextmanager
def dashboards(tmp_path: Path) -> Iterator[Callable[..., Dashboard]]:
    """start(dsn, *args, env=...) starts a dashboard process; all are stopped at the end."""
    started: list[Dashboard] = []

    def start(dsn: str, *args: str, env: Mapping[str, str] | None = None) -> Dashboard:
        environment = {k: v for k, v in os.environ.items() if k.startswith("TRIOWORKER_")}
        blank = dict.fromkeys(environment, "")  # nothing of the caller's leaks in
        name = f"dashboard-{len(started)}.log"
        dashboard = Dashboard(dsn, tmp_path / name, *args, env={**blank, **(env or {})})
        started.append(dashboard)
        return dashboard

    try:
        yield start
    finally:
        for dashboard in started:
            dashboard.stop()


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: str) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def cookie(self) -> str | None:
        """The `name=value` of the cookie the answer sets, if any."""
        value = self.headers.get("set-cookie")
        return value.split(";", 1)[0] if value else None


def request(
    url: str,
    method: str = "GET",
    *,
    form: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Answer:
    """One HTTP request, redirects not followed, the answer whatever its status."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    body = urllib.parse.urlencode(form, doseq=True) if form is not None else None
    sent = dict(headers or {})
    if body is not None:
        sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body, sent)
        response = conn.getresponse()
        text = response.read().decode()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, text)
    finally:
        conn.close()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF token on the page"
    return found[1]
