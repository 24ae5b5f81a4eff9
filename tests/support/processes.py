"""Worker processes for tests: `python -m trioworker run`, as users run it."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[2]
APP = "tests.apps.recording:registry"


class WorkerProcess:
    def __init__(self, dsn: str, args: list[str], log_dir: Path, name: str, env: dict[str, str]):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trioworker", "--dsn", dsn, "run", "--app", APP,
             "--worker-id", name, *args],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._log.close()


@contextmanager
def workers(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """start(dsn, *args, name=...) starts a Worker process; all are killed at the end."""
    started: list[WorkerProcess] = []
    observer_log = tmp_path / "observer.jsonl"

    def start(dsn: str, *args: str, name: str, env: dict[str, str] | None = None) -> WorkerProcess:
        worker = WorkerProcess(
            dsn, list(args), tmp_path, name, {"TW_OBSERVER_LOG": str(observer_log), **(env or {})}
        )
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()


def observed(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "observer.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def attempts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per attempt: its scope and [start, end] (end: its end or cancel)."""
    spans: dict[tuple[int, int], dict[str, Any]] = {}
    for e in events:
        key = (e["id"], e["attempt"])
        span = spans.setdefault(
            key,
            {
                "id": e["id"],
                "attempt": e["attempt"],
                "scope": e["scope"],
                "worker": e["worker"],
                "start": None,
                "end": None,
            },
        )
        if e["event"] == "start":
            span["start"] = e["t"]
        else:
            span["end"] = e["t"]
    return list(spans.values())


def overlaps(spans: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Pairs of attempts of one scope whose [start, end] intervals intersect."""
    found = []
    by_scope: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        if s["scope"] is not None:
            by_scope.setdefault(s["scope"], []).append(s)
    for group in by_scope.values():
        group.sort(key=lambda s: s["start"])
        for a, b in itertools.pairwise(group):
            end_a = a["end"] if a["end"] is not None else float("inf")
            if b["start"] < end_a:
                found.append((a, b))
    return found
