"""`python -m bench.against REV [--rounds N] [--dsn DSN]`: end-to-end throughput of this
tree beside the tree of git revision REV, in alternating rounds on the same server.

Each run is one `bench e2e` trioworker system (10,000 no-op items, 2 processes x 32),
unscoped and over 50 scopes, started from its own tree (REV is exported with
`git archive`), so both use their own migrations, Worker and harness. Prints each run
and the ratio of the medians (this tree / REV), with the CPU time an item took in the
Workers and in the server (bench.cpu). One run is `bench/against_run.py`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bench.common import DEFAULT_DSN, ROOT, median_measured

#: The run modes, as against_run.py takes them, and how they are shown.
MODES = {"unscoped": "unscoped", "scoped": "50 scopes"}


def export(rev: str, into: Path) -> Path:
    archive = into / "tree.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", rev], cwd=ROOT, stdout=out, check=True)
    tree = into / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def one_run(tree: Path, dsn: str, mode: str) -> dict[str, float]:
    """One run in `tree`: items/s, and the Workers' and server's CPU ms an item."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    one = Path(__file__).with_name("against_run.py")
    done = subprocess.run(
        [sys.executable, "-P", str(one), dsn, mode],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"a run in {tree} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not result.pop("complete"):
        raise SystemExit(f"a run in {tree} did not finish its items")
    return {k: math.nan if v is None else float(v) for k, v in result.items()}  # None: unmeasured


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.against", description=__doc__)
    parser.add_argument("rev", help="the git revision to compare against, e.g. e236706")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dsn", default=os.environ.get("TRIOWORKER_DSN") or DEFAULT_DSN)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trioworker-against-") as scratch:
        trees = {args.rev: export(args.rev, Path(scratch)), "this tree": ROOT}
        runs: dict[tuple[str, str], list[dict[str, float]]] = {}
        for round_ in range(1, args.rounds + 1):
            for name, tree in trees.items():
                for mode, label in MODES.items():
                    run = one_run(tree, args.dsn, mode)
                    runs.setdefault((name, mode), []).append(run)
                    print(f"round {round_}/{args.rounds} {name}, {label}: {shown(run)}")
    for mode, label in MODES.items():
        before = medians(runs[(args.rev, mode)])
        now = medians(runs[("this tree", mode)])
        print(
            f"{label}: {now['items_per_s']:,.0f} against {before['items_per_s']:,.0f} items/s:"
            f" {now['items_per_s'] / before['items_per_s']:.2f}x; CPU ms an item"
            f" (medians, this tree against {args.rev}): Workers"
            f" {now['worker_cpu_ms_per_item']:.3f} against {before['worker_cpu_ms_per_item']:.3f},"
            f" server {now['server_cpu_ms_per_item']:.3f} against"
            f" {before['server_cpu_ms_per_item']:.3f}"
        )


def shown(run: dict[str, float]) -> str:
    """One run, as printed."""
    return (
        f"{run['items_per_s']:,.0f} items/s, CPU ms an item: Workers"
        f" {run['worker_cpu_ms_per_item']:.3f}, server {run['server_cpu_ms_per_item']:.3f}"
    )


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the runs that measured it (NaN: none did)."""
    return {key: median_measured(run[key] for run in runs) for key in runs[0]}


if __name__ == "__main__":
    main()
