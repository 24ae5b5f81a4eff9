"""pgqueuer, for the end-to-end comparison: schema, enqueue and a worker process.

    python -m bench.peer_pgqueuer install --dsn DSN
    python -m bench.peer_pgqueuer enqueue --dsn DSN --n N [--entrypoints 50]
    python -m bench.peer_pgqueuer worker --dsn DSN [--entrypoints 50 --limit 1]
                                         [--batch-size B] [--pool]

Runs in processes of its own, without trioworker or trio-asyncio imported, on asyncpg
(pgqueuer's psycopg driver waits up to 1 s for notifications inside its queries).
With `--entrypoints K`, job i goes to entrypoint "noop-{i % K}", each limited to
`--limit` concurrent jobs across all workers: pgqueuer's nearest analogue to scopes.
`enqueue` inserts every job in one statement and prints `time.monotonic()` after it.
A worker counts its claims (`Queries.dequeue` calls, and the jobs they returned) and
its finishes (`Queries.log_jobs` calls, and their jobs), and prints the counts so far as
a `bench-counts {...}` line on SIGWINCH (bench/statements.py reads them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from typing import Any

import asyncpg  # type: ignore[import-untyped]  # asyncpg publishes no type information
import psycopg.conninfo
from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries


def entrypoint_names(entrypoints: int) -> list[str]:
    return [f"noop-{k}" for k in range(entrypoints)] if entrypoints else ["noop"]


def asyncpg_params(dsn: str) -> dict[str, Any]:
    """asyncpg's keyword arguments for a libpq DSN (asyncpg does not parse key=value)."""
    given = psycopg.conninfo.conninfo_to_dict(dsn)
    names = {"host": "host", "port": "port", "user": "user", "password": "password",
             "dbname": "database"}  # fmt: skip
    return {ours: given[theirs] for theirs, ours in names.items() if theirs in given}


async def install(dsn: str) -> None:
    conn = await asyncpg.connect(**asyncpg_params(dsn))
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def enqueue(dsn: str, n: int, entrypoints: int) -> float:
    names = entrypoint_names(entrypoints)
    conn = await asyncpg.connect(**asyncpg_params(dsn))
    try:
        await Queries(AsyncpgDriver(conn)).enqueue(
            [names[i % len(names)] for i in range(n)], [None] * n, [0] * n
        )
        return time.monotonic()
    finally:
        await conn.close()


async def noop(job: Job) -> None:
    """Nothing, like the trioworker bench handler."""


COUNTS = {"claims": 0, "claimed": 0, "finishes": 0, "finished": 0}


def count_calls() -> None:
    """Count the dequeue and log_jobs calls of every Queries (and their jobs)."""
    dequeue, log_jobs = Queries.dequeue, Queries.log_jobs

    async def counted_dequeue(self: Queries, *args: Any, **kwargs: Any) -> Any:
        jobs = await dequeue(self, *args, **kwargs)
        COUNTS["claims"] += 1
        COUNTS["claimed"] += len(jobs)
        return jobs

    async def counted_log_jobs(self: Queries, job_status: Any, *args: Any, **kwargs: Any) -> Any:
        COUNTS["finishes"] += 1
        COUNTS["finished"] += len(job_status)
        return await log_jobs(self, job_status, *args, **kwargs)

    Queries.dequeue = counted_dequeue  # type: ignore[method-assign]
    Queries.log_jobs = counted_log_jobs  # type: ignore[method-assign]


def print_counts() -> None:
    print("bench-counts " + json.dumps(COUNTS), flush=True)
    sys.stdout.flush()


async def worker(dsn: str, entrypoints: int, limit: int, batch_size: int, pool: bool) -> None:
    count_calls()
    asyncio.get_running_loop().add_signal_handler(signal.SIGWINCH, print_counts)
    params = asyncpg_params(dsn)
    if pool:
        async with asyncpg.create_pool(**params, min_size=2, max_size=8) as connections:
            await _run(AsyncpgPoolDriver(connections), entrypoints, limit, batch_size)
    else:
        conn = await asyncpg.connect(**params)
        try:
            await _run(AsyncpgDriver(conn), entrypoints, limit, batch_size)
        finally:
            await conn.close()


async def _run(driver: Any, entrypoints: int, limit: int, batch_size: int) -> None:
    qm = QueueManager(Queries(driver))
    for name in entrypoint_names(entrypoints):
        qm.entrypoint(name, concurrency_limit=limit)(noop)
    await qm.run(batch_size=batch_size)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_pgqueuer")
    parser.add_argument("command", choices=["install", "enqueue", "worker"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--n", type=int, default=0)
    parser.add_argument("--entrypoints", type=int, default=0)
    parser.add_argument("--limit", type=int, default=0, help="per entrypoint; 0: none")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--pool", action="store_true", help="AsyncpgPoolDriver")
    args = parser.parse_args()
    if args.command == "install":
        asyncio.run(install(args.dsn))
    elif args.command == "enqueue":
        print(asyncio.run(enqueue(args.dsn, args.n, args.entrypoints)))
    else:
        asyncio.run(worker(args.dsn, args.entrypoints, args.limit, args.batch_size, args.pool))


if __name__ == "__main__":
    main()
