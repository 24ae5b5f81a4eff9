"""One PostgreSQL 15 data directory on a local port, run as the service account."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

from ._processes import PG_BIN, ClusterError, Workdir, free_port, kill_tree, require, wait_gone

#: Every node's settings: small and fast, for tests only.
FAST_SETTINGS = """
# --- tests/support/clusters: small and fast, for tests only ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '{sockets}'
shared_buffers = 16MB
max_connections = 100
# fsync=off loses data when the operating system crashes, never when PostgreSQL does
# (a SIGKILLed server leaves its writes in the kernel's page cache): these tests only
# ever crash PostgreSQL.
fsync = off
# pg_rewind (a killed primary rejoining) needs both.
full_page_writes = on
wal_log_hints = on
wal_level = replica
max_wal_senders = 8
max_replication_slots = 8
wal_keep_size = 128MB
hot_standby = on
wal_receiver_status_interval = 1s
# A standby whose walreceiver failed tries again after this (5s by default).
wal_retrieve_retry_interval = 1s
# Checkpoints (pg_basebackup's first of all) done at once rather than spread.
checkpoint_completion_target = 0
log_line_prefix = '%m [%p] '
"""


class Node:
    """A data directory `workdir/name` served on 127.0.0.1:`port` (trust, user
    postgres). `initdb()` or a base backup makes it; `start()`/`stop()` use pg_ctl,
    unless pg_autoctl runs it; `kill()` crashes it; `cleanup()` always ends it."""

    def __init__(self, workdir: Workdir, name: str, port: int | None = None) -> None:
        self.workdir = workdir
        self.name = name
        self.data_dir = workdir.path / name
        self.port = port or free_port()
        self.log_path = workdir.path / f"{name}.log"

    def __repr__(self) -> str:
        return f"<Node {self.name} port={self.port}>"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname} connect_timeout=5"

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        """An autocommit connection, for setting up and checking."""
        return psycopg.connect(self.dsn(dbname), autocommit=True)

    def initdb(self) -> None:
        self.workdir.run(
            PG_BIN / "initdb", "-D", self.data_dir, "-U", "postgres", "--auth=trust",
            "--encoding=UTF8", "--no-sync",
        )  # fmt: skip
        self.append_settings(FAST_SETTINGS.format(sockets=self.workdir.sockets))

    def append_settings(self, text: str, file: str = "postgresql.conf") -> None:
        with (self.data_dir / file).open("a") as conf:
            conf.write(text)

    def start(self, *, timeout: float = 30) -> None:
        """Start with pg_ctl and wait until it accepts connections (read-only ones, for a
        standby)."""
        self.workdir.run(
            PG_BIN / "pg_ctl", "-D", self.data_dir, "-l", self.log_path,
            "-o", f"-c port={self.port}", "-w", "-t", str(int(timeout)), "start",
            timeout=timeout + 5,
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self.workdir.run(PG_BIN / "pg_ctl", "-D", self.data_dir, "-m", mode, "-w", "stop")

    def _recorded_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n")[0])
        except (OSError, ValueError):
            return None

    def postmaster_pid(self) -> int | None:
        """The running postmaster's pid; None when it is not running."""
        pid = self._recorded_pid()
        if pid is None:
            return None
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return None
        return None if state == "Z" else pid

    def kill(self) -> None:
        """Crash the server: SIGKILL its postmaster and every backend at once."""
        pid = self.postmaster_pid()
        if pid is None:
            raise ClusterError(f"{self}: no postmaster to kill")
        kill_tree(pid)

    def wait_reaped(self, timeout: float = 10) -> None:
        """After kill(): wait until the dead postmaster's pid is gone for good, so that
        a program run on this data directory (pg_rewind, pg_ctl start) may take it."""
        pid = self._recorded_pid()
        if pid is not None:
            wait_gone([pid], timeout, reaped=True)

    def in_recovery(self) -> bool:
        with self.connect() as conn:
            row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        return bool(row and row[0])

    def wait_writable(self, timeout: float = 30) -> None:
        """Wait until the node accepts a write (its promotion is over)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if not self.in_recovery():
                    return
            except psycopg.OperationalError:
                pass  # not accepting connections yet
            if time.monotonic() > deadline:
                raise ClusterError(f"{self} still not writable after {timeout}s\n{self.log()}")
            time.sleep(0.05)

    def log(self, lines: int = 30) -> str:
        """The end of the server log, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def cleanup(self) -> None:
        """Stop the server however it is (running, killed, half-started): immediate
        shutdown, else SIGKILL; then free the SysV shared memory a killed postmaster
        leaves behind (a few bytes, but one per crash until the next reboot)."""
        pid = self.postmaster_pid()
        if pid is not None:
            try:
                self.stop("immediate")
            except ClusterError:
                kill_tree(pid)
            wait_gone([pid], timeout=10)
        self._remove_shared_memory()

    def _remove_shared_memory(self) -> None:
        # postmaster.pid outlives only a postmaster that did not exit by itself; its
        # seventh line is "<key> <shmid>" of the segment it had made.
        # Removed only if it is still ours and nothing is attached to it.
        with contextlib.suppress(OSError, ValueError, IndexError):
            lines = (self.data_dir / "postmaster.pid").read_text().split("\n")
            shmid = lines[6].split()[1]
            owner = self.data_dir.stat().st_uid
            for row in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]:
                # key shmid perms size cpid lpid nattch uid ...
                fields = row.split()
                if fields[1] == shmid and fields[6] == "0" and int(fields[7]) == owner:
                    subprocess.run(["ipcrm", "-m", shmid], capture_output=True, check=False)


def multi_host_dsn(nodes: list[Node], dbname: str = "postgres") -> str:
    """libpq's multi-host DSN over `nodes`: it connects to the first that accepts
    writes (target_session_attrs=read-write)."""
    hosts = ",".join("127.0.0.1" for _ in nodes)
    ports = ",".join(str(node.port) for node in nodes)
    return (
        f"host={hosts} port={ports} user=postgres dbname={dbname} connect_timeout=5"
        " target_session_attrs=read-write"
    )


@contextlib.contextmanager
def lone_node(*, also_listen_on: str, trust: str) -> Iterator[Node]:
    """One node, started, that also listens on `also_listen_on` (an address of this
    host) and trusts connections from `trust` (an address) as it does loopback ones;
    stopped and removed afterwards, however the block ends."""
    require(PG_BIN / "initdb")
    workdir = Workdir("node")
    node = Node(workdir, "server")
    try:
        node.initdb()
        node.append_settings(f"listen_addresses = '127.0.0.1,{also_listen_on}'\n")
        node.append_settings(f"host all all {trust}/32 trust\n", "pg_hba.conf")
        node.start()
        yield node
    finally:
        node.cleanup()
        workdir.remove()
