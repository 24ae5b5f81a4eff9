"""The parts of the PostgreSQL store that need no server: error translation,
connection settings, and how the store shows itself."""

from __future__ import annotations

import asyncio
import types

import psycopg
import psycopg.errors
import pytest

import trioworker
from trioworker import ConfigurationError, DatabaseUnavailable, SchemaNotReady, StoreError
from trioworker._postgres import failures
from trioworker._postgres.connection import _begin, connect_kwargs
from trioworker._postgres.sessions import LINK, set_local, set_session, settings
from trioworker._postgres.store import (
    LIMIT_REFUSALS,
    RUNNING_KIND_INDEX,
    RUNNING_SCOPE_INDEX,
    PostgresFencedTransaction,
    PostgresStore,
    PostgresTransaction,
    _connection_of,
    lost_race,
)

STORE = PostgresStore("host=db user=app password=s3cr3t")


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (psycopg.errors.UndefinedTable, SchemaNotReady),
        (psycopg.errors.UndefinedFunction, SchemaNotReady),
        (psycopg.OperationalError, DatabaseUnavailable),
        (psycopg.errors.AdminShutdown, DatabaseUnavailable),
        (psycopg.errors.IdleInTransactionSessionTimeout, DatabaseUnavailable),
        (psycopg.errors.TransactionTimeout, DatabaseUnavailable),
        (psycopg.InterfaceError, DatabaseUnavailable),
        (psycopg.errors.UniqueViolation, StoreError),
        (psycopg.errors.InsufficientPrivilege, StoreError),
    ],
)
def test_driver_errors_become_one_domain_error_each(
    error: type[psycopg.Error], kind: type[StoreError]
) -> None:
    """A missing table or function means an unmigrated schema; a lost link, an
    unavailable database, as is a session the server ended for its bounds (sessions.py);
    anything else, a plain store error."""
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


def test_the_server_gives_up_on_a_silent_client_as_the_client_does_on_the_server() -> None:
    """Each transaction's server keepalives and TCP user timeout are the figures the
    client's connections get."""
    client = connect_kwargs("host=db", "w")
    server = dict(settings(LINK, 150000))
    for name in ("keepalives_idle", "keepalives_interval", "keepalives_count"):
        assert str(server[f"tcp_{name}"]) == client[name]
    assert str(server["tcp_user_timeout"]) == client["tcp_user_timeout"]


@pytest.mark.parametrize(
    ("version", "fenced", "names"),
    [
        (150004, False, ["idle", "interval", "count", "user", "check"]),
        (150004, True, ["idle", "interval", "count", "user", "check", "iit", "stmt"]),
        (180001, True, ["idle", "interval", "count", "user", "check", "iit", "stmt", "tx"]),
        (170000, True, ["idle", "interval", "count", "user", "check", "iit", "stmt", "tx"]),
        (169999, True, ["idle", "interval", "count", "user", "check", "iit", "stmt"]),
        (140000, False, ["idle", "interval", "count", "user", "check"]),
        (139999, True, ["idle", "interval", "count", "user", "iit", "stmt"]),
        (120000, False, ["idle", "interval", "count", "user"]),
        (119999, False, ["idle", "interval", "count"]),
    ],
)
def test_a_transactions_bounds_are_those_its_server_knows(
    version: int, fenced: bool, names: list[str]
) -> None:
    """Keepalives always; the TCP user timeout from PostgreSQL 12, the client check
    from 14; a fenced transaction's idle, statement and (from 17) transaction bound,
    in milliseconds, rounded up."""
    short = {
        "tcp_keepalives_idle": ("idle", 5), "tcp_keepalives_interval": ("interval", 2),
        "tcp_keepalives_count": ("count", 3), "tcp_user_timeout": ("user", 10000),
        "client_connection_check_interval": ("check", 2000),
        "idle_in_transaction_session_timeout": ("iit", 3751),
        "statement_timeout": ("stmt", 3751), "transaction_timeout": ("tx", 3751),
    }  # fmt: skip
    bounds = LINK.fenced(3.7501) if fenced else LINK
    got = settings(bounds, version)
    assert [short[name][0] for name, _ in got] == names
    assert all(value == short[name][1] for name, value in got)


def test_a_transaction_sets_its_bounds_with_its_begin_in_one_query() -> None:
    """BEGIN, then each bound as SET LOCAL (gone at the transaction's end, so nothing
    leaks to the next client of a pooled server connection); the listener's session
    gets the same with SET SESSION."""
    begin = _begin(LINK.fenced(2), 150000).as_string(None)
    assert begin == (
        'BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL "tcp_keepalives_idle" = 5;'
        ' SET LOCAL "tcp_keepalives_interval" = 2; SET LOCAL "tcp_keepalives_count" = 3;'
        ' SET LOCAL "tcp_user_timeout" = 10000;'
        ' SET LOCAL "client_connection_check_interval" = 2000;'
        ' SET LOCAL "idle_in_transaction_session_timeout" = 2000;'
        ' SET LOCAL "statement_timeout" = 2000'
    )
    assert set_local(LINK, 110000).as_string(None) == (
        'SET LOCAL "tcp_keepalives_idle" = 5; SET LOCAL "tcp_keepalives_interval" = 2;'
        ' SET LOCAL "tcp_keepalives_count" = 3'
    )
    assert set_session(LINK, 110000).as_string(None) == (
        'SET SESSION "tcp_keepalives_idle" = 5; SET SESSION "tcp_keepalives_interval" = 2;'
        ' SET SESSION "tcp_keepalives_count" = 3'
    )


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


