"""The queues the end-to-end benchmark runs, each behind one small interface.

Every system gets a database of its own on the same server, the same number of worker
processes, no-op handlers, and an enqueue of all items in one statement; its clock
starts when that statement has committed (`time.monotonic()`, one clock for every
process) and stops when nothing is left unfinished.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Protocol

import attrs
import psycopg

from bench import peer_graphile
from bench.common import QUERIES, connect
from bench.procs import run_helper, trioworker_command

#: Items i of a serialised run go to scope/lock/entrypoint/queue i % SERIAL_KEYS.
SERIAL_KEYS = 50


class System(Protocol):
    @property
    def label(self) -> str: ...

    @property
    def family(self) -> str:
        """The queue, for "best peer" comparisons."""
        ...

    @property
    def serialised(self) -> bool:
        """One item at a time per key (scope, lock, limited entrypoint)."""
        ...

    @property
    def processes(self) -> int: ...

    @property
    def migrated(self) -> bool:
        """Whether its database starts with trioworker's schema."""
        ...

    def install(self, dsn: str) -> None: ...

    def worker_commands(self, dsn: str) -> list[list[str]]: ...

    def enqueue(self, dsn: str, n: int) -> float:
        """Queue n items in one statement; time.monotonic() once it has committed."""
        ...

    def unfinished(self, conn: psycopg.Connection[Any]) -> int: ...

    def settings(self) -> dict[str, Any]: ...


def _count(conn: psycopg.Connection[Any], name: str) -> int:
    row = conn.execute(QUERIES[name]).fetchone()
    return int(row[0]) if row else 0


@attrs.frozen
class Trioworker:
    label: str
    serialised: bool
    processes: int
    concurrency: int
    poll: float = 5.0
    #: One `run --processes N` (a supervisor and its N Workers), not N `run`s.
    supervised: bool = False
    family: str = "trioworker"
    migrated: bool = True
    #: The default running limit of scopes (docs/design/limits.md); 1: the founding rule.
    scope_limit: int = 1
    #: Items in fans of this many (0: none): a root, `fan - 2` items after it, and one
    #: item after all of those (`after=`, issue 34), unscoped.
    fan: int = 0
    #: A global running limit on the kind (None: none).
    kind_limit: int | None = None

    def install(self, dsn: str) -> None:
        """The database is a copy of the migrated template; limits, if any, are set."""
        with connect(dsn) as conn:
            if self.scope_limit != 1:
                conn.execute(QUERIES["set_default_limit"], {"running": self.scope_limit})
            if self.kind_limit is not None:
                conn.execute(
                    QUERIES["set_limit"],
                    {"kind": "Noop", "running": self.kind_limit, "rate": None, "per": None},
                )

    def worker_commands(self, dsn: str) -> list[list[str]]:
        if self.supervised:
            return [trioworker_command(dsn, "bench", "--concurrency", str(self.concurrency),
                                       "--poll", str(self.poll), "--processes",
                                       str(self.processes))]  # fmt: skip
        return [
            trioworker_command(
                dsn, f"bench-{i}", "--concurrency", str(self.concurrency), "--poll", str(self.poll)
            )
            for i in range(self.processes)
        ]

    def enqueue(self, dsn: str, n: int) -> float:
        if self.fan:
            return enqueue_fans(dsn, n, self.fan)
        params = {"kind": "Noop", "prefix": "s-", "n": n, "age": 0,
                  "scopes": SERIAL_KEYS if self.serialised else 0}  # fmt: skip
        with connect(dsn) as conn:
            conn.execute(QUERIES["insert_queued"], params)
            return time.monotonic()

    def unfinished(self, conn: psycopg.Connection[Any]) -> int:
        return _count(conn, "unfinished")

    def settings(self) -> dict[str, Any]:
        return attrs.asdict(self)


