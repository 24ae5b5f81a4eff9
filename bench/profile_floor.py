"""Where the Worker's CPU an item goes, with no database: a profile of `bench floor`'s
Worker series (the real Worker over a store that answers at once, a no-op handler),
for this tree or another one, so a change can be profiled before and after.

    python -m bench.profile_floor [--tree PATH] [--items N] [--handler noop|checkpoint]

The sampler is driven by the process's own CPU time (`setitimer(ITIMER_PROF)`, a
sample a millisecond of CPU), so time the process waits to be scheduled on a busy
machine is not counted (py-spy's wall-clock sampling over-counts it). Each sample is
charged, once, to the innermost frame of the stack that matches a bucket below (the
first listed, if it matches several); the rest is "other". Buckets are functions of
trioworker and of Trio by name, so a tree whose functions are named otherwise simply
shows them under "other" or its nearest named caller.

Another tree is imported in place of this one (its `bench/floor.py` and `trioworker/`),
in a process of its own: `--tree ../old` after `git worktree add ../old COMMIT`.
"""

from __future__ import annotations

import argparse
import collections
import signal
import sys
import time
import types
from pathlib import Path

INTERVAL = 0.001


def _names(names: str) -> frozenset[str]:
    return frozenset(names.split())


#: (bucket, file part, function names or None for any): first match from the innermost
#: frame outwards wins. The Worker's own parts first, then Trio's machinery.
BUCKETS: list[tuple[str, str, frozenset[str] | None]] = [
    ("the handler", "bench/floor.py", frozenset({"noop", "checkpoint"})),
    ("the benchmark's store", "bench/floor.py", frozenset({"claim_batch", "complete_batch"})),
    ("Context and Attempt built", "trioworker/_worker/", frozenset({"__init__"})),
    ("completion batcher", "trioworker/_worker/batching.py", None),
    ("heartbeats", "trioworker/_worker/heartbeats.py", None),
    ("stop watch (fail-stop bounds)", "trioworker/_worker/stops.py", None),
    (
        "Worker slots",
        "trioworker/_worker/attempt.py",
        _names("take take_free unused _give_back release"),
    ),
    ("the decision (policy)", "trioworker/_core/policy.py", None),
    ("trace and events", "trioworker/otel", None),
    ("claim loop (worker.py)", "trioworker/_worker/worker.py", None),
    ("executor: attempt bookkeeping", "trioworker/_worker/executor.py", None),
    ("attempt state (attempt.py)", "trioworker/_worker/attempt.py", None),
    ("the context (context.py)", "trioworker/_worker/context.py", None),
    (
        "Trio: cancel scopes",
        "trio/_core/_run.py",
        _names(
            "__enter__ __exit__ _close cancel deadline _might_change_registered_deadline"
            " recalculate _add_deadline _remove_deadline _effective_deadline _exc_filter"
        ),
    ),
    (
        "Trio: nurseries",
        "trio/_core/_run.py",
        _names(
            "open_nursery __aenter__ __aexit__ _nested_child_finished _child_finished _add_exc"
            " _check_nursery_closed start_soon _parent_waiting_in_aexit"
        ),
    ),
    (
        "Trio: spawning and ending tasks",
        "trio/_core/_run.py",
        _names("spawn_impl task_exited coroutine_or_error _return_value_looks_like_wrong_library"),
    ),
    ("Trio: scheduling", "trio/_core/", None),
    ("Trio: other", "/trio/", None),
]


class Sampler:
    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.samples = 0

    def _sample(self, signum: int, frame: types.FrameType | None) -> None:
        self.samples += 1
        stack = []
        while frame is not None:
            stack.append(frame)
            frame = frame.f_back
        self.counts[self._bucket(stack)] += 1

    @staticmethod
    def _bucket(stack: list[types.FrameType]) -> str:
        for frame in stack:
            code = frame.f_code
            for name, part, functions in BUCKETS:
                if part in code.co_filename and (functions is None or code.co_name in functions):
                    return name
        return "other (Python, attrs, logging ...)"

    def __enter__(self) -> Sampler:
        signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, INTERVAL, INTERVAL)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_floor", description=__doc__)
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--handler", choices=["noop", "checkpoint"], default="noop")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.tree.resolve()))
    for name in [m for m in sys.modules if m.split(".")[0] in ("bench", "trioworker")]:
        del sys.modules[name]
    import trio

    from bench import floor

    assert floor.__file__.startswith(str(args.tree.resolve())), floor.__file__
    runs = floor.series(args.items)
    (worker,) = [run for name, run in runs.items() if name.startswith("Worker, no-op")]
    handler = floor.noop if args.handler == "noop" else floor.checkpoint
    trio.run(worker.func, handler)  # type: ignore[attr-defined]  # a warm-up round
    sampler = Sampler()
    t0 = time.process_time()
    with sampler:
        trio.run(worker.func, handler)  # type: ignore[attr-defined]
    cpu = time.process_time() - t0
    per_item = cpu / args.items * 1e6
    print(f"tree {args.tree.resolve()}: {args.items:,} items, handler {args.handler},"
          f" {per_item:.1f} µs CPU an item, {sampler.samples:,} samples")  # fmt: skip
    print(f"{'bucket':40} {'share':>7} {'µs an item':>11}")
    for name, count in sampler.counts.most_common():
        share = count / sampler.samples
        print(f"{name:40} {share:7.1%} {share * per_item:11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
