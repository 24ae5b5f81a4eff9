"""CPU seconds spent by processes on this machine, read from /proc (Linux only).

An end-to-end run on a 2-core machine is bound by CPU, which the Workers and the server
share, and the machine's speed moves from hour to hour; CPU time per item says which
side a difference comes from, and moves less than items/s does. The server's share is
that of the client backends of the database under test (`database_pids`: its
statements' own work), not the harness's connection, not other databases' backends
(other engineers' tests on the same server), not autovacuum, the WAL writer or the
checkpointer, whose work comes and goes with the run's timing. A server on another
machine is not measured (None).

`bench.against` loads this file by its path into either tree's run, so it imports
nothing from `bench`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import attrs

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def cpu_seconds(pid: int) -> float | None:
    """User + system time of `pid` so far; None once it has gone."""
    fields = _stat(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND  # utime, stime


def children_of(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) and int(fields[1]) == parent:
            found.append(int(entry))
    return found


def descendants_of(parent: int) -> list[int]:
    """Every process below `parent`: a `run` supervisor's Workers are its children."""
    found, parents = [], [parent]
    while parents:
        children = [pid for p in parents for pid in children_of(p)]
        found += children
        parents = children
    return found


#: The pids of the client backends of the connection's database but its own (and
#: those of `%(exclude)s`): the Workers' sessions, wherever they come from.
DATABASE_BACKENDS = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND pid <> pg_backend_pid() AND pid <> ALL(%(exclude)s::integer[])
"""


def database_pids(conn: Any, exclude: Iterable[int] = ()) -> list[int]:
    """The client backends serving the database `conn` (a psycopg connection) is on,
    but `conn`'s own and `exclude`'s; none if the server is on another machine."""
    if _stat(conn.info.backend_pid) is None:
        return []
    rows = conn.execute(DATABASE_BACKENDS, {"exclude": list(exclude)}).fetchall()
    return [int(pid) for (pid,) in rows]


def server_pids(backend_pid: int) -> list[int]:
    """Every process of the server that runs the backend `backend_pid` (the children of
    its postmaster); none if that backend is not on this machine."""
    fields = _stat(backend_pid)
    return children_of(int(fields[1])) if fields is not None else []


@attrs.frozen
class Snapshot:
    workers: dict[int, float]
    server: dict[int, float]


def snapshot(worker_pids: Iterable[int], server: Iterable[int]) -> Snapshot:
    """CPU time so far of the given Worker processes and server processes."""

    def times(pids: Iterable[int]) -> dict[int, float]:
        return {pid: s for pid in pids if (s := cpu_seconds(pid)) is not None}

    return Snapshot(times(worker_pids), times(server))


def ms_per_item(before: Snapshot, after: Snapshot, items: int) -> dict[str, float | None]:
    """CPU milliseconds per item between two snapshots, the Workers' and the server's
    (None: no such process was found). A process that started in between counts in
    full, one that ended in between is missed."""

    def spent(start: dict[int, float], end: dict[int, float]) -> float | None:
        if not end:
            return None
        return sum(seconds - start.get(pid, 0.0) for pid, seconds in end.items()) * 1000 / items

    return {
        "worker_cpu_ms_per_item": spent(before.workers, after.workers),
        "server_cpu_ms_per_item": spent(before.server, after.server),
    }
