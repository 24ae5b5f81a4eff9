"""Metrics without a server or a database: events, scrape-time values, queue depth."""

from __future__ import annotations

import datetime as dt
import logging
import urllib.request
from typing import Any

import attrs
import pytest
import trio
from prometheus_client import REGISTRY, CollectorRegistry

from trioworker._core.errors import ConfigurationError, DatabaseUnavailable
from trioworker._core.limits import Limit, Rate
from trioworker._core.model import StoreStatistics
from trioworker._store.reads import QueueCounts, counts_by_kind
from trioworker._worker.metrics import (
    EVENT_COUNTERS,
    HELP,
    Metrics,
    QueueDepth,
    queue_depth,
    serve_metrics,
)


class FakeStore:
    def __init__(self) -> None:
        self.stats = StoreStatistics(race_losses=0, dedup_hits=0, timeouts=0)
        self.rows: dict[str, list[dict[str, Any]]] = {
            "counts_by_kind_and_status": [],
            "busy_scopes": [{"n": 0}],
        }
        self.down = False
        self.limit_rows: list[Limit] = []

    def statistics(self) -> StoreStatistics:
        return self.stats

    async def limits(self) -> list[Limit]:
        return list(self.limit_rows)

    async def queue_counts(self) -> QueueCounts:
        if self.down:
            raise DatabaseUnavailable("down")
        busy = self.rows["busy_scopes"]
        return QueueCounts(
            counts_by_kind(self.rows["counts_by_kind_and_status"]), busy[0]["n"] if busy else 0
        )


@attrs.frozen
class FakeSettings:
    poll: float


class FakeWorker:
    settings = FakeSettings(poll=2.5)
    running = 0

    def statistics(self) -> Any:
        return attrs.make_class("S", ["running"])(self.running)


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    value: float | None = metrics.registry.get_sample_value(name, labels)
    return value


@pytest.mark.parametrize("event", sorted(EVENT_COUNTERS))
def test_each_event_moves_its_own_counter_by_kind(event: str) -> None:
    """An event counts once, under its kind, in its counter and no other."""
    metrics = Metrics(FakeStore())
    metrics.observe(event, "Crawl")
    metrics.observe(event, "Crawl")
    for other, (name, _) in EVENT_COUNTERS.items():
        expected = 2.0 if other == event else None
        assert sample(metrics, name + "_total", kind="Crawl") == expected, other


def test_durations_go_to_their_histograms() -> None:
    """Heartbeat round trips and handler durations (by kind) are histograms."""
    metrics = Metrics(FakeStore())
    metrics.observe("heartbeat_rtt", "Crawl", 0.02)
    metrics.observe("handler_duration", "Crawl", 3.0)
    metrics.observe("handler_duration", "Crawl", 0.07)
    metrics.observe("no_such_event", "Crawl")
    metrics.observe("no_such_event", "Crawl", 1.0)
    assert sample(metrics, "trioworker_heartbeat_round_trip_seconds_count") == 1
    assert sample(metrics, "trioworker_heartbeat_round_trip_seconds_sum") == 0.02
    assert sample(metrics, "trioworker_handler_duration_seconds_count", kind="Crawl") == 2
    assert (
        sample(metrics, "trioworker_handler_duration_seconds_bucket", kind="Crawl", le="0.1") == 1
    )
    assert sample(metrics, "trioworker_handler_duration_seconds_bucket", kind="Crawl", le="900.0")
    assert sample(metrics, "trioworker_heartbeat_round_trip_seconds_bucket", le="0.0025") == 0


def test_store_counters_and_running_items_are_read_at_scrape_time() -> None:
    """Race losses, dedup hits and timeouts come from the store as they are when scraped;
    the running count from the attached Worker."""
    store, worker = FakeStore(), FakeWorker()
    metrics = Metrics(store)
    assert sample(metrics, "trioworker_items_running") is None  # no Worker yet
    metrics.attach(worker)
    assert metrics.refresh_every == 6 * 2.5
    store.stats = StoreStatistics(
        race_losses=3,
        dedup_hits=2,
        timeouts=1,
        conflict_retries=5,
        scopes_settled=6,
        heads_repaired=7,
    )
    worker.running = 4
    assert sample(metrics, "trioworker_scope_race_losses_total") == 3
    assert sample(metrics, "trioworker_dedup_hits_total") == 2
    assert sample(metrics, "trioworker_store_timeouts_total") == 1
    assert sample(metrics, "trioworker_store_conflict_retries_total") == 5
    assert sample(metrics, "trioworker_scopes_settled_total") == 6
    assert sample(metrics, "trioworker_heads_repaired_total") == 7
    assert sample(metrics, "trioworker_items_running") == 4


def test_queue_depth_fills_in_every_status_of_a_kind() -> None:
    """A kind's statuses without items read 0, so a gauge falls to 0 rather than
    vanishing when its last item moves on."""
    rows = [{"kind": "A", "status": "Queued", "n": 2}, {"kind": "A", "status": "Failed", "n": 1}]
    depth = queue_depth(QueueCounts(counts_by_kind(rows), 1), 123.0)
    assert (depth.busy_scopes, depth.read_at) == (1, 123.0)
    assert depth.by_kind_and_status == {
        ("A", "Waiting"): 0,
        ("A", "Queued"): 2,
        ("A", "Running"): 0,
        ("A", "Succeeded"): 0,
        ("A", "Failed"): 1,
        ("A", "Cancelled"): 0,
    }
    assert queue_depth(QueueCounts({}, 0), 1.0) == QueueDepth({}, 0, 1.0)


