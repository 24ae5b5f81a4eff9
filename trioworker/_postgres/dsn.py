"""Where the DSN comes from, and how it is shown without its password."""

from __future__ import annotations

import os
import re
import urllib.parse

import psycopg.conninfo
import psycopg.pq

from trioworker._core.errors import ConfigurationError
from trioworker._core.settings import DSN_ENV


def resolve_dsn(explicit: str | None = None) -> str:
    """The DSN: `explicit` (--dsn), else $TRIOWORKER_DSN, else "" (libpq then reads
    PGHOST, PGUSER, ...); ConfigurationError, its password masked, if libpq cannot
    parse it."""
    dsn = explicit if explicit is not None else os.environ.get(DSN_ENV, "")
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        detail = redact(" ".join(str(exc).split()), dsn)
        raise ConfigurationError(f"bad DSN {redact_dsn(dsn)}: {detail}") from None
    except UnicodeEncodeError:  # bytes that are not UTF-8, from $TRIOWORKER_DSN
        raise ConfigurationError("bad DSN: it is not UTF-8 text") from None
    return dsn


def describe_defaults() -> str:
    """Where libpq goes with no DSN: its defaults and the PG* variables set, shown so an
    empty DSN is never a silent choice of database."""
    defaults = {
        o.keyword.decode(): (o.val or b"").decode() for o in psycopg.pq.Conninfo.get_defaults()
    }
    user = defaults.get("user") or "(the OS user)"
    host = defaults.get("host") or "the local socket"
    dbname = defaults.get("dbname") or f"{user} (the user's name)"
    port = defaults.get("port") or "5432"
    return f"libpq connects as user {user} to database {dbname} on {host}, port {port}"


def _password(dsn: str) -> str | None:
    """The password libpq would use: the DSN's, else $PGPASSWORD; None for neither (or
    a DSN libpq cannot parse: `secrets` covers those)."""
    try:
        value = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
    except (psycopg.ProgrammingError, UnicodeEncodeError):
        return None
    return str(value) if value else os.environ.get("PGPASSWORD") or None


#: `password=VALUE` in key=value form or in a URI's query: VALUE quoted (up to the
#: closing quote, or the end when there is none) or bare (up to white space); a
#: backslash escapes the next character in both.
_KEYWORD_PASSWORD = re.compile(
    r"password\s*=\s*('(?:[^'\\]|\\.)*'?|(?:[^\s\\]|\\.)*\\?)", re.IGNORECASE
)
#: A URI's user information: `scheme://user:PASSWORD@`, PASSWORD up to the last `@`.
_URI_PASSWORD = re.compile(r"^\s*[a-z][a-z0-9+.-]*://[^:@]*:(.*)@", re.IGNORECASE | re.DOTALL)


def secrets(dsn: str) -> tuple[str, ...]:
    """Every text the DSN's password may show as, longest first, whatever the DSN's
    shape: parsed by libpq if it can be; else found by the shapes libpq reads (a URI's
    user information, `password=` anywhere), raw and unescaped, and each piece of a URI
    password that libpq would read as something else (a host, a port). Guesses for a
    malformed DSN may mask more than the password; never less."""
    found = {_password(dsn) or "", os.environ.get("PGPASSWORD", "")}
    for match in _KEYWORD_PASSWORD.finditer(dsn):
        value = match[1]
        if value.startswith("'"):  # quoted: to the closing quote, or the end
            value = value[1:]
            value = value.removesuffix("'")
        found |= {value, re.sub(r"\\(.)", r"\1", value), value.split("&")[0]}
    uri = _URI_PASSWORD.match(dsn)
    if uri:
        password = uri[1]
        found |= {password, *re.split(r"[/:@?#&]", password)}
    found |= {urllib.parse.unquote(s) for s in found}
    return tuple(sorted((s for s in found if s), key=lambda s: (-len(s), s)))


def redact_dsn(dsn: str) -> str:
    """The DSN as a conninfo string with its password replaced by ***."""
    try:
        parts = psycopg.conninfo.conninfo_to_dict(dsn)
    except (psycopg.ProgrammingError, UnicodeEncodeError):
        return "<unparseable DSN>"
    if parts.get("password"):
        parts["password"] = "***"
    return psycopg.conninfo.make_conninfo("", **parts) or "<libpq defaults>"  # pragma: no mutate


def redact(text: str, dsn: str) -> str:
    """`text` with the DSN's password masked wherever it appears, in any of the forms
    `secrets` finds."""
    for secret in secrets(dsn):
        text = text.replace(secret, "***")
    return text