def enqueue_fans(dsn: str, n: int, fan: int) -> float:
    """`n` items (rounded down to whole fans) in fans of `fan`, in one transaction;
    the time it committed."""
    with connect(dsn) as conn, conn.transaction():
        rows = conn.execute(
            QUERIES["insert_fan_roots"], {"kind": "Noop", "groups": max(n // fan, 1)}
        ).fetchall()
        roots = [r[0] for r in rows]
        children: dict[int, list[int]] = {r: [] for r in roots}
        for id, root in conn.execute(
            QUERIES["insert_fan_children"], {"kind": "Noop", "roots": roots, "children": fan - 2}
        ).fetchall():
            children[root].append(id)
        for parents in children.values():
            conn.execute(QUERIES["insert_fan_in"], {"kind": "Noop", "parents": parents})
    return time.monotonic()


@attrs.frozen
class Procrastinate:
    label: str
    serialised: bool  # a `lock` per job, over SERIAL_KEYS values
    processes: int
    concurrency: int
    family: str = "procrastinate"
    migrated: bool = False

    def install(self, dsn: str) -> None:
        run_helper("bench.peer_procrastinate", "install", "--dsn", dsn)

    def worker_commands(self, dsn: str) -> list[list[str]]:
        return [
            [sys.executable, "-m", "bench.peer_procrastinate", "worker", "--dsn", dsn,
             "--concurrency", str(self.concurrency)]
            for _ in range(self.processes)
        ]  # fmt: skip

    def enqueue(self, dsn: str, n: int) -> float:
        locks = str(SERIAL_KEYS if self.serialised else 0)
        out = run_helper("bench.peer_procrastinate", "enqueue", "--dsn", dsn, "--n", str(n),
                         "--locks", locks)  # fmt: skip
        return float(out.split()[-1])

    def unfinished(self, conn: psycopg.Connection[Any]) -> int:
        return _count(conn, "procrastinate_unfinished")

    def settings(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class Pgqueuer:
    label: str
    serialised: bool  # SERIAL_KEYS entrypoints, each with concurrency_limit=1
    processes: int
    batch_size: int
    pool: bool = False
    family: str = "pgqueuer"
    migrated: bool = False
    #: Each entrypoint's concurrency_limit (0: none; serialised: 1 unless given).
    limit: int = 0

    def install(self, dsn: str) -> None:
        run_helper("bench.peer_pgqueuer", "install", "--dsn", dsn)

    def _entrypoint_args(self) -> list[str]:
        if self.serialised:
            return ["--entrypoints", str(SERIAL_KEYS), "--limit", str(self.limit or 1)]
        return ["--entrypoints", "0", "--limit", str(self.limit)] if self.limit else []

    def worker_commands(self, dsn: str) -> list[list[str]]:
        return [
            [sys.executable, "-m", "bench.peer_pgqueuer", "worker", "--dsn", dsn,
             "--batch-size", str(self.batch_size), *self._entrypoint_args(),
             *(["--pool"] if self.pool else [])]
            for _ in range(self.processes)
        ]  # fmt: skip

    def enqueue(self, dsn: str, n: int) -> float:
        out = run_helper("bench.peer_pgqueuer", "enqueue", "--dsn", dsn, "--n", str(n),
                         *self._entrypoint_args()[:2])  # fmt: skip
        return float(out.split()[-1])

    def unfinished(self, conn: psycopg.Connection[Any]) -> int:
        return _count(conn, "pgqueuer_unfinished")

    def settings(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class Graphile:
    """Graphile Worker on Node.js (bench/graphile/run.mjs); without `local_queue` and
    `batch_delay`, its defaults but for the concurrency."""

    label: str
    serialised: bool  # job i in the named queue "q-{i % SERIAL_KEYS}": one at a time each
    processes: int
    concurrency: int
    local_queue: int | None = None  # preset.worker.localQueue.size
    batch_delay: int | None = None  # preset.worker.completeJobBatchDelay (and failJob...), ms
    family: str = "graphile"
    migrated: bool = False

    def install(self, dsn: str) -> None:
        peer_graphile.install(dsn)

    def worker_commands(self, dsn: str) -> list[list[str]]:
        args = ["--concurrency", str(self.concurrency)]
        if self.local_queue is not None:
            args += ["--local-queue", str(self.local_queue)]
        if self.batch_delay is not None:
            args += ["--batch-delay", str(self.batch_delay)]
        return [peer_graphile.command(dsn, "worker", *args) for _ in range(self.processes)]

    def enqueue(self, dsn: str, n: int) -> float:
        params = {"n": n, "queues": SERIAL_KEYS if self.serialised else 0}
        with connect(dsn) as conn:
            conn.execute(QUERIES["graphile_add_jobs"], params)
            return time.monotonic()

    def unfinished(self, conn: psycopg.Connection[Any]) -> int:
        return _count(conn, "graphile_unfinished")

    def settings(self) -> dict[str, Any]:
        return {**attrs.asdict(self), **peer_graphile.versions()}
