"""Where a Worker's CPU goes, from py-spy's raw (collapsed) stacks: the share of the
event loop's busy samples (not its waits in epoll, not the watchdog thread) in each part
of the per-item path, each sample counted in the first part its stack matches.

    python scripts/profile_categories.py PROFILE.raw
"""

from __future__ import annotations

import collections
import sys

#: (part, frames whose presence in a stack puts a sample in it), first match wins.
PARTS = [
    ("watchdog: the earliest self-stop deadline", ["Executor.earliest_deadline"]),
    ("the attempt's nursery and its watcher task",
     ["NurseryManager.__aenter__", "NurseryManager.__aexit__", "Nursery.start_soon",
      "Executor._watch", "_attempt_delivery_of_any_pending_cancel", "Runner.task_exited",
      "open_nursery ("]),
    ("the handler's call in the attempt's cancel scope", ["Executor._run_handler"]),
    ("an attempt's completion, handed to the batcher", ["Executor._write"]),
    ("the claim statement (psycopg, through the bridge)",
     ["PostgresStore.claim_batch.<locals>.op"]),
    ("work items built from the claim's rows", ["PostgresStore.claim_batch.<locals>.<genexpr>"]),
    ("the completion statement (psycopg, through the bridge)",
     ["CompletionBatcher._flush", "Connections.rows.<locals>.op"]),
    ("the trio-asyncio loop, otherwise", ["BaseTrioEventLoop._main_loop",
                                          "BaseTrioEventLoop._io_task"]),
    ("the rest of an attempt (decide, logger, Attempt, Context)", ["Executor._run ("]),
    ("the claim loop, otherwise", ["Worker._claim_loop"]),
]  # fmt: skip
OTHER = "Trio's scheduler, otherwise"


def main(path: str) -> None:
    counts: collections.Counter[str] = collections.Counter()
    busy = 0
    with open(path) as profile:
        for line in profile:
            stack, _, n = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            if "unrolled_run" not in stack or "get_events" in frames[-1]:
                continue  # another thread, or the loop waiting for I/O
            busy += int(n)
            part = next((p for p, keys in PARTS if any(k in stack for k in keys)), OTHER)
            counts[part] += int(n)
    print(f"{busy} busy samples of the event loop")
    for part in [p for p, _ in PARTS] + [OTHER]:
        print(f"{100 * counts[part] / max(busy, 1):5.1f}%  {part}")


if __name__ == "__main__":
    main(sys.argv[1])