async def test_the_refresh_loop_keeps_the_last_reading_through_an_outage(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """Queue depth is re-read every interval; a failed read keeps the previous one."""
    store = FakeStore()
    metrics = Metrics(store)
    metrics.refresh_every = 5.0
    assert sample(metrics, "trioworker_busy_scopes") is None  # nothing read yet
    store.rows["counts_by_kind_and_status"] = [{"kind": "A", "status": "Running", "n": 1}]
    store.rows["busy_scopes"] = [{"n": 1}]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(metrics.run)
        await trio.sleep(1)
        assert sample(metrics, "trioworker_busy_scopes") == 1
        assert sample(metrics, "trioworker_queue_items", kind="A", status="Running") == 1
        first = sample(metrics, "trioworker_queue_refreshed_timestamp_seconds")
        assert first is not None and first > 0
        store.down = True
        store.rows["busy_scopes"] = [{"n": 0}]
        await trio.sleep(10)
        assert sample(metrics, "trioworker_busy_scopes") == 1
        assert caplog.messages[-1] == "metrics: cannot read queue depth (down); next try in 5s"
        store.down = False
        await trio.sleep(5)
        assert sample(metrics, "trioworker_busy_scopes") == 0
        nursery.cancel_scope.cancel()


def test_metrics_go_to_the_registry_given() -> None:
    """Given a registry, every metric is registered there; by default, in a fresh one
    (never prometheus' global registry), refreshed every 5 s until a Worker is attached."""
    registry = CollectorRegistry()
    metrics = Metrics(FakeStore(), registry)
    metrics.observe("claimed", "Crawl")
    assert registry.get_sample_value("trioworker_items_claimed_total", {"kind": "Crawl"}) == 1
    other = Metrics(FakeStore())
    assert other.registry is not registry and other.registry is not REGISTRY
    assert other.refresh_every == 5.0


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def test_serve_answers_scrapes_until_closed() -> None:
    """serve() listens on the port it returns (any free one for 0); close() stops it."""
    metrics = Metrics(FakeStore())
    metrics.observe("claimed", "Crawl")
    port = metrics.serve(0, addr="127.0.0.1")
    try:
        assert 'trioworker_items_claimed_total{kind="Crawl"} 1.0' in scrape(port)
    finally:
        metrics.close()
    metrics.close()  # a second close is harmless
    with pytest.raises(OSError):
        scrape(port)
    Metrics(FakeStore()).close()  # and so is closing one never served


def test_serve_listens_on_the_address_given() -> None:
    """serve(addr=...) binds that address only (any loopback address is local)."""
    metrics = Metrics(FakeStore())
    port = metrics.serve(0, addr="127.0.0.2")
    try:
        with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=10) as answer:
            assert answer.status == 200
        with pytest.raises(OSError):
            scrape(port)  # 127.0.0.1
    finally:
        metrics.close()


def test_a_port_in_use_is_a_configuration_error() -> None:
    """A port another process holds is refused with one clear message."""
    metrics = Metrics(FakeStore())
    port = metrics.serve(0, addr="127.0.0.1")
    try:
        with pytest.raises(ConfigurationError) as refused:
            Metrics(FakeStore()).serve(port, addr="127.0.0.1")
        assert str(refused.value) == (
            f"cannot serve metrics on 127.0.0.1:{port}: Address already in use"
        )
    finally:
        metrics.close()


async def test_every_metric_is_documented() -> None:
    """Each metric family carries its help text."""
    metrics = Metrics(FakeStore())
    metrics.attach(FakeWorker())
    await metrics.refresh()
    port = metrics.serve(0, addr="127.0.0.1")
    try:
        text = scrape(port)
    finally:
        metrics.close()
    for name, doc in [*HELP.items(), *EVENT_COUNTERS.values()]:
        assert f"# HELP {name} {doc}\n" in text or f"# HELP {name}_total {doc}\n" in text, name


def test_serve_metrics_logs_where_it_listens(caplog: pytest.LogCaptureFixture) -> None:
    """The CLI's entry point serves the store's metrics and logs the port it bound."""
    caplog.set_level(logging.INFO)
    store = FakeStore()
    store.stats = StoreStatistics(race_losses=7, dedup_hits=0, timeouts=0)
    metrics = serve_metrics(0, store)
    try:
        port = int(caplog.messages[-1].split("port ")[1].split(" ")[0])
        assert caplog.messages[-1] == f"serving Prometheus metrics on port {port} (/metrics)"
        assert "trioworker_scope_race_losses_total 7.0" in scrape(port)
        assert metrics.store is store
    finally:
        metrics.close()


async def test_limits_are_gauges_labelled_by_kind_and_scope() -> None:
    """Each limit's setting, what it covers now, its rate window and what waits on it,
    from the periodic reading; the default's labels are empty."""
    store = FakeStore()
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    store.limit_rows = [
        Limit("K", None, 8, Rate(10, 1.0), at, in_use=8, started_in_window=3, waiting=40),
        Limit(None, "S", 2, None, at, in_use=1),
        Limit(None, None, 3, None, at, in_use=5),
    ]
    metrics = Metrics(store)
    await metrics.refresh()
    assert sample(metrics, "trioworker_limit_running", kind="K", scope="") == 8
    assert sample(metrics, "trioworker_limit_in_use", kind="K", scope="") == 8
    assert sample(metrics, "trioworker_limit_rate", kind="K", scope="") == 10
    assert sample(metrics, "trioworker_limit_rate_started", kind="K", scope="") == 3
    assert sample(metrics, "trioworker_limit_waiting", kind="K", scope="") == 40
    assert sample(metrics, "trioworker_limit_running", kind="", scope="S") == 2
    assert sample(metrics, "trioworker_limit_rate", kind="", scope="S") is None
    assert sample(metrics, "trioworker_limit_in_use", kind="", scope="") == 5
