"""Worker processes for tests: `python -m trioworker run`, as users run it.

`run` is a supervisor and its Worker is a child of it (trioworker/_cli/supervisor.py):
the pid a handler records, or a Worker advertises, is the child's. `worker_pids` finds
the children; `pause`/`resume` stop and continue the pair together; `kill_workers`
SIGKILLs the Workers, which the supervisor follows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from examples.media._observer import Span, read_spans

ROOT = Path(__file__).parents[2]
APP = "tests.apps.recording:registry"


class WorkerProcess:
    def __init__(
        self,
        dsn: str,
        args: list[str],
        log_dir: Path,
        name: str,
        env: dict[str, str],
        *,
        app: str = APP,
        prefix: Sequence[str] = (),
    ):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "trioworker", "--dsn", dsn, "run", "--app", app,
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

    def worker_pid(self, timeout: float = 30) -> int:
        """The pid of its one Worker (the child the supervisor starts)."""
        pids: list[int] = wait_for(lambda: worker_pids(self.proc.pid), timeout, "its Worker")
        return pids[0]

    def pause(self) -> None:
        pause(self.proc.pid)

    def resume(self) -> None:
        resume(self.proc.pid)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._log.close()


@contextmanager
def workers(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """start(dsn, *args, name=...) starts a Worker process (under `prefix`, a command
    that execs it: `ip netns exec NAME`, say); all are killed at the end."""
    started: list[WorkerProcess] = []
    observer_log = tmp_path / "observer.jsonl"

    def start(
        dsn: str,
        *args: str,
        name: str,
        env: dict[str, str] | None = None,
        app: str = APP,
        prefix: Sequence[str] = (),
    ) -> WorkerProcess:
        worker = WorkerProcess(
            dsn,
            list(args),
            tmp_path,
            name,
            {"TW_OBSERVER_LOG": str(observer_log), **(env or {})},
            app=app,
            prefix=prefix,
        )
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.stop()


def worker_pids(supervisor: int) -> list[int]:
    """The Worker processes of a `run` supervisor: its children (it forks them from its
    main thread) that run with a watchdog pipe. Others come and go: psycopg's import
    runs `ldconfig -p`."""
    try:
        children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    except FileNotFoundError:  # it has exited
        return []
    return [int(pid) for pid in children if b"\0--watchdog-fd\0" in _cmdline(int(pid))]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:  # it has exited
        return b""


def ended(pid: int) -> bool:
    """Whether process `pid` has ended: gone, or a zombie not reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return True
    return stat.rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")


def pause(supervisor: int) -> None:
    """SIGSTOP a `run` supervisor and its Workers: the pair pauses together."""
    os.kill(supervisor, signal.SIGSTOP)
    for pid in worker_pids(supervisor):
        os.kill(pid, signal.SIGSTOP)


def resume(supervisor: int) -> None:
    """SIGCONT the Workers first, then their supervisor."""
    for pid in worker_pids(supervisor):
        os.kill(pid, signal.SIGCONT)
    os.kill(supervisor, signal.SIGCONT)


def kill_workers(proc: subprocess.Popen[Any], timeout: float = 30) -> list[int]:
    """SIGKILL a `run` process's Workers (itself, if it has none yet), as a crash or
    the OOM killer would; it follows them. Returns once all are dead, with their pids."""
    pids = worker_pids(proc.pid)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    if not pids:
        proc.kill()
    proc.wait(timeout=timeout)
    return pids


def observed(tmp_path: Path) -> list[dict[str, Any]]:
    """The raw observer log: one dict per start/end line (see tests/apps/recording.py)."""
    path = tmp_path / "observer.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def attempt_spans(tmp_path: Path) -> list[Span]:
    """The observer log as attempts, each with its start and end."""
    return read_spans(tmp_path / "observer.jsonl")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
