"""Chaos across a failover, or through PgBouncer: real Worker processes
(`python -m trioworker run --app tests.apps.failover:registry`), items fed in phases
around a fault the test performs, judged by the external observer log (each run of an
attempt's start and end, stamped with `time.monotonic()`), not by the database.

The figures: overlaps per scope (two runs of one scope at once), items lost (fed and
acknowledged, never finished), items run again after a run that ended cleanly, and the
time from the fault to the first claim on the new primary (of any item, and of a
scoped one: the failover guard holds those for a lease).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg

from tests.support.processes import ROOT, kill_workers, pause, resume

APP = "tests.apps.failover:registry"
#: The application_name of the harness's own connections (feeding, checking).
HARNESS = "failover-chaos-harness"

#: The guard switched off, in test code only and only in the run's own database: the
#: control that shows what the guard prevents.
GUARD_OFF_SQL = """
CREATE OR REPLACE FUNCTION work_failover_hold_v1(p_lease double precision) RETURNS boolean
LANGUAGE sql AS 'SELECT false';
"""


@attrs.frozen
class Load:
    """The items and the Workers' settings."""

    scopes: int = 8
    unscoped_share: float = 0.25
    seconds: tuple[float, float] = (0.05, 0.4)
    lease: float = 4.0
    heartbeat: float = 1.0
    concurrency: int = 4
    seed: int = 1


@attrs.frozen
class WorkerSpec:
    name: str
    dsn: str
    args: tuple[str, ...] = ()


@attrs.frozen
class Span:
    run: str
    id: int
    attempt: int
    scope: str | None
    worker: str
    pid: int
    start: float
    end: float | None  # None: no end line (its process died, or it is still open)
    clean: bool  # ended by returning, not by a cancel


@attrs.define
class Figures:
    items: int = 0
    runs: int = 0
    overlaps: dict[str, int] = attrs.Factory(dict)
    overlap_examples: list[str] = attrs.Factory(list)
    lost: int = 0
    statuses: dict[str, int] = attrs.Factory(dict)
    run_again_after_clean_end: int = 0
    unexpected_exits: list[str] = attrs.Factory(list)
    self_stops: int = 0
    fail_stops: int = 0
    key_errors: int = 0
    #: Per fault: seconds from its start until the new primary took writes
    #: ("fault"), and until the first run (of any item, of a scoped one) that
    #: started after that.
    faults: dict[str, dict[str, float | None]] = attrs.Factory(dict)

    @property
    def total_overlaps(self) -> int:
        return sum(self.overlaps.values())

    def line(self, label: str) -> str:
        def s(x: float | None) -> str:
            return "-" if x is None else f"{x:.1f}s"

        faults = " ".join(
            f"[{name}: fault={s(f['fault'])} to_first_claim={s(f['to_first_claim'])}"
            f" to_first_scoped_claim={s(f['to_first_scoped_claim'])}]"
            for name, f in self.faults.items()
        )
        return (
            f"{label}: items={self.items} runs={self.runs} overlaps={self.total_overlaps}"
            f" {self.overlaps or ''} lost={self.lost} statuses={self.statuses}"
            f" run_again_after_clean_end={self.run_again_after_clean_end}"
            f" self_stops={self.self_stops} fail_stops={self.fail_stops}"
            f" unexpected_exits={len(self.unexpected_exits)} key_errors={self.key_errors}"
            f" {faults}"
        )


