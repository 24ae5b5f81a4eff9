"""Queries file parsing, DSN redaction, settings checks, the registry."""

from __future__ import annotations

import datetime as dt
import os
import subprocess

import pytest

from trioworker import ConfigurationError, InvalidWorkItem, Registry, Settings
from trioworker._core.validation import MAX_PAYLOAD_BYTES, validate_enqueue
from trioworker._postgres.dsn import redact, redact_dsn, resolve_dsn
from trioworker._postgres.migrate import migrations_dir
from trioworker._postgres.queries import WRITTEN as QUERIES
from trioworker._postgres.queries import parse
from trioworker._postgres.store import LIMIT_REFUSALS, RUNNING_SLOT_INDEXES
from trioworker._store.reads import process_gone

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def test_queries_are_split_on_name_headers() -> None:
    """Each `-- name:` header starts a query that runs to the next header."""
    parsed = parse("-- name: a\nSELECT 1;\n\n-- name: b\n-- a comment\nSELECT 2;\n")
    assert parsed == {"a": "SELECT 1", "b": "-- a comment\nSELECT 2"}


def test_a_query_name_may_not_repeat() -> None:
    """Two queries with one name is a mistake in the file."""
    with pytest.raises(ValueError, match="defined twice"):
        parse("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


def test_the_claim_and_its_index_live_together() -> None:
    """The store's claim calls work_claim_v3 and names the indexes and refusals whose
    rejection it recognises, which the baseline creates (the claim's third version,
    0005.spent-scopes, is the one the store calls: it settles the reopened scopes and
    claims as the second, 0004.claim-kind-room); the claim passes over full scopes (for
    every scope and for a list of scopes) and skips locks."""
    assert "work_claim_v3(" in QUERIES["claim"]
    baseline = (migrations_dir() / "0001.queue.sql").read_text()
    second = (migrations_dir() / "0004.claim-kind-room.sql").read_text()
    third = (migrations_dir() / "0005.spent-scopes.sql").read_text()
    third = third[third.index("CREATE FUNCTION work_claim_v3(") :]
    assert "FROM work_claim_v2(" in third[: third.index("$$;")]
    for name in sorted(RUNNING_SLOT_INDEXES | LIMIT_REFUSALS):
        assert name in QUERIES["claim"] and name in baseline
    claim = second[second.index("CREATE FUNCTION work_claim_v2(") :]
    claim = claim[: claim.index("$$;")]
    full = "WHERE r.scope = h.scope AND r.scope_slot IS NOT NULL"  # the busy scopes' index
    assert claim.count(full) == 2
    assert claim.count("FOR UPDATE SKIP LOCKED") == 4  # three reads and the claim locks


@pytest.mark.parametrize(
    "dsn",
    [
        "host=db user=app password=s3cr3t dbname=media",
        "postgresql://app:s3cr3t@db:5432/media",
    ],
)
def test_the_password_never_shows(dsn: str) -> None:
    """A DSN's password is masked when the DSN or a message carrying it is shown."""
    shown = redact_dsn(dsn)
    assert "s3cr3t" not in shown and "password=***" in shown
    assert redact(f"failed for {dsn}", dsn) == f"failed for {dsn.replace('s3cr3t', '***')}"


def test_a_bad_dsn_is_a_configuration_error_without_the_password() -> None:
    """An unparseable DSN is refused with a clear error that does not leak."""
    with pytest.raises(ConfigurationError) as raised:
        resolve_dsn("host=db password=s3cr3t port")
    assert "s3cr3t" not in str(raised.value)


def test_dsn_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """--dsn wins; else $TRIOWORKER_DSN; else libpq's defaults."""
    monkeypatch.setenv("TRIOWORKER_DSN", "host=envhost")
    assert resolve_dsn(None) == "host=envhost"
    assert resolve_dsn("host=flag") == "host=flag"
    monkeypatch.delenv("TRIOWORKER_DSN")
    assert resolve_dsn(None) == ""


def test_settings_defaults_follow_the_rule() -> None:
    """Lease 60, heartbeat 10, self-stop 30, poll 5, max stalls 3; stop grace a quarter lease."""
    s = Settings()
    assert (s.lease, s.heartbeat, s.self_stop_after, s.poll, s.max_stalls) == (60, 10, 30, 5, 3)
    assert (s.stop_grace, s.recovery_every) == (15, 15)


@pytest.mark.parametrize(
    ("kwargs", "margin"),
    [
        ({}, 1.0),  # 60 - 30 - 15 leaves 15 s: capped at a second
        ({"lease": 4, "heartbeat": 1, "stop_grace": 1}, 0.5),  # half of the 1 s left
        ({"lease": 8, "heartbeat": 1, "stop_grace": 2}, 1.0),  # half of 2 s
        ({"lease": 10, "heartbeat": 1, "stop_grace": 4.9}, 0.05),
    ],
)
def test_the_kill_margin_is_half_of_what_the_lease_leaves_at_most_a_second(
    kwargs: dict[str, float], margin: float
) -> None:
    """The supervisor kills at half the lease + grace + margin: after the grace, before
    the lease ends."""
    s = Settings(**kwargs)  # type: ignore[arg-type]
    assert s.kill_margin == pytest.approx(margin)
    assert s.kill_margin > 0 and s.self_stop_after + s.stop_grace + s.kill_margin < s.lease


@pytest.mark.parametrize(("lease", "bound"), [(60, 37.5), (8, 5), (6, 3.75)])
def test_a_fenced_transaction_may_sit_idle_the_self_stop_and_a_quarter_of_it(
    lease: float, bound: float
) -> None:
    """The server ends a fenced transaction idle longer than the self-stop allows, with a
    quarter of it more for the commit's way: longer than half the lease, and before the
    lease has run out once more after the self-stop."""
    s = Settings(lease=lease, heartbeat=1)
    assert s.fenced_server_timeout == bound
    assert s.self_stop_after < s.fenced_server_timeout < s.lease


def test_a_process_that_has_ended_is_gone_before_it_is_reaped() -> None:
    """An ended process not reaped yet (a Worker whose supervisor was SIGKILLed, until
    init reaps it) holds no Worker id; this live one does."""
    child = subprocess.Popen(["true"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # ended, still a zombie
    assert process_gone(child.pid)
    child.wait()
    assert process_gone(child.pid)
    assert not process_gone(os.getpid())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lease": 10, "heartbeat": 5}, "shorter than half the lease"),
        ({"lease": 10, "heartbeat": 1, "stop_grace": 5}, "end before the lease"),
        ({"lease": 0}, "lease must be positive"),
        ({"concurrency": 0}, "concurrency must be positive"),
    ],
)
def test_settings_that_break_the_rule_are_refused(kwargs: dict[str, float], message: str) -> None:
    """A heartbeat too slow for the self-stop, or a grace that outlives the lease, is refused."""
    with pytest.raises(ConfigurationError, match=message):
        Settings(**kwargs)  # type: ignore[arg-type]


def test_registry_registers_each_kind_once() -> None:
    """Handlers register by kind; a kind has one handler."""
    registry = Registry()

    @registry.handler("Crawl")
    async def crawl(item: object, ctx: object) -> None: ...

    assert "Crawl" in registry and registry.kinds == ["Crawl"]
    assert registry.get("Crawl").handler is crawl  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="already has a handler"):
        registry.handler("Crawl")(crawl)
    with pytest.raises(ValueError, match="non-empty"):
        registry.handler("")


def test_validation_accepts_a_payload_at_the_limit() -> None:
    """A payload of exactly the documented size is fine; one byte more is not."""
    at_limit = "x" * (MAX_PAYLOAD_BYTES - 2)  # the JSON string adds two quotes
    assert validate_enqueue("K", payload=at_limit, now=NOW).payload_json == f'"{at_limit}"'
    with pytest.raises(InvalidWorkItem):
        validate_enqueue("K", payload=at_limit + "x", now=NOW)


def test_validation_normalises_run_after() -> None:
    """A timedelta becomes a delay from the database's clock; a datetime stays absolute."""
    assert validate_enqueue("K", run_after=dt.timedelta(minutes=1), now=NOW).delay == 60.0
    later = NOW + dt.timedelta(hours=1)
    request = validate_enqueue("K", run_after=later, now=NOW)
    assert (request.run_at, request.delay) == (later, 0.0)
