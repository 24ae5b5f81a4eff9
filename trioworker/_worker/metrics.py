"""Prometheus metrics for a Worker, opt-in with `run --metrics-port P`.

The Worker and its executor report events to `Metrics.observe`; the store's own
counters (race losses, dedup hits, timeouts) and the Worker's running count are read
at scrape time; queue depth and busy scopes come from a periodic query that
`Metrics.run` makes in the Worker's Trio nursery. Prometheus' HTTP server answers
scrapes from a thread of its own and only reads.

Needs the `metrics` extra (prometheus-client).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import attrs
import trio
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from trioworker._core.errors import ConfigurationError, StoreError
from trioworker._core.limits import Limit
from trioworker._core.model import StoreStatistics
from trioworker._store.reads import QueueCounts

log = logging.getLogger("trioworker.metrics")

#: Worker events (as the Worker and executor name them) and the counter each moves.
EVENT_COUNTERS: Mapping[str, tuple[str, str]] = {
    "claimed": ("trioworker_items_claimed", "Items claimed by this Worker"),
    "complete": ("trioworker_items_succeeded", "Attempts that completed their item"),
    "retry": ("trioworker_items_retried", "Attempts whose error put the item back to retry"),
    "fail": ("trioworker_items_failed", "Attempts that failed their item for good"),
    "cancel": ("trioworker_items_cancelled", "Attempts stopped by a cancel request"),
    "release": ("trioworker_items_released", "Attempts released at shutdown"),
    "self_stopped": (
        "trioworker_items_self_stopped",
        "Attempts that stopped themselves: no heartbeat succeeded for half a lease",
    ),
    "lost": ("trioworker_items_lost", "Attempts that found another attempt owned the item"),
    "database_lost": (
        "trioworker_items_database_lost",
        "Attempts whose fenced transaction lost PostgreSQL (left to lease recovery as stalls)",
    ),
    "stall_recovered": (
        "trioworker_stalls_recovered",
        "Expired leases this Worker's lease recovery took back (stalls)",
    ),
    "lease_held": (
        "trioworker_leases_held",
        "Expired leases lease recovery found still held by another session a whole lease"
        " after they ran out, once a pass each (end that session)",
    ),
}

#: The help text of every other metric, by name.
HELP: Mapping[str, str] = {
    "trioworker_heartbeat_round_trip_seconds": "Time from sending a heartbeat to its answer",
    "trioworker_handler_duration_seconds": (
        "How long handlers ran, by kind (to their return, error or stop)"
    ),
    "trioworker_scope_race_losses": (
        "Claims that lost a scope on the running-scope index (to a Running item they"
        " could not see), and claimed again"
    ),
    "trioworker_store_conflict_retries": (
        "The queue's own writes run again after a deadlock or serialization failure"
        " (none is expected)"
    ),
    "trioworker_scopes_settled": (
        "Scopes whose heads this Worker settled after a change made by hand or a held row"
    ),
    "trioworker_heads_repaired": (
        "Wedged scopes the repair found and fixed: a bug in trioworker, and never expected"
    ),
    "trioworker_dedup_hits": "Enqueues merged onto an item already Queued with the same dedup key",
    "trioworker_store_timeouts": "Store calls that ran out of time",
    "trioworker_items_running": "Items this Worker is running now",
    "trioworker_queue_items": "Work items in the database by kind and status (periodic query)",
    "trioworker_busy_scopes": "Scopes with a Running item (periodic query)",
    "trioworker_limit_running": "A running limit of a kind, a scope or the default for"
    " scopes (kind and scope labels empty: the default; periodic query)",
    "trioworker_limit_in_use": "Running items a limit covers now (periodic query)",
    "trioworker_limit_rate": "A rate limit's starts per period (periodic query)",
    "trioworker_limit_rate_started": "Starts in a rate limit's current window (periodic query)",
    "trioworker_limit_waiting": "Due Queued items a full limit holds back (periodic query)",
    "trioworker_queue_refreshed_timestamp_seconds": (
        "When the queue-depth query last answered (Unix time)"
    ),
}
HEARTBEAT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
HANDLER_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
#: Queue depth is read every this many poll intervals.
REFRESH_POLLS = 6


class _Store(Protocol):
    """What the metrics read: a part of the client interface (`Client`)."""

    def statistics(self) -> StoreStatistics: ...

    async def queue_counts(self) -> QueueCounts: ...

    async def limits(self) -> list[Limit]: ...


class _Worker(Protocol):
    @property
    def settings(self) -> Any: ...

    def statistics(self) -> Any: ...


@attrs.frozen
class QueueDepth:
    """One reading of the queue: items by (kind, status), and scopes with a Running item."""

    by_kind_and_status: Mapping[tuple[str, str], int]
    busy_scopes: int
    read_at: float  # Unix time
    limits: Sequence[Limit] = ()


def queue_depth(counts: QueueCounts, read_at: float) -> QueueDepth:
    """The reading from the store's counts: every status of a kind that has items is
    present, zero when it has none."""
    depth = {
        (kind, status): n
        for kind, by_status in counts.by_kind.items()
        for status, n in by_status.items()
    }
    return QueueDepth(depth, counts.busy_scopes, read_at)


class Metrics:
    """A Worker's metrics, in a registry of their own (not prometheus' global one)."""

    def __init__(self, store: _Store, registry: CollectorRegistry | None = None) -> None:
        self.store = store
        self.registry = registry if registry is not None else CollectorRegistry()
        self.refresh_every = 5.0
        self.depth: QueueDepth | None = None  # None until the first query answers
        self._worker: _Worker | None = None
        self._server: Any = None
        self._counters = {
            event: Counter(name, doc, ["kind"], registry=self.registry)
            for event, (name, doc) in EVENT_COUNTERS.items()
        }
        name = "trioworker_heartbeat_round_trip_seconds"
        self.heartbeat_rtt = Histogram(
            name, HELP[name], buckets=HEARTBEAT_BUCKETS, registry=self.registry
        )
        name = "trioworker_handler_duration_seconds"
        self.handler_duration = Histogram(
            name,
            HELP[name],
            ["kind"],
            buckets=HANDLER_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_ReadAtScrape(self))

    # -- what the Worker calls -------------------------------------------------------

    def attach(self, worker: _Worker) -> None:
        """Read the Worker's running count at scrape time; refresh the queue reading
        every six poll intervals (30 s by default): it counts the whole table."""
        self._worker = worker
        self.refresh_every = REFRESH_POLLS * worker.settings.poll

    def observe(self, event: str, kind: str, value: float | None = None) -> None:
        """One event from the Worker; events it has no metric for are ignored."""
        if event == "heartbeat_rtt" and value is not None:
            self.heartbeat_rtt.observe(value)
        elif event == "handler_duration" and value is not None:
            self.handler_duration.labels(kind=kind).observe(value)
        elif event in self._counters:
            self._counters[event].labels(kind=kind).inc()

    async def run(self) -> None:
        """Refresh queue depth and busy scopes every `refresh_every` seconds, until
        cancelled. A failed query keeps the last reading; its time is exported."""
        while True:
            try:
                await self.refresh()
            except StoreError as exc:
                log.warning(
                    "metrics: cannot read queue depth (%s); next try in %gs",
                    exc,
                    self.refresh_every,
                )
            await trio.sleep(self.refresh_every)

    async def refresh(self) -> QueueDepth:
        counts, limits = await self.store.queue_counts(), await self.store.limits()
        self.depth = attrs.evolve(queue_depth(counts, time.time()), limits=limits)
        return self.depth

    # -- serving ---------------------------------------------------------------------

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serve /metrics from a thread; the port it listens on (`port` 0: any free one)."""
        try:
            server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}"
            ) from None
        self._server = server
        bound: int = server.server_port
        return bound

    def close(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.shutdown()
            server.server_close()


class _ReadAtScrape(Collector):
    """Values read when Prometheus scrapes: the store's counters, the Worker's running
    count, and the last queue-depth reading."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        stats = self.metrics.store.statistics()
        for name, value in [
            ("trioworker_scope_race_losses", stats.race_losses),
            ("trioworker_dedup_hits", stats.dedup_hits),
            ("trioworker_store_timeouts", stats.timeouts),
            ("trioworker_store_conflict_retries", stats.conflict_retries),
            ("trioworker_scopes_settled", stats.scopes_settled),
            ("trioworker_heads_repaired", stats.heads_repaired),
        ]:
            yield CounterMetricFamily(name, HELP[name], value=value)
        worker = self.metrics._worker
        if worker is not None:
            yield _gauge("trioworker_items_running", worker.statistics().running)
        depth = self.metrics.depth
        if depth is None:
            return
        name = "trioworker_queue_items"
        items = GaugeMetricFamily(name, HELP[name], labels=["kind", "status"])
        for (kind, status), n in sorted(depth.by_kind_and_status.items()):
            items.add_metric([kind, status], n)
        yield items
        yield _gauge("trioworker_busy_scopes", depth.busy_scopes)
        yield from limit_gauges(depth.limits)
        yield _gauge("trioworker_queue_refreshed_timestamp_seconds", depth.read_at)


def limit_gauges(limits: Sequence[Limit]) -> Iterator[GaugeMetricFamily]:
    """Each limit's setting and what it holds now, labelled by kind and scope."""
    names = ("running", "in_use", "rate", "rate_started", "waiting")
    families = {
        n: GaugeMetricFamily(f"trioworker_limit_{n}", HELP[f"trioworker_limit_{n}"],
                             labels=["kind", "scope"])
        for n in names
    }  # fmt: skip
    for lim in limits:
        labels = [lim.kind or "", lim.scope or ""]
        if lim.running is not None:
            families["running"].add_metric(labels, lim.running)
        families["in_use"].add_metric(labels, lim.in_use)
        if lim.rate is not None:
            families["rate"].add_metric(labels, lim.rate.count)
            families["rate_started"].add_metric(labels, lim.started_in_window)
        families["waiting"].add_metric(labels, lim.waiting)
    yield from families.values()


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, HELP[name], value=value)


def serve_metrics(port: int, store: _Store) -> Metrics:
    """Metrics for a Worker on `store`, served on `port`; start `run()` in the Worker's
    nursery to keep queue depth fresh."""
    metrics = Metrics(store)
    bound = metrics.serve(port)
    log.info("serving Prometheus metrics on port %d (/metrics)", bound)
    return metrics
