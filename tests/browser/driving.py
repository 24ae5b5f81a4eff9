"""Driving chromium through the dashboard's pages: waits that tolerate the live refresh
swapping elements out, clicks, notices and signing in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

FLAKY = (StaleElementReferenceException, NoSuchElementException)


def until(browser: Chrome, check: Callable[[], Any], timeout: float = 20, what: str = "") -> Any:
    """The first true value of `check()`, tried while the page refreshes under it."""
    return WebDriverWait(browser, timeout, poll_frequency=0.1, ignored_exceptions=FLAKY).until(
        lambda _: check(), message=what
    )


def open_page(browser: Chrome, url: str) -> None:
    browser.get(url)
    until(browser, lambda: browser.find_element(By.ID, "live"), what=f"{url} to load")


def click(browser: Chrome, css: str) -> None:
    """Click the button at `css`, found afresh if a refresh swapped it out."""

    def clicked() -> bool:
        browser.find_element(By.CSS_SELECTOR, css).click()
        return True

    until(browser, clicked, what=f"to click {css}")


def notice(browser: Chrome, expected: str) -> str:
    """The notice an action left, once it says `expected`."""
    shown = browser.find_element(By.ID, "notice")
    until(browser, lambda: expected in shown.text, what=f"a notice saying {expected!r}")
    return str(shown.text)


def sign_in(browser: Chrome, url: str, token: str, next: str = "/") -> None:
    """A fresh session: the cookies dropped, then the token typed on the sign-in page."""
    browser.delete_all_cookies()
    open_page(browser, f"{url}/login?next={next}")
    browser.find_element(By.NAME, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    # The sign-in page's own address ends with `next` too (`/login?next=/pauses`): wait
    # for the path itself, and for the session cookie the sign-in set.
    until(browser, lambda: urlsplit(browser.current_url).path == next, what=f"back on {next}")
    until(browser, lambda: session_cookie(browser), what="the session cookie")


def session_cookie(browser: Chrome) -> dict[str, Any] | None:
    """The dashboard's session cookie in `browser`, if it holds one."""
    return next((c for c in browser.get_cookies() if c["name"].startswith("trioworker_")), None)
