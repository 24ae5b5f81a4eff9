"""Prometheus metrics of a real Worker process, scraped over HTTP as Prometheus does."""

from __future__ import annotations

import re
import signal
import socket
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_cli import trioworker
from tests.support.processes import WorkerProcess, wait_for, workers

FAST = ["--lease", "4", "--heartbeat", "1", "--poll", "1", "--stop-grace", "1"]
Conn = psycopg.Connection[Any]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def metrics_port(worker: WorkerProcess) -> int:
    def found() -> int | None:
        match = re.search(r"serving Prometheus metrics on port (\d+)", worker.output())
        return int(match.group(1)) if match else None

    port: int = wait_for(found, 60, "the metrics server to start")
    return port


def test_a_workers_metrics_move_with_its_work(dsn: str, pg: Conn, tmp_path: Path) -> None:
    """Scrape a Worker started with --metrics-port: before any work nothing is counted;
    after items succeed, fail and are cancelled, the counters, the handler-duration and
    heartbeat histograms, queue depth and busy scopes all show it."""
    with workers(tmp_path) as start:
        worker = start(dsn, *FAST, "--metrics-port", "0", name="metered")
        port = metrics_port(worker)
        before = wait_for(
            lambda: (
                (s := scrape(port))
                and value(s, "trioworker_queue_refreshed_timestamp_seconds")
                and s
            ),
            60,
            "the first queue-depth reading",
        )
        assert value(before, "trioworker_items_claimed_total", kind="Record") is None
        assert value(before, "trioworker_busy_scopes") == 0
        assert value(before, "trioworker_items_running") == 0
        assert not [k for k in before if k[0] == "trioworker_queue_items"]

        for _ in range(3):
            pg.execute(
                "INSERT INTO work_items (kind, payload) VALUES ('Record', '{\"seconds\": 0}')"
            )
        pg.execute("INSERT INTO work_items (kind) VALUES ('Nope')")  # no handler: left alone
        long_id = pg.execute(
            "INSERT INTO work_items (kind, scope, payload)"
            " VALUES ('Record', 's1', '{\"seconds\": 600}') RETURNING id"
        ).fetchone()[0]  # type: ignore[index]

        def busy(s: Samples) -> bool:
            return (
                value(s, "trioworker_busy_scopes") == 1
                and value(s, "trioworker_queue_items", kind="Record", status="Running") == 1
                and value(s, "trioworker_items_running") == 1
            )

        wait_for(lambda: busy(scrape(port)), 60, "the long item to show as running")
        assert trioworker("cancel", str(long_id), dsn=dsn).returncode == 0

        def settled(s: Samples) -> bool:
            return (
                value(s, "trioworker_queue_items", kind="Record", status="Succeeded") == 3
                and value(s, "trioworker_queue_items", kind="Record", status="Cancelled") == 1
                and value(s, "trioworker_busy_scopes") == 0
            )

        after = wait_for(lambda: (s := scrape(port)) and settled(s) and s, 60, "the work to end")
        assert value(after, "trioworker_items_claimed_total", kind="Record") == 4
        assert value(after, "trioworker_items_claimed_total", kind="Nope") is None
        assert value(after, "trioworker_items_succeeded_total", kind="Record") == 3
        assert value(after, "trioworker_items_failed_total", kind="Nope") is None
        assert value(after, "trioworker_items_cancelled_total", kind="Record") == 1
        assert value(after, "trioworker_handler_duration_seconds_count", kind="Record") == 4
        assert value(after, "trioworker_heartbeat_round_trip_seconds_count") >= 1  # type: ignore[operator]
        assert value(after, "trioworker_queue_items", kind="Nope", status="Queued") == 1
        assert value(after, "trioworker_queue_items", kind="Record", status="Queued") == 0
        assert value(after, "trioworker_items_running") == 0
        assert value(after, "trioworker_scope_race_losses_total") == 0
        assert value(after, "trioworker_heads_repaired_total") == 0
        assert value(after, "trioworker_store_conflict_retries_total") == 0

        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, worker.output()


def test_a_metrics_port_in_use_is_one_clear_line(dsn: str) -> None:
    """run --metrics-port on a port another process holds: exit 1, one line saying so."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = trioworker(
            "run", "--app", "tests.apps.recording:registry", "--metrics-port", str(port), dsn=dsn
        )
    assert result.returncode == 1
    assert result.stderr == (
        f"trioworker: error: cannot serve metrics on 0.0.0.0:{port}: Address already in use\n"
    )
