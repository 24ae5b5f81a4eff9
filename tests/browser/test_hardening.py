"""The dashboard's guard against guessing, stolen cookies, DNS rebinding and hostile
query strings and `next` links (docs/dashboard.md, "Actions: the token and CSRF").

Each test starts its own dashboard process (or, for a bind beyond loopback, serves
the dashboard in this process) on a fresh database, and speaks plain HTTP to it
unless a browser's reading of a page is the point.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from functools import partial

import pytest
import trio

from tests.browser.support import Dashboard, request
from tests.integration.test_cli import trioworker
from trioworker import PostgresStore
from trioworker.dashboard import serve


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
    """`--host 0.0.0.0` without `--allowed-host` is refused before it listens, naming
    the option."""
    result = trioworker("dashboard", "--host", "0.0.0.0", "--port", "0", dsn=dsn, timeout=30)
    assert result.returncode != 0, result.stderr
    assert "--allowed-host" in result.stderr and "Traceback" not in result.stderr
    assert "dashboard listening" not in result.stderr


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
