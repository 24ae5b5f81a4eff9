"""The browser tests' fixtures: one chromium for the session, dashboards per test."""

# trio_asyncio before psycopg, or psycopg's async calls find no running event loop.
import trio_asyncio  # noqa: F401  isort: skip

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.browser.support import (
    CHROMEDRIVER,
    CHROMIUM,
    CHROMIUM_ARGS,
    Dashboard,
    dashboards,
    require_browser,
)


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    """Headless chromium with a fresh profile. Missing, it FAILS the test, saying how to
    install it, unless TRIOWORKER_SKIP_BROWSER=1 asks to skip."""
    require_browser(os.environ)
    profile = tmp_path_factory.mktemp("chromium-profile")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in [*CHROMIUM_ARGS, f"--user-data-dir={profile}"]:
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    # Bounds on every call, so a stalled chromedriver fails a test instead of hanging it
    # (selenium's own HTTP client otherwise waits as long as the socket default: forever).
    driver.command_executor.client_config.timeout = 120
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def start_dashboard(tmp_path: Path) -> Iterator[Callable[..., Dashboard]]:
    """start(dsn, *args, env=...): a dashboard process, stopped after the test."""
    with dashboards(tmp_path) as start:
        yield start
