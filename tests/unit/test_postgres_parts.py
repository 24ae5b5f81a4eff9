"""The parts of the PostgreSQL store that need no server: error translation,
connection settings, and how the store shows itself."""

from __future__ import annotations

import psycopg
import psycopg.errors
import pytest

from trioworker import DatabaseUnavailable, SchemaNotReady, StoreError
from trioworker._postgres import failures
from trioworker._postgres.connection import connect_kwargs
from trioworker._postgres.store import PostgresStore

STORE = PostgresStore("host=db user=app password=s3cr3t")


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (psycopg.errors.UndefinedTable, SchemaNotReady),
        (psycopg.errors.UndefinedFunction, SchemaNotReady),
        (psycopg.OperationalError, DatabaseUnavailable),
        (psycopg.errors.AdminShutdown, DatabaseUnavailable),
        (psycopg.InterfaceError, DatabaseUnavailable),
        (psycopg.errors.UniqueViolation, StoreError),
        (psycopg.errors.InsufficientPrivilege, StoreError),
    ],
)
def test_driver_errors_become_one_domain_error_each(
    error: type[psycopg.Error], kind: type[StoreError]
) -> None:
    """A missing table or function means an unmigrated schema; a lost link, an
    unavailable database; anything else, a plain store error."""
    translated = STORE._conns.translate("claim", error("it broke"))
    assert type(translated) is kind
    expected = f"claim: {error.__name__}: it broke"
    if kind is SchemaNotReady:
        expected += " (run `python -m trioworker migrate`)"
    assert str(translated) == expected


def test_a_read_only_answer_is_a_cut_off_link_that_says_so() -> None:
    """SQLSTATE 25006 (a standby, or a primary demoted in a failover) is retried like a
    lost link, never a refusal a write would give up on or a handler would fail for."""
    translated = STORE._conns.translate(
        "heartbeat",
        psycopg.errors.ReadOnlySqlTransaction("cannot execute UPDATE in a read-only transaction"),
    )
    assert type(translated) is DatabaseUnavailable
    assert str(translated) == (
        "heartbeat: ReadOnlySqlTransaction: cannot execute UPDATE in a read-only transaction"
        " (the server is read-only: a standby or a demoted primary; reconnecting)"
    )


def test_an_unmigrated_schema_of_its_own_names_it_in_the_command_to_run() -> None:
    translated = failures.translate(
        "claim", psycopg.errors.UndefinedTable("no work_items"), "", "tenant_a"
    )
    assert type(translated) is SchemaNotReady
    assert str(translated) == (
        "claim: UndefinedTable: no work_items"
        " (run `python -m trioworker --schema tenant_a migrate`)"
    )


def test_translated_errors_never_carry_the_password() -> None:
    """An error text that echoes the DSN is masked; an empty one leaves no dangling space."""
    leaked = psycopg.OperationalError("could not connect with password=s3cr3t")
    assert str(STORE._conns.translate("listen", leaked)) == (
        "listen: OperationalError: could not connect with password=***"
    )
    assert str(STORE._conns.translate("listen", psycopg.OperationalError())) == (
        "listen: OperationalError:"
    )


def test_a_store_shows_its_dsn_without_the_password() -> None:
    """repr() names the DSN, masked."""
    shown = repr(STORE)
    assert shown.startswith("PostgresStore('") and shown.endswith("')")
    assert sorted(shown[15:-2].split()) == ["host=db", "password=***", "user=app"]


def test_connections_get_link_timeouts_and_a_name() -> None:
    """Keepalives, connect and TCP timeouts and the application name are added unless the
    DSN sets them."""
    assert connect_kwargs("host=db", "trioworker w1") == {
        "connect_timeout": "5",
        "keepalives": "1",
        "keepalives_idle": "5",
        "keepalives_interval": "2",
        "keepalives_count": "3",
        "tcp_user_timeout": "10000",
        "application_name": "trioworker w1",
        "prepare_threshold": None,
    }
    mine = connect_kwargs(
        "host=db connect_timeout=1 application_name=mine options='-c work_mem=8MB'",
        "trioworker w1",
    )
    assert "connect_timeout" not in mine and mine["application_name"] == "mine"


def test_a_lone_surrogate_psycopg_refuses_is_a_store_error_saying_nothing_was_sent() -> None:
    """psycopg's own UnicodeEncodeError, as every caller (the Trio store, both clients)
    reports it."""
    try:
        "\udc80".encode()
    except UnicodeEncodeError as exc:
        error = failures.not_unicode("enqueue", exc)
    assert type(error) is StoreError
    assert (
        str(error) == "enqueue: a value is not valid Unicode (surrogates not allowed); nothing sent"
    )


def test_the_conflicts_retried_are_deadlocks_and_serialization_failures() -> None:
    """Only these are run again on a call's own connection (and, in a caller's
    transaction, reported as the caller's to retry)."""
    assert (
        psycopg.errors.DeadlockDetected,
        psycopg.errors.SerializationFailure,
    ) == failures.CONFLICTS
