"""Schedules and when they fire: the pure decisions behind periodic items."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterator

import pytest

from trioworker import ConfigurationError
from trioworker._core.schedule import (
    Schedule,
    first_due,
    plan,
    schedule_dedup_key,
    schedule_request,
)
from trioworker._core.validation import EnqueueRequest


def at(text: str) -> dt.datetime:
    """A UTC time on 2026-01-01 (or a full ISO date and time)."""
    if "T" not in text:
        text = f"2026-01-01T{text}"
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({}, "schedule 'K': give cron= or every=, not both"),
        ({"cron": "* * * * *", "every": 5.0}, "schedule 'K': give cron= or every=, not both"),
        ({"every": 0.0}, "schedule 'K': every= must be positive seconds"),
        ({"every": -1.0}, "schedule 'K': every= must be positive seconds"),
        ({"every": float("inf")}, "schedule 'K': every= must be positive seconds"),
        ({"every": float("nan")}, "schedule 'K': every= must be positive seconds"),
        ({"every": 5.0, "timezone": "Mars/Olympus"}, "schedule 'K': no timezone 'Mars/Olympus'"),
        ({"every": 5.0, "timezone": "../etc"}, "schedule 'K': no timezone '../etc'"),
        ({"cron": "61 * * * *"}, "schedule 'K': bad cron '61 * * * *': "),
    ],
)
def test_a_schedule_that_cannot_fire_is_refused(kwargs: dict[str, object], error: str) -> None:
    """Exactly one of cron= and every=, positive finite seconds, a known timezone, a
    cron expression that parses; the error says which."""
    with pytest.raises(ConfigurationError) as raised:
        Schedule("K", **kwargs)  # type: ignore[arg-type]
    assert str(raised.value).startswith(error)
    if error.endswith(": "):
        assert len(str(raised.value)) > len(error)  # cronsim's own reason follows


def test_a_tiny_period_is_accepted() -> None:
    """Any positive number of seconds is a period."""
    assert Schedule("K", every=0.001).every == 0.001


def test_a_schedule_is_named_by_its_kind_and_scope_unless_named() -> None:
    """The name (unique in the database) defaults to the kind, or kind@scope."""
    assert Schedule("K", every=5).name == "K"
    assert Schedule("K", every=5, scope="7").name == "K@7"
    assert Schedule("K", every=5, scope="7", name="nightly").name == "nightly"


def test_the_spec_says_when_it_fires() -> None:
    """The text the database compares to see that a schedule changed."""
    assert Schedule("K", every=90).spec == "every 90s"
    assert Schedule("K", every=1.5).spec == "every 1.5s"
    assert Schedule("K", cron="*/5 * * * *").spec == "cron */5 * * * * UTC"
    assert (
        Schedule("K", cron="0 3 * * *", timezone="Europe/Berlin").spec
        == "cron 0 3 * * * Europe/Berlin"
    )


def test_a_schedules_items_share_one_dedup_key() -> None:
    """One key per schedule name, so a still queued item takes the next due time."""
    assert schedule_dedup_key(Schedule("K", every=5, scope="7")) == "trioworker.schedule:K@7"


def test_a_new_periodic_schedule_is_due_at_once() -> None:
    """every=: the first due time is now."""
    assert first_due(Schedule("K", every=60), at("00:00:30")) == at("00:00:30")


def test_a_new_cron_schedule_is_due_at_its_next_time_in_its_timezone() -> None:
    """cron=: the next matching time after now, read in the schedule's timezone."""
    berlin = Schedule("K", cron="0 3 * * *", timezone="Europe/Berlin")
    assert first_due(berlin, at("00:00:00")) == at("02:00:00")
    assert first_due(berlin, at("02:00:00")) == at("2026-01-02T02:00:00")
    assert first_due(berlin, at("02:00:00")).tzinfo == dt.UTC
    assert first_due(Schedule("K", cron="*/10 * * * *"), at("00:05:00")) == at("00:10:00")


def test_nothing_fires_before_the_next_due_time() -> None:
    """Not yet due: nothing to enqueue, the due time stays."""
    assert plan(Schedule("K", every=60), at("00:01:00"), at("00:00:59")) == (None, at("00:01:00"))


