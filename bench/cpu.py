"""CPU seconds spent by processes on this machine, read from /proc (Linux only).

An end-to-end run on a 2-core machine is bound by CPU, which the Workers and the server
share, and the machine's speed moves from hour to hour; CPU time per item says which
side a difference comes from, and moves less than items/s does. The server's share is
that of every PostgreSQL process on the machine (backends and the server's own), so it
is only meaningful with the benchmark's server running here and no other one busy; with
none here it is not measured (None).

`bench.against` loads this file by its path into either tree's run, so it imports
nothing from `bench`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import NamedTuple

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system time of `pid` so far; None once it has gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_SECOND  # utime, stime


def _commands() -> Iterator[tuple[int, str]]:
    """Each process's id and command line (its arguments joined by spaces)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    yield int(entry), f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue


def server_pids() -> list[int]:
    return [pid for pid, command in _commands() if command.startswith("postgres")]


def pids_running(text: str) -> list[int]:
    """Processes whose command line contains `text`."""
    return [pid for pid, command in _commands() if text in command]


class Snapshot(NamedTuple):
    workers: dict[int, float]
    server: dict[int, float]


def snapshot(worker_pids: Iterable[int]) -> Snapshot:
    """CPU time so far of the given Worker processes and of the server's processes."""

    def times(pids: Iterable[int]) -> dict[int, float]:
        return {pid: s for pid in pids if (s := cpu_seconds(pid)) is not None}

    return Snapshot(times(worker_pids), times(server_pids()))


def ms_per_item(before: Snapshot, after: Snapshot, items: int) -> dict[str, float | None]:
    """CPU milliseconds per item between two snapshots, Workers' and server's. A server
    process that started in between counts in full, one that ended is missed."""

    def spent(start: dict[int, float], end: dict[int, float]) -> float:
        return sum(seconds - start.get(pid, 0.0) for pid, seconds in end.items())

    server = spent(before.server, after.server) * 1000 / items if after.server else None
    return {
        "worker_cpu_ms_per_item": spent(before.workers, after.workers) * 1000 / items,
        "server_cpu_ms_per_item": server,
    }
