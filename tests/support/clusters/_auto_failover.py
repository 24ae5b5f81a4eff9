"""A pg_auto_failover formation: a monitor and two data nodes (primary and secondary),
each run by its own `pg_autoctl` keeper, as production runs them."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator

import psycopg

from ._node import Node, multi_host_dsn
from ._processes import PG_AUTOCTL, PG_BIN, ClusterError, Workdir, kill_tree, require

#: The monitor's failure detection, from tens of seconds down to a few: a health check
#: every second (1s timeout, one retry 0.5s later), a node unhealthy after 3s, and a
#: primary that does not report its own demotion given 3s (30s by default: the time
#: a partitioned primary has to notice and stop accepting writes) before its
#: secondary is promoted.
MONITOR_SETTINGS = """
pgautofailover.health_check_period = 1000
pgautofailover.health_check_timeout = 1000
pgautofailover.health_check_max_retries = 1
pgautofailover.health_check_retry_delay = 500
pgautofailover.node_considered_unhealthy_timeout = 3000
pgautofailover.primary_demote_timeout = 3000
pgautofailover.startup_grace_period = 2000
"""

#: How long a formation must have looked ready before a test crashes its primary: more
#: than the monitor takes to act on a node it saw down (unhealthy after 3s, a health
#: check a second, 3s for the demotion), with room for a loaded machine.
STEADY = 10.0

#: (reported state, goal state) of each data node, by node name, as the monitor says.
States = dict[str, tuple[str, str]]


@contextlib.contextmanager
def auto_failover() -> Iterator[Formation]:
    """A Formation, ready (a primary and a secondary); everything stopped and removed
    afterwards, however the block ends."""
    formation = Formation()
    try:
        formation.start()
        yield formation
    finally:
        formation.close()


class Formation:
    """`monitor` and the data nodes `nodes` (node1 starts as the primary, node2 as its
    secondary). pg_auto_failover's default replication quorum makes the secondary
    synchronous: a commit waits for it. `timings` holds how long each step took, in
    seconds."""

    def __init__(self) -> None:
        require(PG_AUTOCTL, PG_BIN / "initdb", PG_BIN / "pg_ctl")
        self.workdir = Workdir("pgaf")
        self.monitor = Node(self.workdir, "monitor")
        self.nodes = [Node(self.workdir, "node1"), Node(self.workdir, "node2")]
        self.timings: dict[str, float] = {}
        self._keepers: dict[str, subprocess.Popen[bytes]] = {}

    def monitor_uri(self) -> str:
        return (
            f"postgres://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover"
            "?sslmode=disable"
        )

    def multi_host_dsn(self, dbname: str = "postgres") -> str:
        """Both data nodes; libpq picks the one that accepts writes."""
        return multi_host_dsn(self.nodes, dbname)

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    def _keep(self, node: Node, *args: str) -> None:
        """Start `pg_autoctl ARGS` as `node`'s keeper, in the background."""
        log = self.workdir.path / f"{node.name}-pg_autoctl.log"
        self._keepers[node.name] = self.workdir.spawn(PG_AUTOCTL, *args, log=log)

    def _keeper_logs(self, lines: int = 15) -> str:
        texts = []
        for name in self._keepers:
            log = self.workdir.path / f"{name}-pg_autoctl.log"
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            texts.append(f"--- {name} ---\n" + "\n".join(tail))
        return "\n".join(texts)

    def start(self, timeout: float = 90) -> None:
        began = time.monotonic()
        common = [
            "--hostname", "127.0.0.1", "--listen", "127.0.0.1", "--skip-pg-hba", "--no-ssl",
            "--pgctl", str(PG_BIN / "pg_ctl"),
        ]  # fmt: skip
        # Our own initdb (trust for loopback only, fast settings) under pg_autoctl's;
        # --skip-pg-hba keeps it from opening anything wider.
        self.monitor.initdb()
        self.workdir.run(
            PG_AUTOCTL, "create", "monitor", "--pgdata", str(self.monitor.data_dir),
            "--pgport", str(self.monitor.port), *common,
        )  # fmt: skip
        self.monitor.append_settings(MONITOR_SETTINGS, "postgresql.auto.conf")
        self._keep(self.monitor, "run", "--pgdata", str(self.monitor.data_dir))
        self._wait(self._monitor_answers, timeout, "the monitor")
        self.timings["start_monitor"] = time.monotonic() - began
        first, second = self.nodes
        first.initdb()  # the secondary is made by pg_autoctl, from a base backup
        for node, state in ((first, "single"), (second, "secondary")):
            self._keep(
                node, "create", "postgres", "--pgdata", str(node.data_dir),
                "--pgport", str(node.port), "--name", node.name,
                "--monitor", self.monitor_uri(), "--run", *common,
            )  # fmt: skip
            self._wait(self._in_state(node, state), timeout, f"{node.name} to be {state}")
            self.timings[f"start_{node.name}"] = time.monotonic() - began
        self.wait_ready(timeout)
        self.timings["start"] = time.monotonic() - began

    def _in_state(self, node: Node, state: str) -> Callable[[], bool]:
        return lambda: self.states().get(node.name) == (state, state)

    def _monitor_answers(self) -> bool:
        try:
            self.states()
        except psycopg.Error:
            return False
        return True

    def states(self) -> States:
        """Each data node's (reported, goal) state, from the monitor."""
        with self.monitor.connect("pg_auto_failover") as conn:
            rows = conn.execute(
                "SELECT nodename, reportedstate::text, goalstate::text"
                " FROM pgautofailover.node ORDER BY nodeid"
            ).fetchall()
        return {str(name): (str(reported), str(goal)) for name, reported, goal in rows}

    def _wait(self, done: Callable[[], object], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            ended = [name for name, keeper in self._keepers.items() if keeper.poll() is not None]
            if ended or time.monotonic() > deadline:
                why = f"the keepers of {ended} exited" if ended else f"timed out after {timeout}s"
                raise ClusterError(
                    f"{why} waiting for {what}; states"
                    f" {self._states_or_error()}\n{self._keeper_logs()}"
                )
            time.sleep(0.1)

    def _states_or_error(self) -> object:
        try:
            return self.states()
        except psycopg.Error as exc:
            return exc

    def primary(self) -> Node | None:
        """The node the monitor has made primary and that reports being it: in state
        primary (with a secondary) or wait_primary (alone, taking writes without
        waiting for a secondary); None during a transition."""
        for name, (reported, goal) in self.states().items():
            if reported == goal and goal in ("primary", "wait_primary"):
                return self.node(name)
        return None

    def ready(self) -> bool:
        """Settled with both nodes in service: one primary, one secondary."""
        return sorted(self.states().values()) == [
            ("primary", "primary"),
            ("secondary", "secondary"),
        ]

    def wait_ready(self, timeout: float = 60) -> Node:
        """Wait until ready() and its primary accepts writes; that primary."""
        self._wait(self.ready, timeout, "a primary and a secondary")
        return self.wait_for_primary(timeout=timeout)

    def _writable_primary(self, other_than: Node | None) -> Node | None:
        try:
            node = self.primary()
            if node is None or node is other_than or node.in_recovery():
                return None
        except psycopg.OperationalError:
            return None  # the monitor or the node is restarting
        return node

    def wait_for_primary(self, *, other_than: Node | None = None, timeout: float = 60) -> Node:
        """Wait until the formation is settled on a primary (not `other_than`, when
        given) that accepts writes; that node."""
        found: list[Node] = []

        def settled() -> bool:
            node = self._writable_primary(other_than)
            if node is not None:
                found.append(node)
            return node is not None

        self._wait(settled, timeout, f"a primary other than {other_than}")
        return found[-1]

    def perform_switchover(self, timeout: float = 60) -> Node:
        """A planned failover (`pg_autoctl perform failover`): the primary hands over to
        its secondary and becomes its secondary; returns the new primary."""
        began = time.monotonic()
        old = self.wait_ready(timeout)
        self.workdir.run(
            PG_AUTOCTL, "perform", "failover", "--monitor", self.monitor_uri(),
            "--formation", "default", "--group", "0", "--wait", str(int(timeout)),
            timeout=timeout + 5,
        )  # fmt: skip
        self._wait(self.ready, timeout, "the switchover to end")
        new = self.wait_for_primary(other_than=old, timeout=timeout)
        self.timings["switchover"] = time.monotonic() - began
        return new

    def kill_primary_postmaster(self, timeout: float = 60) -> Node:
        """SIGKILL the primary's postmaster and backends, leaving its keeper running (as
        when PostgreSQL alone crashes), and wait until a primary accepts writes again
        from a new postmaster; that primary (the same node, restarted by its keeper,
        unless the monitor failed over in the meantime)."""
        old = self.wait_for_primary()
        killed = old.postmaster_pid()
        began = time.monotonic()
        old.kill()
        found: list[Node] = []

        def back() -> bool:
            node = self._writable_primary(None)
            if node is not None and node.postmaster_pid() != killed:
                found.append(node)
            return bool(found)

        self._wait(back, timeout, "a primary after its postmaster was killed")
        self.timings["kill_primary_postmaster"] = time.monotonic() - began
        return found[0]

    def crash_primary_node(self, timeout: float = 60) -> tuple[Node, Node]:
        """SIGKILL the primary's keeper, postmaster and backends at once (as when its
        host dies) and wait until the monitor has failed over to the secondary and it
        accepts writes; (the crashed node, the new primary). The crashed node stays
        down until restart_node(). First the formation must have been ready for
        STEADY seconds: after a postmaster kill the monitor may still fail over from
        the restarted node (it saw it down), leaving the other catching up, which no
        monitor promotes (a fresh clone's CI under load met that)."""
        self._wait(self._steadily(self.ready), timeout, f"ready for {STEADY:g}s on end")
        old = self.wait_for_primary()
        began = time.monotonic()
        keeper = self._keepers.pop(old.name)
        kill_tree(keeper.pid)
        keeper.wait(10)  # reaped: pg_autoctl takes a zombie's pid file for a live keeper
        new = self.wait_for_primary(other_than=old, timeout=timeout)
        self.timings["crash_failover"] = time.monotonic() - began
        return old, new

    @staticmethod
    def _steadily(done: Callable[[], bool]) -> Callable[[], bool]:
        """`done`, once it has held on every look for STEADY seconds."""
        since: float | None = None  # when `done` began to hold

        def steady() -> bool:
            nonlocal since
            if not done():
                since = None
                return False
            if since is None:
                since = time.monotonic()
            return time.monotonic() - since >= STEADY

        return steady

    def restart_node(self, node: Node, timeout: float = 60) -> None:
        """Start a crashed node's keeper again: it rejoins as the secondary (pg_autoctl
        rewinds it if it must). Returns once the formation is settled."""
        began = time.monotonic()
        node.wait_reaped()  # its old postmaster's pid must be free for the new one
        self._keep(node, "run", "--pgdata", str(node.data_dir))
        self._wait(self.ready, timeout, f"{node} to rejoin")
        self.timings["restart_node"] = time.monotonic() - began

    def close(self) -> None:
        """Kill every keeper (and so its PostgreSQL), data nodes first, and remove
        everything."""
        began = time.monotonic()
        with contextlib.ExitStack() as steps:  # every step runs, whichever fails
            steps.callback(self.workdir.remove)
            for node in (self.monitor, *self.nodes):
                steps.callback(node.cleanup)
            for name in ("monitor", *(n.name for n in self.nodes)):
                keeper = self._keepers.pop(name, None)
                if keeper is not None:
                    steps.callback(keeper.wait, 10)
                    steps.callback(kill_tree, keeper.pid)
        self.timings["teardown"] = time.monotonic() - began
