"""Where the DSN comes from, and how it is shown without its password."""

from __future__ import annotations

import os

import psycopg.conninfo
import psycopg.pq

from ._errors import ConfigurationError

DSN_ENV = "TRIOWORKER_DSN"


def resolve_dsn(explicit: str | None) -> str:
    """--dsn, else $TRIOWORKER_DSN, else "" (libpq then reads PGHOST, PGUSER, ...)."""
    dsn = explicit if explicit is not None else os.environ.get(DSN_ENV, "")
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        detail = redact(" ".join(str(exc).split()), dsn)
        raise ConfigurationError(f"bad DSN {redact_dsn(dsn)}: {detail}") from None
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
    try:
        value = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
    except psycopg.ProgrammingError:
        return None
    return str(value) if value else os.environ.get("PGPASSWORD") or None


def redact_dsn(dsn: str) -> str:
    """The DSN as a conninfo string with its password replaced by ***."""
    try:
        parts = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    if parts.get("password"):
        parts["password"] = "***"
    return psycopg.conninfo.make_conninfo("", **parts) or "<libpq defaults>"  # pragma: no mutate


def redact(text: str, dsn: str) -> str:
    """`text` with the DSN's password (if any) masked wherever it appears."""
    password = _password(dsn)
    return text.replace(password, "***") if password else text
