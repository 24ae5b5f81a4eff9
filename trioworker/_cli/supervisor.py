"""`run --processes N`: N full Worker processes under one supervisor.

One Python process uses one core; a host with more cores runs more Workers. The
supervisor starts each as `python -m trioworker run` with the same arguments, its own
`--worker-id` (the given one, `-1` .. `-N` after it) and `--processes 1`, and then only
passes things through:

- signals: every SIGTERM/SIGINT it receives goes to every Worker, so the first drains
  them all and the second stops them all at once, exactly as for one Worker;
- exit: when one Worker exits on its own (a fail-stop, an error), the others are sent
  SIGTERM and drain; the supervisor exits once all have, with the code `exit_code`
  picks from theirs (a fail-stop anywhere is 70);
- its own end: each Worker is in a session of its own (a terminal's Ctrl-C reaches the
  supervisor alone, which passes it on once) and, on Linux, is sent SIGTERM by the kernel
  if the supervisor dies, so no Worker outlives it unsupervised.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence

import trio

log = logging.getLogger("trioworker")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_FAIL_STOP = 70
EXIT_INTERRUPTED = 130


def worker_ids(base: str, processes: int) -> list[str]:
    """The Workers' ids: the supervisor's id with -1 .. -N after it."""
    return [f"{base}-{n}" for n in range(1, processes + 1)]


def child_argv(argv: Sequence[str], worker_id: str, *extra: str) -> list[str]:
    """A Worker's command line: the supervisor's own, with its id and one process (the
    last of an option given twice is the one argparse keeps)."""
    return [
        sys.executable, "-m", "trioworker", *argv,
        "--worker-id", worker_id, "--processes", "1", *extra,
    ]  # fmt: skip


def exit_code(codes: Sequence[int]) -> int:
    """The supervisor's exit code from its Workers': 70 if any fail-stopped; else 130 if
    any was interrupted (stopped at once); else 1 if any ended otherwise than 0 (an
    error, a usage error, a signal nobody handled); else 0."""
    if EXIT_FAIL_STOP in codes:
        return EXIT_FAIL_STOP
    if EXIT_INTERRUPTED in codes:
        return EXIT_INTERRUPTED
    return EXIT_OK if all(code == EXIT_OK for code in codes) else EXIT_ERROR


def _die_with_parent(parent: int) -> Callable[[], None]:
    """A Popen preexec_fn: on Linux, SIGTERM this child when the supervisor dies."""

    def arrange() -> None:
        if sys.platform == "linux":
            import ctypes

            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the supervisor died before the prctl
                os.kill(os.getpid(), signal.SIGTERM)

    return arrange


async def supervise(commands: Sequence[list[str]]) -> int:
    """Start one process per command, pass signals through, and return `exit_code` of
    theirs once every one has exited."""
    for stop_signal in (signal.SIGTERM, signal.SIGINT):  # see commands.on_signals
        signal.signal(stop_signal, signal.SIG_IGN)
    codes: list[int | None] = [None] * len(commands)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        processes = [
            await trio.lowlevel.open_process(
                command, start_new_session=True, preexec_fn=_die_with_parent(os.getpid())
            )
            for command in commands
        ]
        log.info(
            "supervising %d Worker processes: %s",
            len(processes),
            " ".join(str(p.pid) for p in processes),
        )

        stopping = False

        def send(signum: int) -> None:
            for process, code in zip(processes, codes, strict=True):
                if code is None:
                    process.send_signal(signum)

        def stop() -> None:
            nonlocal stopping
            if not stopping:
                stopping = True
                send(signal.SIGTERM)

        async def watch(index: int, nursery: trio.Nursery) -> None:
            code = await processes[index].wait()
            codes[index] = code if code >= 0 else EXIT_ERROR  # killed by a signal
            if not stopping:
                log.warning("Worker process %d exited with %d unasked: stopping the others",
                            processes[index].pid, code)  # fmt: skip
                stop()
            if all(c is not None for c in codes):
                nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            for index in range(len(processes)):
                nursery.start_soon(watch, index, nursery)
            async for signum in signals:
                stopping = True
                log.info("%s: passed to the Workers", signal.Signals(signum).name)
                send(signum)
    return exit_code([code for code in codes if code is not None])