def retrying(dsn: str, fn: Callable[[psycopg.Connection[Any]], Any], timeout: float = 60) -> Any:
    """`fn` on a fresh connection to `dsn`, again through outages and read-only answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with psycopg.connect(
                dsn, autocommit=True, connect_timeout=3, application_name=HARNESS
            ) as conn:
                return fn(conn)
        except (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


class ChaosRun:
    """Worker processes started at once; `feed`, a fault, `feed`, `drain`, `judge`."""

    def __init__(self, workdir: Path, load: Load, workers: list[WorkerSpec]) -> None:
        self.load = load
        self.rng = random.Random(load.seed)
        self.observer = workdir / "observer.jsonl"
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.fed: list[int] = []
        self.faults: list[tuple[str, float, float]] = []  # (name, began, ended)
        self.died_at: dict[int, float] = {}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIOWORKER", "PG"))}
        self.env = env | {"TW_OBSERVER_LOG": str(self.observer)}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.specs = {spec.name: spec for spec in workers}
        for spec in workers:
            self.start(spec)

    def start(self, spec: WorkerSpec) -> None:
        load = self.load
        with (self.logs / f"{spec.name}.log").open("a") as log:
            self.procs[spec.name] = subprocess.Popen(
                [sys.executable, "-m", "trioworker", "run", "--app", APP,
                 "--worker-id", spec.name, "--concurrency", str(load.concurrency),
                 "--lease", str(load.lease), "--heartbeat", str(load.heartbeat),
                 "--poll", "1", "--max-stalls", "20", "--shutdown-grace", "3", *spec.args],
                cwd=ROOT, env={**self.env, "TRIOWORKER_DSN": spec.dsn},
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def wait_ready(self, dsn: str, timeout: float = 90) -> None:
        """Wait until every Worker has advertised itself (it is claiming)."""
        deadline = time.monotonic() + timeout
        names = sorted(self.specs)
        while time.monotonic() < deadline:
            seen = retrying(
                dsn,
                lambda c: c.execute(
                    "SELECT count(*) FROM work_workers WHERE id = ANY(%s) AND stopped_at IS NULL",
                    [names],
                ).fetchone()[0],
            )
            if seen == len(names):
                return
            time.sleep(0.3)
        raise AssertionError(f"not every Worker of {names} started within {timeout:g}s")

    def kill(self, name: str) -> None:
        """SIGKILL a Worker (its runs end as it dies; its supervisor follows) and start it
        again."""
        proc = self.procs[name]
        killed = kill_workers(proc)
        self.died_at.update(dict.fromkeys([proc.pid, *killed], time.monotonic()))
        self.start(self.specs[name])

    def pause(self, name: str) -> None:
        """SIGSTOP a Worker and its supervisor: it claims nothing (and holds nothing new)
        until resumed."""
        pause(self.procs[name].pid)

    def resume(self, name: str) -> None:
        resume(self.procs[name].pid)

    def feed(
        self,
        dsn: str,
        count: int,
        seconds: tuple[float, float] | None = None,
        *,
        due_in: float = 0.0,
    ) -> None:
        """Enqueue `count` Hold items over the scopes (a share unscoped), in one commit,
        due `due_in` seconds from now."""
        low, high = seconds or self.load.seconds
        rows = []
        for _ in range(count):
            scoped = self.rng.random() >= self.load.unscoped_share
            scope = f"s{self.rng.randrange(self.load.scopes)}" if scoped else None
            rows.append((scope, json.dumps({"seconds": round(self.rng.uniform(low, high), 3)})))

        def insert(conn: psycopg.Connection[Any]) -> list[int]:
            cur = conn.execute(
                "INSERT INTO work_items (kind, scope, payload, run_after)"
                " SELECT 'Hold', s, p::jsonb, now() + make_interval(secs => %s)"
                " FROM unnest(%s::text[], %s::text[])"
                " WITH ORDINALITY AS t(s, p, n) ORDER BY n RETURNING id",
                (due_in, [r[0] for r in rows], [r[1] for r in rows]),
            )
            return [r[0] for r in cur.fetchall()]

        self.fed += retrying(dsn, insert)

    @contextlib.contextmanager
    def fault(self, name: str) -> Iterator[None]:
        """Around a fault: from its start until the new primary takes writes."""
        began = time.monotonic()
        yield
        self.faults.append((name, began, time.monotonic()))

    def unfinished(self, dsn: str) -> int:
        return int(
            retrying(
                dsn,
                lambda c: c.execute(
                    "SELECT count(*) FROM work_items WHERE id = ANY(%s)"
                    " AND status NOT IN ('Succeeded', 'Failed', 'Cancelled')",
                    [self.fed],
                ).fetchone()[0],
            )
        )

    def drain(self, dsn: str, timeout: float = 120) -> None:
        """Wait until every fed item is finished on `dsn`'s primary (or the timeout)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.unfinished(dsn):
            time.sleep(0.5)

    def stop(self) -> list[str]:
        """SIGTERM every Worker and wait; the exits that were not clean."""
        bad = []
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait(timeout=30)
            if code != 0:
                bad.append(f"{name} exited {code}")
        return bad

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)

    def spans(self) -> list[Span]:
        starts: dict[str, dict[str, Any]] = {}
        ends: dict[str, tuple[float, bool]] = {}
        if self.observer.exists():
            for line in self.observer.read_text().splitlines():
                e = json.loads(line)
                if e["event"] == "start":
                    starts[e["run"]] = e
                else:
                    ends[e["run"]] = (e["t"], e["event"] == "end")
        spans = []
        for run, e in starts.items():
            end, clean = ends.get(run, (self.died_at.get(e["pid"]), False))
            fields = (e["id"], e["attempt"], e["scope"], e["worker"], e["pid"], e["t"])
            spans.append(Span(run, *fields, end, clean))
        return spans

    def judge(self, dsn: str, exits: list[str]) -> Figures:
        spans = self.spans()
        figures = Figures(items=len(self.fed), runs=len(spans), unexpected_exits=exits)
        for scope, (a, b) in _overlaps(spans):
            figures.overlaps[scope] = figures.overlaps.get(scope, 0) + 1
            if len(figures.overlap_examples) < 5:
                figures.overlap_examples.append(
                    f"scope {scope}: item {a.id}/{a.attempt} on {a.worker} [{a.start:.2f},"
                    f" {a.end}] and item {b.id}/{b.attempt} on {b.worker} from {b.start:.2f}"
                )
        by_id: dict[int, list[Span]] = {}
        for s in spans:
            by_id.setdefault(s.id, []).append(s)
        figures.run_again_after_clean_end = sum(
            1
            for runs in by_id.values()
            if any(a.clean and b.start > (a.end or 0) for a in runs for b in runs if a is not b)
        )
        rows = retrying(
            dsn,
            lambda c: c.execute(
                "SELECT status, count(*) FROM work_items WHERE id = ANY(%s) GROUP BY 1",
                [self.fed],
            ).fetchall(),
        )
        figures.statuses = {r[0]: r[1] for r in rows}
        figures.lost = len(self.fed) - figures.statuses.get("Succeeded", 0)
        for name, began, ended in self.faults:
            after = sorted(s.start for s in spans if s.start > ended)
            scoped = sorted(s.start for s in spans if s.start > ended and s.scope)
            figures.faults[name] = {
                "fault": ended - began,
                "to_first_claim": after[0] - began if after else None,
                "to_first_scoped_claim": scoped[0] - began if scoped else None,
            }
        for log in self.logs.glob("*.log"):
            text = log.read_text()
            figures.self_stops += text.count("self-stopped")
            figures.fail_stops += text.count("fail-stop")
            figures.key_errors += text.count("KeyError")
        return figures


def _overlaps(spans: list[Span]) -> list[tuple[str, tuple[Span, Span]]]:
    """Pairs of runs of one scope whose [start, end] intersect (an open run: forever)."""
    found = []
    by_scope: dict[str, list[Span]] = {}
    for s in spans:
        if s.scope is not None:
            by_scope.setdefault(s.scope, []).append(s)
    for scope, group in by_scope.items():
        group.sort(key=lambda s: s.start)
        latest: Span | None = None
        for a, b in itertools.pairwise(group):
            if latest is None or _end(a) > _end(latest):
                latest = a
            if b.start < _end(latest):
                found.append((scope, (latest, b)))
    return found


def _end(span: Span) -> float:
    return span.end if span.end is not None else float("inf")
