"""The dashboard's pure rules: which names an action takes, where `next` may lead,
which hosts it answers to, how stored text is written, and how sessions end."""

from __future__ import annotations

import pytest

from trioworker.dashboard._actions import Refused, pause, shown
from trioworker.dashboard._app import safe_next
from trioworker.dashboard._format import finalize, name, text
from trioworker.dashboard._guardrails import query_problem
from trioworker.dashboard._security import (
    SESSION_SECONDS,
    Guard,
    allowed_host,
    allowed_hosts,
    host_allowed,
    is_loopback,
)
from trioworker.testing import MemoryStore


async def test_pause_takes_the_name_exactly_and_refuses_what_a_form_changes() -> None:
    """`' ws '` is paused as `' ws '`; a name with a CR, LF or NUL is refused (400),
    an empty field is no name."""
    store = MemoryStore()
    done = await pause(store, {"scope": [" ws "], "kind": [""]})
    assert done.details == {"kind": None, "scope": " ws ", "changed": True}
    assert [p.scope for p in await store.pauses()] == [" ws "]
    for bad in ["a\rb", "a\nb", "a\r\nb", "a\x00b"]:
        with pytest.raises(Refused) as refused:
            await pause(store, {"scope": [bad]})
        assert refused.value.status == 400
    assert len(await store.pauses()) == 1


@pytest.mark.parametrize(
    ("name", "written"),
    [("cfg-1", "cfg-1"), (" ws ", "' ws '"), ("a\x1bb", "'a\\x1bb'"), ("'q'", "\"'q'\"")],
)
def test_a_message_quotes_a_name_that_would_not_read_unambiguously(name: str, written: str) -> None:
    """Plain names bare; edge whitespace, controls or a leading quote: quoted."""
    assert shown(name) == written


@pytest.mark.parametrize(
    "value",
    ["/", "/scopes", "/scopes?q=a%20b&x=1", "/items/3#attempts", "/%2F/evil.example"],
)
def test_next_keeps_a_path_of_this_dashboard(value: str) -> None:
    """A path starting with one slash, of printable ASCII, survives as it is."""
    assert safe_next(value) == value


@pytest.mark.parametrize(
    "value",
    [None, "", "scopes", "//evil.example", "/\\evil.example", "\\\\evil.example",
     "/\t/evil.example", "/\n/evil.example", "/\r/evil.example", "/ /evil.example",
     " /scopes", "/\x00", "/\x7f", "https://evil.example", "javascript:alert(1)",
     "/sc\u00f6pes"],
)  # fmt: skip
def test_next_refuses_what_a_browser_could_read_as_another_site(value: str | None) -> None:
    """Tabs and line breaks (which a browser drops), backslashes (read as `/`), `//`,
    spaces, controls, non-ASCII, schemes: back to "/"."""
    assert safe_next(value) == "/"


@pytest.mark.parametrize(
    "host",
    ["localhost", "LOCALHOST.", "127.0.0.1", "127.1", "127.0.0.2", "0x7f.1", "2130706433",
     "::1", "[::1]", "::ffff:127.0.0.1", "::ffff:7f00:1"],
)  # fmt: skip
def test_every_spelling_of_loopback_is_loopback(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "0", "::", "10.0.0.1", "::ffff:10.0.0.1", "evil.example", "", "127.1 x"]
)
def test_other_addresses_and_names_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_the_host_header_names_loopback_or_an_allowed_name() -> None:
    """Loopback names and addresses always; allowed names case-insensitively, with a
    port or a trailing dot; nothing else (a DNS-rebinding page's own name)."""
    allowed = allowed_hosts(["Queue.Example", "queue.example:8080", "[2001:db8::1]"])
    assert allowed == {"queue.example", "2001:db8::1"}
    for header in ["localhost:8080", "127.1", "[::ffff:7f00:1]:80", "QUEUE.example.:8080",
                   "queue.example", "[2001:db8::1]:9"]:  # fmt: skip
        assert host_allowed(header, allowed), header
    for header in ["evil.example", "queue.example.evil.example", "", "queue.example:1:2"]:
        assert not host_allowed(header, allowed), header


@pytest.mark.parametrize("value", ["", " ", "a b", "qu\u00e9ue.example", "a/b", "user@host"])
def test_an_allowed_host_must_be_a_host_name(value: str) -> None:
    with pytest.raises(ValueError, match="not a host name"):
        allowed_host(value)


@pytest.mark.parametrize(
    ("query", "problem"),
    [(b"", None), (b"q=a%20b&kind=K", None), (b"q=%C3%A9", None),
     (b"q=%00", "NUL"), (b"%00=x", "NUL"), (b"q=%FF", "UTF-8"), (b"q=\xc3\xa9", "UTF-8")],
)  # fmt: skip
def test_a_query_string_is_percent_encoded_utf8_without_nul(
    query: bytes, problem: str | None
) -> None:
    found = query_problem(query)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_stored_text_is_written_with_its_hidden_characters_as_escapes() -> None:
    """finalize (every value) escapes controls, bidi and invisible characters on one
    line; `text` keeps tabs and newlines; `name` marks edge whitespace; markup the
    templates made passes through."""
    assert finalize("a\x1b]0;x\x07b\u202ec\ufeff\nd") == "a\\x1b]0;x\\x07b\\u202ec\\ufeff\\nd"
    assert finalize(3) == 3
    assert str(text("<b>\tx\ny\x1b</b>")) == "&lt;b&gt;\tx\ny\\x1b&lt;/b&gt;"
    assert str(name(" ws ")) == '<span class="edge"> </span>ws<span class="edge"> </span>'
    assert str(name("<i>")) == "&lt;i&gt;"


def test_a_session_ends_when_signed_out_or_expired() -> None:
    """A session is valid until end_session or SESSION_SECONDS; a cookie this process
    did not issue (or altered) never is."""
    now = [1_000_000.0]
    guard = Guard("t" * 16, key=b"k" * 32, clock=lambda: now[0])
    first, second = guard.new_session(), guard.new_session()
    assert guard.session_valid(first) and guard.session_valid(second)
    guard.end_session(first)
    assert not guard.session_valid(first) and guard.session_valid(second)
    assert not guard.session_valid(second[:-1] + ("0" if second[-1] != "0" else "1"))
    other = Guard("t" * 16, key=b"k" * 32, clock=lambda: now[0])  # same key, not issued
    assert not other.session_valid(second)
    now[0] += SESSION_SECONDS
    assert not guard.session_valid(second)
