"""`python -m examples.media` (what `./dev demo` runs): the media-library demo.

With no DSN (`--dsn`, else $TRIOWORKER_DSN) it starts a private PostgreSQL of its own."""

from __future__ import annotations

import argparse
import os
import sys

from examples.media.demo import run_demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.media", description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("TRIOWORKER_DSN") or None)
    parser.add_argument("--duration", type=float, default=40.0, help="seconds of load (40)")
    parser.add_argument("--users", type=int, default=3, choices=range(1, 9), metavar="1..8")
    args = parser.parse_args(argv)
    if args.duration < 1:
        parser.error("--duration must be at least 1")
    return run_demo(args.dsn, args)


if __name__ == "__main__":
    sys.exit(main())
