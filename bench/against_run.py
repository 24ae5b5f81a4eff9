"""One run for `bench.against`: `python -P bench/against_run.py DSN unscoped|scoped`,
started in the directory of the tree to measure, with that tree first on the path.

It runs that tree's own `bench.e2e.run_once` for one trioworker system (10,000 no-op
items, 2 processes x 32) and prints one JSON line: items/s, whether every item finished,
and the CPU an item took in the Workers and the server (the database's client
backends), read with this tree's
`bench/cpu.py` (loaded by its path) from the enqueue of the measured items (the warm-up
batch is smaller) to the end of the wait for them. `-P` keeps this file's directory off
the path, so `bench` is the measured tree's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

from bench import e2e
from bench.common import server
from bench.systems import Trioworker

ITEMS = 10_000


def load_cpu() -> Any:
    spec = importlib.util.spec_from_file_location("against_cpu", Path(__file__).with_name("cpu.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    server_dsn, scoped = sys.argv[1], sys.argv[2] == "scoped"
    cpu = load_cpu()
    marks: list[Any] = []  # cpu.Snapshot, before and after
    measured: list[str] = []  # the database of the measured run
    enqueue, wait_finished = Trioworker.enqueue, e2e.wait_finished

    def mark(dsn: str, harness: int | None = None) -> None:
        # The Workers are below this process (each `run` supervises its own Worker); the
        # server's side is the database's client backends but the harness's poll's
        # (`harness`: known at the end, which is when it counts).
        with psycopg.connect(dsn, autocommit=True) as conn:
            exclude = [] if harness is None else [harness]
            marks.append(cpu.snapshot(cpu.descendants_of(os.getpid()),
                                      cpu.database_pids(conn, exclude)))  # fmt: skip

    def measured_enqueue(self: Trioworker, dsn: str, n: int) -> float:
        if n == ITEMS:
            measured.append(dsn)
            mark(dsn)
        return enqueue(self, dsn, n)

    def measured_wait(*args: Any, **kwargs: Any) -> int:
        left = wait_finished(*args, **kwargs)
        if len(marks) == 1:
            mark(measured[0], args[0].info.backend_pid)
        return left

    Trioworker.enqueue = measured_enqueue  # type: ignore[method-assign]
    e2e.wait_finished = measured_wait
    system = Trioworker("against", scoped, 2, concurrency=32)
    with server(server_dsn) as srv:
        result = e2e.run_once(srv, system, ITEMS, Path(tempfile.mkdtemp()))
    before, after = marks
    print(json.dumps({"items_per_s": result["items_per_s"], "complete": result["complete"],
                      **cpu.ms_per_item(before, after, ITEMS)}))  # fmt: skip


if __name__ == "__main__":
    main()
