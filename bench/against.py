"""`python -m bench.against REV [--rounds N] [--dsn DSN]`: end-to-end throughput of this
tree beside the tree of git revision REV, in alternating rounds on the same server.

Each run is one `bench e2e` trioworker system (10,000 no-op items, 2 processes x 32),
unscoped and over 50 scopes, started from its own tree (REV is exported with
`git archive`), so both use their own migrations, Worker and harness. Prints each run
and the ratio of the medians (this tree / REV).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bench.common import DEFAULT_DSN, ROOT

#: Run in a tree's directory, with that tree first on the path: one e2e run, as JSON.
ONE_RUN = """
import json, sys, tempfile
from pathlib import Path
from bench.common import server
from bench.e2e import run_once
from bench.systems import Trioworker
dsn, scoped = sys.argv[1], sys.argv[2] == "scoped"
with server(dsn) as srv:
    result = run_once(srv, Trioworker("x", scoped, 2, concurrency=32), 10_000,
                      Path(tempfile.mkdtemp()))
print(json.dumps({"items_per_s": result["items_per_s"], "complete": result["complete"]}))
"""

#: The run modes, as ONE_RUN takes them, and how they are shown.
MODES = {"unscoped": "unscoped", "scoped": "50 scopes"}


def export(rev: str, into: Path) -> Path:
    archive = into / "tree.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", rev], cwd=ROOT, stdout=out, check=True)
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def one_run(tree: Path, dsn: str, mode: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", ONE_RUN, dsn, mode],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"a run in {tree} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["complete"]:
        raise SystemExit(f"a run in {tree} did not finish its items")
    return float(result["items_per_s"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.against", description=__doc__)
    parser.add_argument("rev", help="the git revision to compare against, e.g. e236706")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dsn", default=os.environ.get("TRIOWORKER_DSN") or DEFAULT_DSN)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trioworker-against-") as scratch:
        trees = {args.rev: export(args.rev, Path(scratch)), "this tree": ROOT}
        figures: dict[tuple[str, str], list[float]] = {}
        for round_ in range(1, args.rounds + 1):
            for name, tree in trees.items():
                for mode, label in MODES.items():
                    items_per_s = one_run(tree, args.dsn, mode)
                    figures.setdefault((name, mode), []).append(items_per_s)
                    shown = f"{name}, {label}"
                    print(f"round {round_}/{args.rounds} {shown}: {items_per_s:,.0f} items/s")
    for mode, label in MODES.items():
        before = statistics.median(figures[(args.rev, mode)])
        now = statistics.median(figures[("this tree", mode)])
        print(f"{label}: {now:,.0f} against {before:,.0f} items/s: {now / before:.2f}x")


if __name__ == "__main__":
    main()
