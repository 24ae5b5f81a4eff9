"""Programs run as the clusters' unprivileged OS user, and process trees killed at once.

PostgreSQL, pg_autoctl and pgbouncer all refuse to run as root. When the tests run as
root (CI, this machine), every program the harnesses start runs as `trioworker-test`
(made by scripts/install-clusters.sh, or here at first use); otherwise as ourselves.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs

SERVICE_USER = "trioworker-test"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
PG_AUTOCTL = Path("/usr/bin/pg_autoctl")
PGBOUNCER = Path("/usr/sbin/pgbouncer")


class ClusterError(RuntimeError):
    """A cluster program failed, or a cluster did not reach the state asked for in time."""


def require(*programs: Path) -> None:
    """Raise ClusterError naming the install script when a program is missing."""
    missing = [str(p) for p in programs if not os.access(p, os.X_OK)]
    if missing:
        raise ClusterError(
            f"missing {', '.join(missing)}: run scripts/install-clusters.sh (./dev test runs it)"
        )


@attrs.frozen
class Account:
    uid: int
    gid: int


@functools.cache
def service_account() -> Account | None:
    """The account programs run as when we are root (created at first use if the
    install script has not made it); None when we are not root."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(SERVICE_USER)
    except KeyError:
        # Another test process may be creating it at the same moment: look again
        # rather than trust useradd's exit status.
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
             SERVICE_USER],
            capture_output=True,
            check=False,
        )  # fmt: skip
        entry = pwd.getpwnam(SERVICE_USER)
    return Account(entry.pw_uid, entry.pw_gid)


def _identity() -> tuple[int | None, int | None, list[int] | None]:
    """subprocess's (user, group, extra_groups) for the service account."""
    account = service_account()
    if account is None:
        return None, None, None
    return account.uid, account.gid, []


class Workdir:
    """A fresh directory under /tmp owned by the service account (short, so socket
    paths fit), with the environment every program runs in; removed by `remove()`."""

    def __init__(self, prefix: str) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=f"tw-{prefix}-", dir="/tmp"))
        self.path.chmod(0o755)
        self.chown(self.path)
        self.sockets = self.mkdir("sock")
        self.mkdir("run")  # XDG_RUNTIME_DIR: pg_autoctl's pid files, else in /tmp/pg_autoctl

    def mkdir(self, name: str) -> Path:
        path = self.path / name
        path.mkdir()
        self.chown(path)
        return path

    def chown(self, path: Path) -> None:
        account = service_account()
        if account is not None:
            os.chown(path, account.uid, account.gid)

    def env(self) -> dict[str, str]:
        # Nothing inherited but PATH: no PGPASSWORD, PGDATABASE or PGSERVICE of ours
        # reaches the clusters' programs.
        return {
            "PATH": f"{PG_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(self.path),
            "XDG_CONFIG_HOME": str(self.path / "config"),
            "XDG_DATA_HOME": str(self.path / "share"),
            "XDG_RUNTIME_DIR": str(self.path / "run"),
            "PGHOST": str(self.sockets),
            "PGUSER": "postgres",
            "LANG": "C.UTF-8",
        }

    def run(self, *args: str | Path, timeout: float = 60) -> str:
        """Run a program to its end as the service account; its stdout, or ClusterError
        with its output."""
        argv = [str(a) for a in args]
        user, group, extra_groups = _identity()
        try:
            result = subprocess.run(
                argv,
                cwd=self.path,
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                user=user,
                group=group,
                extra_groups=extra_groups,
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{argv[0]} did not finish in {timeout}s: {argv}") from exc
        if result.returncode != 0:
            raise ClusterError(
                f"{Path(argv[0]).name} failed ({result.returncode}): {argv}\n"
                f"{result.stdout.strip()}\n{result.stderr.strip()}"
            )
        return result.stdout

    def spawn(self, *args: str | Path, log: Path) -> subprocess.Popen[bytes]:
        """Start a long-running program as the service account in a session of its
        own, its output to `log`."""
        user, group, extra_groups = _identity()
        with log.open("ab") as out:
            return subprocess.Popen(
                [str(a) for a in args],
                cwd=self.path,
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                user=user,
                group=group,
                extra_groups=extra_groups,
            )

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A local port bound but never listening, so every connection to it is refused
    at once, and no other program can take it while we hold it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def kill_tree(pid: int, *, timeout: float = 10) -> None:
    """SIGKILL `pid` and all its descendants as one crash: each is stopped (SIGSTOP)
    before any dies, so none sees another's death and acts on it (a backend cannot
    commit, a supervisor cannot restart its child). Returns when all are gone."""
    frozen: list[int] = []
    pending = [pid]
    while pending:  # stopped processes cannot fork: the tree grows no more
        for p in pending:
            _signal(p, signal.SIGSTOP)
        frozen += pending
        tree = _children()
        pending = [c for p in pending for c in tree.get(p, []) if c not in frozen]
    for p in frozen:
        _signal(p, signal.SIGKILL)
    wait_gone(frozen, timeout)


def wait_gone(pids: Iterable[int], timeout: float, *, reaped: bool = False) -> None:
    """Wait until every process in `pids` is dead, or with `reaped` until its parent
    has also collected it: a zombie holds its pid, and PostgreSQL takes a data
    directory whose postmaster.pid names a live pid, zombies included, for in use
    (an orphan's parent is init, which may reap it only a second or two later)."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if _alive(p, zombie_alive=reaped)]
        if not alive:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"processes {alive} still alive after {timeout}s")
        time.sleep(0.02)


def _alive(pid: int, *, zombie_alive: bool = False) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return zombie_alive or state != "Z"