def test_a_periodic_schedule_fires_its_latest_due_time_and_skips_the_missed_ones() -> None:
    """every=10 min, due since 00:00, now 00:25: the 00:20 time fires, 00:30 is next;
    on the dot, that time fires."""
    ten = Schedule("K", every=600)
    assert plan(ten, at("00:00:00"), at("00:25:00")) == (at("00:20:00"), at("00:30:00"))
    assert plan(ten, at("00:00:00"), at("00:20:00")) == (at("00:20:00"), at("00:30:00"))
    assert plan(ten, at("00:00:00"), at("00:00:00")) == (at("00:00:00"), at("00:10:00"))
    assert plan(ten, at("00:00:00"), at("00:09:59")) == (at("00:00:00"), at("00:10:00"))
    half = Schedule("K", every=1.5)
    assert plan(half, at("00:00:00"), at("00:00:04")) == (at("00:00:03"), at("00:00:04.5"))


def test_a_cron_schedule_fires_its_latest_time_not_before_the_due_one() -> None:
    """*/10: due 00:10, now 00:35 fires 00:30 (next 00:40); a due time between cron
    times (a changed schedule) fires itself; on a cron time, that time fires."""
    tens = Schedule("K", cron="*/10 * * * *")
    assert plan(tens, at("00:10:00"), at("00:35:00")) == (at("00:30:00"), at("00:40:00"))
    assert plan(tens, at("00:33:00"), at("00:35:00")) == (at("00:33:00"), at("00:40:00"))
    assert plan(tens, at("00:30:00"), at("00:30:00")) == (at("00:30:00"), at("00:40:00"))
    assert plan(tens, at("00:20:00"), at("00:30:00")) == (at("00:30:00"), at("00:40:00"))
    assert plan(tens, at("00:20:00"), at("00:30:00.5")) == (at("00:30:00"), at("00:40:00"))


def test_a_cron_schedule_reads_its_times_in_its_timezone() -> None:
    """03:00 in Berlin is 02:00 UTC in winter: after downtime, the latest one fires."""
    berlin = Schedule("K", cron="0 3 * * *", timezone="Europe/Berlin")
    due, following = plan(berlin, at("02:00:00"), at("2026-01-03T10:00:00"))
    assert (due, following) == (at("2026-01-03T02:00:00"), at("2026-01-04T02:00:00"))
    assert due is not None and due.tzinfo == dt.UTC and following.tzinfo == dt.UTC


@pytest.fixture
def local_time_in_kolkata(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The machine's own timezone is not UTC (nor the schedule's)."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("local_time_in_kolkata")
def test_due_times_are_in_utc_whatever_the_machines_timezone() -> None:
    """The database stores UTC: due times come back in UTC, not the local zone."""
    berlin = Schedule("K", cron="0 3 * * *", timezone="Europe/Berlin")
    due, following = plan(berlin, at("02:00:00"), at("2026-01-03T10:00:00"))
    assert due is not None and due.utcoffset() == dt.timedelta(0)
    assert following.utcoffset() == dt.timedelta(0)
    assert first_due(berlin, at("00:00:00")).utcoffset() == dt.timedelta(0)


def test_a_schedules_item_is_its_kind_scope_payload_and_priority_due_at_its_due_time() -> None:
    schedule = Schedule("Sweep", every=60, scope="disk-7", payload={"deep": True}, priority=5)
    now = dt.datetime(2026, 1, 1, 12, 0, 30, tzinfo=dt.UTC)
    due = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
    assert schedule_request(schedule, due, now) == EnqueueRequest(
        kind="Sweep",
        scope="disk-7",
        payload_json='{"deep":true}',
        priority=5,
        dedup_key="trioworker.schedule:Sweep@disk-7",
        run_at=due,
        delay=0.0,
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"scope": ""}, "schedule 'K@': scope must not be empty"),
        ({"payload": float("nan")}, "schedule 'K': payload is not JSON-serialisable"),
        ({"priority": 5000}, "schedule 'K': priority 5000 is outside -1000..1000"),
        ({"name": "n" * 190}, "dedup_key is longer than 200 characters"),
    ],
)
def test_a_schedule_whose_items_could_not_be_enqueued_is_refused_at_registration(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        Schedule("K", every=60, **fields)  # type: ignore[arg-type]
