"""A CPU-time sampler for any Python process started with this folder on PYTHONPATH
and $BENCH_SAMPLE_DIR set (`bench.profile_e2e` starts `python -m trioworker run` so, and
its supervisor's Worker process inherits both).

The sampler is `bench.profile_floor`'s: `setitimer(ITIMER_PROF)`, a sample a
millisecond of the process's CPU (so time spent waiting for a core is not counted),
taken in the main thread, where Trio runs the Worker. It samples between a SIGUSR1 and
the next SIGUSR2 only (so the imports, the connections and a warm-up are left out),
and at exit writes $BENCH_SAMPLE_DIR/PID.stacks: one line a distinct stack, outermost
frame first, `file:function` frames joined by ";", then a space and its count (the
collapsed format flame-graph tools read).

Standard library only: it runs in whichever tree's Worker is measured.
"""

from __future__ import annotations

import atexit
import collections
import os
import signal
import types

INTERVAL = 0.001
MARKERS = ("/site-packages/", "/lib/python3")


def _frame_name(code: types.CodeType) -> str:
    path = code.co_filename
    for marker in MARKERS:
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        for marker in ("/trioworker/", "/bench/"):
            if marker in path:
                path = marker[1:] + path.rsplit(marker, 1)[1]
                break
    return f"{path}:{code.co_qualname}"


def _install(out_dir: str) -> None:
    counts: collections.Counter[tuple[str, ...]] = collections.Counter()
    names: dict[types.CodeType, str] = {}

    def sample(signum: int, frame: types.FrameType | None) -> None:
        stack = []
        while frame is not None:
            code = frame.f_code
            name = names.get(code)
            if name is None:
                name = names[code] = _frame_name(code)
            stack.append(name)
            frame = frame.f_back
        counts[tuple(reversed(stack))] += 1

    def start(signum: int, frame: types.FrameType | None) -> None:
        signal.setitimer(signal.ITIMER_PROF, INTERVAL, INTERVAL)

    def stop(signum: int, frame: types.FrameType | None) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)

    def write() -> None:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        with open(os.path.join(out_dir, f"{os.getpid()}.stacks"), "w") as f:
            for stack, n in counts.most_common():
                f.write(f"{';'.join(stack)} {n}\n")

    signal.signal(signal.SIGPROF, sample)
    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    atexit.register(write)


if os.environ.get("BENCH_SAMPLE_DIR"):
    _install(os.environ["BENCH_SAMPLE_DIR"])
