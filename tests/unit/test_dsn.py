"""Where the password comes from, and how a DSN is shown without it."""

from __future__ import annotations

import pytest

from trioworker import ConfigurationError
from trioworker._dsn import _password, redact, redact_dsn, resolve_dsn


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
