"""Where the password comes from, and how a DSN is shown without it."""

from __future__ import annotations

import pytest

from trioworker import ConfigurationError
from trioworker._postgres.dsn import _password, redact, redact_dsn, resolve_dsn, secrets


def test_a_bad_dsn_says_what_is_wrong_with_it() -> None:
    """The error names the parse problem, with the DSN shown masked."""
    with pytest.raises(ConfigurationError) as raised:
        resolve_dsn("host=db password=s3cr3t port")
    assert str(raised.value).startswith(
        'bad DSN <unparseable DSN>: missing "=" after "port" in connection info string'
    )


def test_the_password_is_the_dsns_else_pgpassword(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DSN's own password wins; without one, libpq would use $PGPASSWORD, so that is
    the secret to mask; with neither, there is none."""
    monkeypatch.setenv("PGPASSWORD", "from-env")
    assert _password("host=db password=s3cr3t") == "s3cr3t"
    assert _password("host=db") == "from-env"
    assert redact("login from-env failed", "host=db") == "login *** failed"
    monkeypatch.delenv("PGPASSWORD")
    assert _password("host=db") is None
    assert _password("host=db password=") is None
    assert _password("host=db port") is None  # unparseable: nothing to mask
    assert redact("nothing to hide", "host=db") == "nothing to hide"


def test_redact_dsn_shows_what_libpq_would_use() -> None:
    """The DSN as conninfo with the password masked; a DSN without one is unchanged;
    an empty DSN is libpq's defaults; an unparseable one is not echoed at all."""
    assert redact_dsn("password=s3cr3t host=db") == "password=*** host=db"
    assert redact_dsn("host=db") == "host=db"
    assert redact_dsn("") == "<libpq defaults>"
    assert redact_dsn("host=db password=s3cr3t port") == "<unparseable DSN>"


def test_without_a_dsn_libpq_s_choice_is_spelled_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty DSN is never a silent choice: the PG* variables libpq would use."""
    from trioworker._postgres.dsn import describe_defaults

    for name, value in [
        ("PGUSER", "alice"), ("PGHOST", "db.example"), ("PGDATABASE", "media"), ("PGPORT", "6543"),
    ]:  # fmt: skip
        monkeypatch.setenv(name, value)
    assert describe_defaults() == (
        "libpq connects as user alice to database media on db.example, port 6543"
    )


def test_libpq_defaults_it_does_not_know_are_described(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where libpq has no value (no PG* variable, no compiled-in default), the text
    says what libpq falls back to."""
    import psycopg

    from trioworker._postgres.dsn import describe_defaults

    class Option:
        def __init__(self, keyword: bytes) -> None:
            self.keyword, self.val = keyword, None

    unknown = [Option(k) for k in (b"user", b"host", b"dbname", b"port")]
    monkeypatch.setattr(psycopg.pq.Conninfo, "get_defaults", staticmethod(lambda: unknown))
    assert describe_defaults() == (
        "libpq connects as user (the OS user) to database (the OS user) (the user's name)"
        " on the local socket, port 5432"
    )


#: DSNs libpq cannot parse (or parses into something else), each with the password
#: s3cretPW somewhere: URIs with a bad escape, an unclosed bracket, a password in the
#: query or holding a `/` or an `@`; key=value with an unclosed quote, a missing `=`,
#: an escaped space, `password=` not first.
MALFORMED = [
    "postgresql://u:s3cretPW%zz@127.0.0.1/db",
    "postgresql://u:s3cretPW@[::1/db",
    "postgres://127.0.0.1/db?sslmode=disable&password=s3cretPW%zz",
    "postgresql://u:s3cret/PW@127.0.0.1/db",
    "postgresql://u:s3c@retPW@127.0.0.1/db",
    "host=db password='s3cretPW port=5",
    "host=db password=s3cretPW port",
    "host=db password = s3cret\\ PW port",
    "port=5 password='s3cret\\'PW' dbname",
    "PASSWORD=s3cretPW host",
]


@pytest.mark.parametrize("dsn", MALFORMED)
def test_a_malformed_dsns_password_is_masked_whatever_its_shape(dsn: str) -> None:
    """The password of a DSN libpq cannot parse is still known to `secrets`: neither
    the DSN's own error nor any message carrying the DSN shows it, nor any piece of it
    that libpq would read as a host or a port."""
    shown = redact(f"connecting with {dsn}: failed", dsn)
    assert "s3c" not in shown.lower() and "PW" not in shown, shown
    assert shown.startswith("connecting with ") and shown.endswith(": failed")
    try:
        resolve_dsn(dsn)
    except ConfigurationError as exc:
        assert "s3c" not in str(exc).lower() and "PW" not in str(exc), exc


def test_secrets_are_the_password_in_every_form_longest_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A parsed password and its escaped spelling; $PGPASSWORD too; nothing for a DSN
    without one."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    assert secrets("postgres://u:s%41cret@h/db") == ("s%41cret", "sAcret")
    assert secrets("host=db password='a\\'b'") == ("a\\'b", "a'b")
    assert secrets("host=db port=5") == ()
    monkeypatch.setenv("PGPASSWORD", "from-env")
    assert secrets("host=db port") == ("from-env",)


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        # quoted, closed and not: the quotes are never part of it
        ("host=db password='s3cr et'", ("s3cr et",)),
        ("host=db password='s3cret", ("s3cret",)),
        ("host=db password=''", ()),
        ("host=db password='", ()),
        # a backslash escape, raw and unescaped (libpq cannot parse the rest)
        ("host=db password=se\\cret port='x", ("se\\cret", "secret")),
        # a URI query's password ends at the next parameter (a URI libpq cannot parse)
        ("postgresql://[::1/db?password=abc&x=1", ("abc&x=1", "abc")),
        # each piece of a URI password libpq would read as a host or port
        ("postgresql://u:ab:cd@[::1/db", ("ab:cd", "ab", "cd")),
    ],
)
def test_secrets_of_each_shape(
    monkeypatch: pytest.MonkeyPatch, dsn: str, expected: tuple[str, ...]
) -> None:
    monkeypatch.delenv("PGPASSWORD", raising=False)
    assert secrets(dsn) == expected


def test_secrets_keep_pgpassword_beside_the_dsns_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """$PGPASSWORD is masked too, beside a keyword or URI password libpq cannot parse."""
    monkeypatch.setenv("PGPASSWORD", "from-env-1")
    assert secrets("host=db password='s3cret") == ("from-env-1", "s3cret")
    assert secrets("postgresql://u:pw@[::1/db") == ("from-env-1", "pw")


def test_a_dsn_that_is_not_utf8_is_a_bad_dsn() -> None:
    """$TRIOWORKER_DSN holding bytes that are not UTF-8 (Python's surrogateescape): a
    ConfigurationError saying so, not a UnicodeEncodeError; nothing of it shown."""
    with pytest.raises(ConfigurationError, match=r"^bad DSN: it is not UTF-8 text$"):
        resolve_dsn("host=db password=s3\udcff")
    assert redact_dsn("host=db password=s3\udcff") == "<unparseable DSN>"
