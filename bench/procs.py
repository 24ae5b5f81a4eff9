"""Worker processes for the benchmarks, started and always stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.common import ROOT

APP = "bench.apps:registry"


def trioworker_command(dsn: str, name: str, *args: str) -> list[str]:
    """`python -m trioworker run` with the bench handlers, as users run it."""
    return [sys.executable, "-m", "trioworker", "--dsn", dsn, "run", "--app", APP,
            "--worker-id", name, *args]  # fmt: skip


class Processes:
    """Started processes, each with its output in a log file; all stopped on exit."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(
        self,
        command: Sequence[str],
        name: str,
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
    ) -> None:
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                list(command),
                cwd=cwd,
                env={**os.environ, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.started.append((proc, log_path))

    def pids(self) -> list[int]:
        return [proc.pid for proc, _ in self.started]

    def check_alive(self) -> None:
        """Raise, with the end of its log, if any process has exited."""
        for proc, log_path in self.started:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}:\n{tail}")

    def stop(self, grace: float = 10.0) -> None:
        for proc, _ in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc, _ in self.started:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.started.clear()


@contextlib.contextmanager
def processes(log_dir: Path) -> Iterator[Processes]:
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = Processes(log_dir)
    try:
        yield procs
    finally:
        procs.stop()


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, *, every: float = 0.05
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def run_helper(module: str, *args: str) -> str:
    """Run `python -m MODULE ARGS` to completion; its stdout (raises on failure)."""
    result = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result.stdout
