"""A primary and an asynchronous streaming standby, failed over by hand: the
lost-commit case."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from psycopg import sql

from ._node import Node, multi_host_dsn
from ._processes import PG_BIN, ClusterError, Workdir, refused_port, require


@contextlib.contextmanager
def streaming_pair() -> Iterator[StreamingPair]:
    """A StreamingPair, started; everything stopped and removed afterwards, however
    the block ends."""
    pair = StreamingPair()
    try:
        pair.start()
        yield pair
    finally:
        pair.close()


class StreamingPair:
    """`primary` and `standby` are the nodes by the roles they start in (they keep
    those names after a promotion). Replication is asynchronous: a commit on the
    primary is acknowledged before the standby has it. `timings` holds how long each
    step took, in seconds."""

    def __init__(self) -> None:
        require(PG_BIN / "initdb", PG_BIN / "pg_basebackup", PG_BIN / "pg_rewind")
        self.workdir = Workdir("pair")
        self.primary = Node(self.workdir, "primary")
        self.standby = Node(self.workdir, "standby")
        self.timings: dict[str, float] = {}
        self._held = contextlib.ExitStack()

    def multi_host_dsn(self, dbname: str = "postgres") -> str:
        """Both nodes, primary first; libpq picks the one that accepts writes."""
        return multi_host_dsn([self.primary, self.standby], dbname)

    def start(self) -> None:
        began = time.monotonic()
        self.primary.initdb()
        self.primary.start()
        self.workdir.run(
            PG_BIN / "pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port),
            "-U", "postgres", "-D", self.standby.data_dir, "--wal-method=stream",
            "--checkpoint=fast", "--no-sync",
        )  # fmt: skip
        self._follow(self.standby, self.primary)
        self.standby.start()
        self.wait_streaming(self.primary, self.standby)
        self.timings["start"] = time.monotonic() - began

    def _follow(self, follower: Node, source: Node) -> None:
        """Make the stopped `follower` a standby of `source` when it next starts."""
        signal_file = follower.data_dir / "standby.signal"
        signal_file.touch()
        self.workdir.chown(signal_file)
        # The last setting in the file wins over any a backup or a rewind brought.
        follower.append_settings(
            f"primary_conninfo = '{self._conninfo(follower, source.port)}'\n",
            "postgresql.auto.conf",
        )

    @staticmethod
    def _conninfo(follower: Node, port: int) -> str:
        return f"host=127.0.0.1 port={port} user=postgres application_name={follower.name}"

    def wait_streaming(self, source: Node, follower: Node, timeout: float = 30) -> None:
        """Wait until `source` streams WAL to `follower`."""
        deadline = time.monotonic() + timeout
        query = "SELECT state FROM pg_stat_replication WHERE application_name = %s"
        while True:
            with source.connect() as conn:
                row = conn.execute(query, [follower.name]).fetchone()
            if row and row[0] == "streaming":
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{source} not streaming to {follower} after {timeout}s\n{follower.log()}"
                )
            time.sleep(0.05)

    def wait_replayed(self, timeout: float = 30) -> None:
        """Wait until the standby has replayed everything the primary has written so
        far (its commits are then visible there)."""
        with self.primary.connect() as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        target = row[0]
        deadline = time.monotonic() + timeout
        while True:
            with self.standby.connect() as conn:
                row = conn.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [target]
                ).fetchone()
            if row and row[0]:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"standby has not replayed {target} after {timeout}s")
            time.sleep(0.02)

    def cut_replication(self, timeout: float = 30) -> None:
        """From now on, commits on the primary do not reach the standby (it keeps what
        it has). The standby's primary_conninfo is pointed at a port that refuses every
        connection and reloaded: PostgreSQL then ends its walreceiver, the primary's
        walsender goes with it, and no new one can connect. Returns once the primary
        has no walsender left for the standby, so nothing committed after the return
        can be sent; the primary goes on accepting commits (asynchronous replication
        waits for no one)."""
        began = time.monotonic()
        port = self._held.enter_context(refused_port())
        self._set_conninfo(self._conninfo(self.standby, port))
        deadline = time.monotonic() + timeout
        senders = "SELECT count(*) FROM pg_stat_replication WHERE application_name = %s"
        receiving = "SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'"
        while True:
            with self.primary.connect() as conn:
                sending = conn.execute(senders, [self.standby.name]).fetchone()
            with self.standby.connect() as conn:
                received = conn.execute(receiving).fetchone()
            if sending == (0,) and received == (0,):
                break
            if time.monotonic() > deadline:
                raise ClusterError(f"replication still running {timeout}s after the cut")
            time.sleep(0.02)
        self.timings["cut_replication"] = time.monotonic() - began

    def restore_replication(self) -> None:
        """Undo cut_replication(): the standby streams from the primary again and
        catches up."""
        self._set_conninfo(self._conninfo(self.standby, self.primary.port))
        self.wait_streaming(self.primary, self.standby)

    def _set_conninfo(self, conninfo: str) -> None:
        with self.standby.connect() as conn:
            conn.execute(
                sql.SQL("ALTER SYSTEM SET primary_conninfo = {}").format(sql.Literal(conninfo))
            )
            conn.execute("SELECT pg_reload_conf()")

    def kill_primary(self) -> None:
        """Crash the primary: SIGKILL of its postmaster and backends at once."""
        began = time.monotonic()
        self.primary.kill()
        self.timings["kill_primary"] = time.monotonic() - began

    def promote_standby(self, timeout: float = 30) -> None:
        """Promote the standby (pg_ctl promote) and wait until it accepts writes."""
        began = time.monotonic()
        self.workdir.run(
            PG_BIN / "pg_ctl", "-D", self.standby.data_dir, "-w", "-t", str(int(timeout)),
            "promote",
            timeout=timeout + 5,
        )  # fmt: skip
        self.standby.wait_writable(timeout)
        self.timings["promote_standby"] = time.monotonic() - began

    def rejoin_old_primary(self, timeout: float = 60) -> None:
        """After kill_primary() and promote_standby(): the old primary rewound onto the
        promoted standby's timeline (pg_rewind, which throws away the commits only it
        had) and restarted as its standby, so that it answers writes with SQLSTATE
        25006 as a demoted primary does."""
        began = time.monotonic()
        if self.primary.postmaster_pid() is not None:
            raise ClusterError("rejoin_old_primary() needs the old primary killed first")
        self.primary.wait_reaped()
        with self.standby.connect() as conn:
            # pg_rewind reads the source's timeline from its control file, which a
            # promotion updates only at its next checkpoint.
            conn.execute("CHECKPOINT")
        self.workdir.run(
            PG_BIN / "pg_rewind", "-D", self.primary.data_dir,
            f"--source-server={self.standby.dsn()}", "--no-sync",
            timeout=timeout,
        )  # fmt: skip
        self._follow(self.primary, self.standby)
        self.primary.start(timeout=timeout)
        self.wait_streaming(self.standby, self.primary, timeout)
        self.timings["rejoin_old_primary"] = time.monotonic() - began

    def close(self) -> None:
        """Stop both nodes however they are, and remove everything."""
        began = time.monotonic()
        with contextlib.ExitStack() as steps:  # every step runs, whichever fails
            steps.callback(self.workdir.remove)
            steps.push(self._held)
            steps.callback(self.primary.cleanup)
            steps.callback(self.standby.cleanup)
        self.timings["teardown"] = time.monotonic() - began