def test_a_store_given_no_dsn_reads_the_environment_as_the_clients_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`open_store()` (a PostgresStore) with no DSN reads $TRIOWORKER_DSN, else leaves it
    to libpq's defaults, as `Client()` and the commands do; a DSN libpq cannot parse is a
    ConfigurationError that does not show its password."""
    monkeypatch.setenv("TRIOWORKER_DSN", "host=envhost")
    assert PostgresStore().dsn == "host=envhost"
    assert PostgresStore("host=given").dsn == "host=given"
    monkeypatch.delenv("TRIOWORKER_DSN")
    assert PostgresStore().dsn == ""
    with pytest.raises(ConfigurationError) as raised:
        PostgresStore("host=db password=s3cr3t port")
    assert "s3cr3t" not in str(raised.value)


@pytest.mark.parametrize("name", ["migrate_async", "check_schema_async"])
def test_the_async_forms_of_migrate_and_check_schema_say_they_are_trios(name: str) -> None:
    """From asyncio, `migrate_async` and `check_schema_async` refuse before connecting,
    naming themselves and the clients asyncio programs use."""
    call = getattr(trioworker, name)
    with pytest.raises(ConfigurationError, match=f"^{name} runs under Trio.*AsyncClient"):
        asyncio.run(call("host=nowhere.invalid"))


def test_a_store_in_a_schema_shows_it() -> None:
    """repr() names the queue's schema when one is given."""
    assert repr(PostgresStore("host=db", schema="q")) == "PostgresStore('host=db', schema='q')"


def named(error: type[psycopg.Error], constraint: str | None) -> psycopg.Error:
    """An error of class `error` whose diagnostics name `constraint` (psycopg fills
    them in from the server's answer)."""
    diag = types.SimpleNamespace(constraint_name=constraint)
    return type("Named", (error,), {"diag": diag})()


@pytest.mark.parametrize(
    ("error", "lost_on"),
    [
        (named(psycopg.errors.UniqueViolation, RUNNING_SCOPE_INDEX), RUNNING_SCOPE_INDEX),
        (named(psycopg.errors.UniqueViolation, RUNNING_KIND_INDEX), RUNNING_KIND_INDEX),
        *[(named(psycopg.errors.CheckViolation, name), name) for name in sorted(LIMIT_REFUSALS)],
        (named(psycopg.errors.UniqueViolation, "work_items_pkey"), None),
        (named(psycopg.errors.UniqueViolation, "work_items_slot_within_limit"), None),
        (named(psycopg.errors.CheckViolation, RUNNING_SCOPE_INDEX), None),
        (named(psycopg.errors.CheckViolation, None), None),
        (named(psycopg.errors.ForeignKeyViolation, RUNNING_SCOPE_INDEX), None),
        (psycopg.errors.UniqueViolation(), None),
        (ValueError(RUNNING_SCOPE_INDEX), None),
    ],
)
def test_a_lost_claim_race_is_known_by_its_constraint(
    error: BaseException, lost_on: str | None
) -> None:
    """A slot index's unique violation or a limit refusal's check violation, by name;
    nothing else (another constraint, the same name under the other error)."""
    assert lost_race(error) == lost_on


def test_a_transaction_is_passed_on_by_its_connection() -> None:
    """None stays None; a store's transaction gives its connection; anything else is a
    TypeError naming its type."""
    conn = object()
    assert _connection_of(None) is None
    assert _connection_of(PostgresTransaction(STORE._conns, conn)) is conn  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^tx must be a transaction of a PostgresStore, not dict$"):
        _connection_of({})  # type: ignore[arg-type]


def test_a_fenced_transaction_notes_its_completion_and_result() -> None:
    """complete() marks the commit as the attempt's success, with the result's JSON."""
    tx = PostgresFencedTransaction(STORE._conns, None, 4, 2)  # type: ignore[arg-type]
    assert not tx.completes and tx.result_json is None
    assert (tx.item_id, tx.attempt) == (4, 2)
    tx.complete({"a": [1]})
    assert tx.completes and tx.result_json == '{"a":[1]}'
    bare = PostgresFencedTransaction(STORE._conns, None, 4, 2)  # type: ignore[arg-type]
    bare.complete()
    assert bare.completes and bare.result_json is None
