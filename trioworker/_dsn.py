"""Where the DSN comes from, and how it is shown without its password."""

from __future__ import annotations

import os

import psycopg.conninfo

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
