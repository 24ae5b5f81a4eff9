"""The dashboard's guard against guessing, stolen cookies, DNS rebinding and hostile
query strings and `next` links (docs/dashboard.md, "Actions: the token and CSRF").

Each test starts its own dashboard process (or, for a bind beyond loopback, serves
the dashboard in this process) on a fresh database, and speaks plain HTTP to it
unless a browser's reading of a page is the point.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest
import trio
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from tests.browser.driving import open_page, session_cookie, sign_in, until
from tests.browser.support import TOKEN, Answer, Dashboard, csrf_of, request
from tests.integration.test_cli import trioworker
from trioworker import PostgresStore
from trioworker.dashboard import serve

ACTING = {"TRIOWORKER_DASHBOARD_TOKEN": TOKEN}
JSON = {"Accept": "application/json"}
WRONG = {**JSON, "Authorization": "Bearer not-the-token-but-as-long-as-it"}
#: A wrong token costs a second (WRONG_TOKEN_DELAY); a sleep is never shorter, so a
#: lower bound a little under it holds on any machine.
AT_LEAST = 0.95


def _timed(call: Callable[[], Answer]) -> tuple[Answer, float]:
    begun = time.perf_counter()
    answer = call()
    return answer, time.perf_counter() - begun


def _wrong_sign_in(url: str) -> Answer:
    return request(url + "/login", "POST", form={"token": "not-the-token", "next": "/"})


def _wrong_bearer(url: str) -> Answer:
    return request(url + "/actions/pause", "POST", form={"kind": "K"}, headers=WRONG)


def test_a_wrong_bearer_token_costs_what_a_wrong_sign_in_costs(
    dsn: str, start_dashboard: Callable[..., Dashboard]
) -> None:
    """A wrong `Authorization: Bearer` token answers 401 after the second a wrong
    sign-in costs, not at once."""
    url = start_dashboard(dsn, "--allow-actions", env=ACTING).url
    signed, sign_in_took = _timed(lambda: _wrong_sign_in(url))
    bearer, bearer_took = _timed(lambda: _wrong_bearer(url))
    assert (signed.status, bearer.status) == (401, 401)
    assert sign_in_took >= AT_LEAST, sign_in_took
    assert bearer_took >= AT_LEAST, bearer_took


def test_guesses_sent_together_are_answered_one_at_a_time(
    dsn: str, start_dashboard: Callable[..., Dashboard]
) -> None:
    """Four wrong guesses sent at once (two sign-ins, two bearer tokens) take a second
    each, one after another: guessing in parallel gains nothing. The right token
    still acts once they are done."""
    url = start_dashboard(dsn, "--allow-actions", env=ACTING).url
    guesses = [_wrong_sign_in, _wrong_bearer, _wrong_sign_in, _wrong_bearer]
    begun = time.perf_counter()
    with ThreadPoolExecutor(len(guesses)) as pool:
        answers = list(pool.map(lambda guess: guess(url), guesses))
    took = time.perf_counter() - begun
    assert [a.status for a in answers] == [401] * len(guesses)
    assert took >= len(guesses) * AT_LEAST, took
    right = {**JSON, "Authorization": f"Bearer {TOKEN}"}
    assert request(url + "/actions/pause", "POST", form={"kind": "K"}, headers=right).status == 200


def test_logout_needs_the_csrf_token_and_ends_the_session_on_the_server(
    dsn: str, start_dashboard: Callable[..., Dashboard]
) -> None:
    """Signing out without the form's CSRF token, or from another site, is refused
    (403) and the session goes on; with it, the session ends on the server: a copy of
    the cookie kept from before no longer acts."""
    url = start_dashboard(dsn, "--allow-actions", env=ACTING).url
    signed_in = request(url + "/login", "POST", form={"token": TOKEN, "next": "/"})
    cookie = {"Cookie": str(signed_in.cookie())}
    csrf = csrf_of(request(url + "/pauses", headers=cookie).body)

    def pause(scope: str) -> int:
        form = {"scope": scope, "csrf": csrf}
        return request(url + "/actions/pause", "POST", form=form, headers={**cookie, **JSON}).status

    assert request(url + "/logout", "POST", form={}, headers=cookie).status == 403
    other_site = {**cookie, "Origin": "http://evil.example"}
    assert request(url + "/logout", "POST", form={"csrf": csrf}, headers=other_site).status == 403
    assert pause("still-signed-in") == 200

    out = request(url + "/logout", "POST", form={"csrf": csrf}, headers=cookie)
    assert out.status == 303 and out.headers["location"] == "/"
    assert "Max-Age=0" in out.headers["set-cookie"]
    assert pause("after-logout") == 401
    assert "sign in to act" in request(url + "/pauses", headers=cookie).body


def test_the_sign_out_button_ends_the_session(
    browser: Chrome, dsn: str, start_dashboard: Callable[..., Dashboard]
) -> None:
    """In chromium, "sign out" (its form carries the CSRF token) ends the session: the
    page offers signing in again, and the cookie it had no longer acts."""
    url = start_dashboard(dsn, "--allow-actions", env=ACTING).url
    sign_in(browser, url, TOKEN, "/pauses")
    cookie = session_cookie(browser)
    assert cookie is not None
    copied = {"Cookie": f"{cookie['name']}={cookie['value']}"}
    csrf = csrf_of(request(url + "/pauses", headers=copied).body)
    browser.find_element(By.CSS_SELECTOR, "#mode button").click()
    until(browser, lambda: browser.find_elements(By.ID, "sign-in"), what="signed out")
    form = {"kind": "K", "csrf": csrf}
    answer = request(url + "/actions/pause", "POST", form=form, headers={**copied, **JSON})
    assert answer.status == 401, answer.body


@pytest.mark.parametrize("host", ["127.1", "::ffff:127.0.0.1", "127.0.0.2", "localhost"])
def test_every_loopback_spelling_keeps_the_host_allow_list(
    dsn: str, start_dashboard: Callable[..., Dashboard], host: str
) -> None:
    """Bound to a loopback address however it is spelled, the dashboard answers to
    loopback host names and addresses only: `Host: evil.example` (DNS rebinding) gets
    400."""
    dashboard = start_dashboard(dsn, "--host", host)
    port = urllib.parse.urlsplit(dashboard.url).port
    assert request(dashboard.url + "/healthz", headers={"Host": "evil.example"}).status == 400
    assert (
        request(dashboard.url + "/healthz", headers={"Host": f"evil.example:{port}"}).status == 400
    )
    for name in ["localhost", "127.0.0.1", "[::1]", "[::ffff:7f00:1]"]:
        answer = request(dashboard.url + "/healthz", headers={"Host": f"{name}:{port}"})
        assert answer.status == 200, (name, answer.body)


def test_a_bind_beyond_loopback_needs_the_host_names_it_answers_to(dsn: str) -> None:
    """`--host 0.0.0.0` without `--allowed-host` is a usage error (exit 2) before it
    connects (the DSN here reaches nothing), naming the option."""
    unreachable = "host=127.0.0.1 port=1 connect_timeout=1"
    result = trioworker(
        "dashboard", "--host", "0.0.0.0", "--port", "0", dsn=unreachable, timeout=30
    )
    assert result.returncode == 2, result.stderr
    assert "--allowed-host" in result.stderr and "Traceback" not in result.stderr
    assert "dashboard listening" not in result.stderr


def test_the_command_line_passes_its_allowed_hosts_on(
    dsn: str, start_dashboard: Callable[..., Dashboard]
) -> None:
    """`dashboard --host 0.0.0.0 --allowed-host queue.example` starts, answers a
    request naming that host and refuses one naming another."""
    url = start_dashboard(dsn, "--host", "0.0.0.0", "--allowed-host", "queue.example").url
    port = urllib.parse.urlsplit(url).port
    local = f"http://127.0.0.1:{port}/healthz"
    assert request(local, headers={"Host": f"queue.example:{port}"}).status == 200
    assert request(local, headers={"Host": f"evil.example:{port}"}).status == 400


async def test_bound_beyond_loopback_it_answers_only_to_the_allowed_hosts(
    store: PostgresStore,
) -> None:
    """Served on 0.0.0.0 with allowed hosts, a request naming one of them (or a
    loopback name) is answered, one naming any other host (a DNS-rebinding page) gets
    400."""
    async with trio.open_nursery() as nursery:
        url: str = await nursery.start(
            partial(serve, store, host="0.0.0.0", port=0, allowed_hosts=["Queue.Example"])
        )
        port = urllib.parse.urlsplit(url).port
        local = f"http://127.0.0.1:{port}/healthz"

        def status(host: str) -> int:
            return request(local, headers={"Host": host}).status

        for host, expected in [
            (f"queue.example:{port}", 200),
            ("QUEUE.EXAMPLE.", 200),
            (f"localhost:{port}", 200),
            (f"evil.example:{port}", 400),
            ("queue.example.evil.example", 400),
        ]:
            assert await trio.to_thread.run_sync(status, host) == expected, host
        nursery.cancel_scope.cancel()


def test_a_query_value_with_a_nul_or_not_utf8_is_a_bad_request(
    dsn: str, start_dashboard: Callable[..., Dashboard]
) -> None:
    """A NUL in `?q=`, `?kind=` or any other query value, or a value that is not
    UTF-8, answers 400 (not 503 from the database, not a value with U+FFFD in it)."""
    url = start_dashboard(dsn).url
    for path in [
        "/scopes?q=%00",
        "/scopes?q=a%00b",
        "/failures?kind=%00",
        "/items?id=1%00",
        "/?anything=%00",
        "/pauses?%00=x",
        "/scopes?q=%FF",
        "/failures?kind=%C3",
    ]:
        answer = request(url + path)
        assert answer.status == 400, (path, answer.status, answer.body)
        assert "query" in answer.body, (path, answer.body)
    assert request(url + "/scopes?q=" + urllib.parse.quote("é ")).status == 200


#: `next` values a browser would read as another site (or that are not a plain path
#: of this one); the back link and the sign-in's redirect fall back to "/".
OFF_SITE = [
    "/\t/evil.example",
    "/\n/evil.example",
    "/\r/evil.example",
    "/\\evil.example",
    "\\/evil.example",
    "//evil.example",
    "/ /evil.example",
    " //evil.example",
    "/\x00/evil.example",
    "https://evil.example/",
    "javascript:alert(1)",
    "scopes",
]


def test_next_keeps_only_a_path_of_this_dashboard(
    browser: Chrome, dsn: str, start_dashboard: Callable[..., Dashboard]
) -> None:
    """An action's back link, the sign-in's redirect and the sign-in form keep `next`
    only when it is a path of this dashboard as a browser reads it (tabs, line breaks,
    backslashes and `//` would make it another site); in chromium the back link
    stays on the dashboard's origin."""
    url = start_dashboard(dsn, "--allow-actions", env=ACTING).url
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for nxt in [*OFF_SITE, "/scopes?q=a"]:
        expected = "/scopes?q=a" if nxt == "/scopes?q=a" else "/"
        outcome = request(url + "/actions/pause", "POST", form={"kind": "K", "next": nxt},
                          headers=bearer)  # fmt: skip
        assert f'<a href="{expected.replace("&", "&amp;")}">back</a>' in outcome.body, nxt
        login = request(url + "/login", "POST", form={"token": TOKEN, "next": nxt})
        assert login.headers["location"] == expected, nxt
        page = request(url + "/login?" + urllib.parse.urlencode({"next": nxt}))
        if "\x00" in nxt:  # no query value holds a NUL
            assert page.status == 400, nxt
        else:
            assert f'name="next" value="{expected}"' in page.body, nxt

    sign_in(browser, url, TOKEN, "/pauses")
    origin = urllib.parse.urlsplit(url)._replace(path="", query="").geturl()
    for nxt in OFF_SITE[:5]:
        open_page(browser, url + "/pauses")
        browser.execute_script(
            "const f = document.getElementById('pause-form');"
            "f.classList.remove('act'); f.querySelector('[name=next]').value = arguments[0];"
            "f.querySelector('[name=kind]').value = 'K'; f.submit();",
            nxt,
        )
        until(browser, lambda: browser.find_elements(By.ID, "outcome"), what="the outcome page")
        back = browser.find_element(By.LINK_TEXT, "back").get_attribute("href")
        assert urllib.parse.urlsplit(str(back))._replace(path="", query="").geturl() == origin
