"""procrastinate, for the end-to-end comparison: schema, enqueue and a worker process.

    python -m bench.peer_procrastinate install --dsn DSN
    python -m bench.peer_procrastinate enqueue --dsn DSN --n N [--locks 50]
    python -m bench.peer_procrastinate worker --dsn DSN --concurrency C

Runs in processes of its own, without trioworker or trio-asyncio imported. `enqueue`
defers every job in one statement (`JobManager.batch_defer_jobs_async`, which takes
jobs with different locks) and prints `time.monotonic()` right after it returns.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from procrastinate import App, PsycopgConnector

KIND = "noop"


def make_app(dsn: str, pool_size: int) -> App:
    app = App(connector=PsycopgConnector(conninfo=dsn, min_size=1, max_size=pool_size))

    @app.task(name=KIND)
    async def noop() -> None:
        """Nothing, like the trioworker bench handler."""

    return app


async def install(dsn: str) -> None:
    app = make_app(dsn, 1)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def enqueue(dsn: str, n: int, locks: int) -> float:
    """Defer n jobs (job i locked on "lock-{i % locks}" when locks > 0); commit time."""
    app = make_app(dsn, 1)
    async with app.open_async():
        task = app.tasks[KIND]
        jobs = [
            task.configure(lock=f"lock-{i % locks}" if locks else None).make_new_job()
            for i in range(n)
        ]
        await app.job_manager.batch_defer_jobs_async(jobs=jobs)
        return time.monotonic()


async def worker(dsn: str, concurrency: int) -> None:
    app = make_app(dsn, concurrency + 2)
    async with app.open_async():
        await app.run_worker_async(
            concurrency=concurrency,
            wait=True,
            listen_notify=True,
            install_signal_handlers=True,
            delete_jobs="never",
        )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_procrastinate")
    parser.add_argument("command", choices=["install", "enqueue", "worker"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--n", type=int, default=0)
    parser.add_argument("--locks", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=10)
    args = parser.parse_args()
    if args.command == "install":
        asyncio.run(install(args.dsn))
    elif args.command == "enqueue":
        print(asyncio.run(enqueue(args.dsn, args.n, args.locks)))
    else:
        asyncio.run(worker(args.dsn, args.concurrency))


if __name__ == "__main__":
    main()
