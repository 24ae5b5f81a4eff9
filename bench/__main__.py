"""`python -m bench hol|contention|e2e|pickup|bridge|prune|schema|fan_in|floor|all [--quick]
[--dsn DSN] [--out DIR]`."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.common import DEFAULT_DSN, ROOT, server

SCENARIOS = {
    "hol": "head-of-line claim behind busy scopes, against a near-empty queue",
    "contention": "W claimer processes over S scopes: claims/s, race losses, the scope rule",
    "e2e": "end-to-end throughput of Worker processes against procrastinate, pgqueuer,"
    " Graphile Worker (with node), pgbench",
    "pickup": "time from enqueue to handler start on an idle Worker",
    "bridge": "CPU a statement: the store's Trio path beside the trio-asyncio bridge and"
    " psycopg's sync API",
    "prune": "retention of 1 M finished rows in batches, beside one DELETE, under a prober",
    "clients": "one enqueue through the Trio store, Client and AsyncClient, side by side",
    "schema": "per-call cost of the functions' pinned search_path, and of a schema of its own",
    "fan_in": "a root, 1,000 children after it and one item after them: each statement"
    " timed beside the same without dependencies",
    "floor": "CPU an item of an attempt's shape in Trio, with no database: call, cancel"
    " scope, nursery and watcher, and the Worker over a store that answers at once",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="trioworker's benchmarks. Each prints a table and writes JSON.",
        epilog="Scenarios: "
        + "; ".join(f"{name}: {text}" for name, text in SCENARIOS.items())
        + "; all: every one of them, in that order.",
    )
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"])
    parser.add_argument("--quick", action="store_true", help="small sizes, for development")
    parser.add_argument(
        "--dsn",
        default=os.environ.get("TRIOWORKER_DSN") or DEFAULT_DSN,
        help="a server and role allowed to create databases (default: $TRIOWORKER_DSN,"
        f" else {DEFAULT_DSN!r}); each scenario makes and drops its own databases",
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results", help="JSON goes here"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    with server(args.dsn) as srv:
        for name in names:
            module = importlib.import_module(f"bench.{name}")
            module.main(srv, args.quick, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
