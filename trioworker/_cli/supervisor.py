"""`run`: Worker processes under a supervisor, which holds each to its fail-stop bound.

`python -m trioworker run` is always this supervisor. Once the schema is ready it starts
each Worker, one or `--processes N`, as `python -m trioworker run` with the same
arguments, its own `--worker-id` (the given one; with N, `-1` .. `-N` after it) and the
write end of a pipe of its own (`--watchdog-fd`). Then:

- the bound: each Worker says on its pipe by when it must be dead
  (trioworker/_worker/watchdog.py). Once that instant has passed, or the Worker says it
  fail-stops, the supervisor SIGKILLs it, then logs why, and counts its exit as 70.
  Nothing in the Worker's interpreter (C code holding the GIL, a log write that blocks)
  can delay that, and the supervisor's own log lines are written by a thread of their
  own (log_thread.py), so a stderr nobody reads cannot either;
- signals: every SIGTERM/SIGINT it receives goes to every Worker, so the first drains
  them all and the second stops them all at once, exactly as for one Worker;
- exit: when one Worker exits on its own (a fail-stop, an error), the others are sent
  SIGTERM and drain; the supervisor exits once all have, with the code `exit_code`
  picks from theirs (a fail-stop anywhere is 70). With one Worker it ends as that
  Worker did: the same status, or killed by the same signal;
- its own end: each Worker is in a session of its own (a terminal's Ctrl-C reaches the
  supervisor alone, which passes it on once) and, on Linux, is SIGKILLed by the kernel
  when the supervisor dies: no Worker runs on with nobody holding its bound. The kernel
  sends that signal when the *thread* that forked the Worker ends, so the Workers are
  forked by the main thread (Trio's `open_process` forks in a worker thread, which
  ends after 10 s idle).
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import attrs
import trio

from trioworker._cli.exits import (
    EXIT_ERROR,
    EXIT_FAIL_STOP,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TAKEN_OVER,
)
from trioworker._cli.log_thread import LogThread
from trioworker._worker.watchdog import Bound

log = logging.getLogger("trioworker")

#: How long the supervisor waits at its end for its last log lines to be written.
FLUSH_LOGS_WITHIN = 3.0


def worker_ids(base: str, processes: int) -> list[str]:
    """The Workers' ids: the given one for one Worker; for N, -1 .. -N after it."""
    if processes == 1:
        return [base]
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
    any was interrupted (stopped at once); else 75 if any found its id taken over; else 1
    if any ended otherwise than 0 (an error, a usage error, a signal nobody handled);
    else 0."""
    if EXIT_FAIL_STOP in codes:
        return EXIT_FAIL_STOP
    if EXIT_INTERRUPTED in codes:
        return EXIT_INTERRUPTED
    if EXIT_TAKEN_OVER in codes:
        return EXIT_TAKEN_OVER
    return EXIT_OK if all(code == EXIT_OK for code in codes) else EXIT_ERROR


def final_status(statuses: Sequence[int]) -> int:
    """What the supervisor ends with: one Worker's own status (negative: the signal it
    was killed by, which the supervisor then ends by too); `exit_code` of N."""
    if len(statuses) == 1:
        return statuses[0]
    return exit_code(statuses)


@attrs.define(eq=False)
class Watched:
    """One Worker process, as its supervisor holds it to its bound."""

    worker_id: str
    process: subprocess.Popen[bytes]
    #: The read end of its watchdog pipe, non-blocking.
    pipe: int
    bound: Bound = attrs.Factory(Bound)
    #: Ended by the supervisor for a fail-stop: its exit counts as 70.
    killed: bool = False
    #: Its fail-stop has been logged.
    reported: bool = False
    #: Its exit status once it has exited (70 if it fail-stopped).
    status: int | None = None

    def read(self) -> bool:
        """Take everything the pipe holds now; whether it is still open."""
        while True:
            try:
                data = os.read(self.pipe, 65536)
            except BlockingIOError:
                return True
            if not data:
                return False
            self.bound.feed(data)

    def kill(self) -> None:
        """SIGKILL it, if it has not exited yet; its exit counts as a fail-stop."""
        self.killed = True
        self.process.kill()

    def report(self, overdue: float | None = None) -> None:
        """Log its fail-stop once, after it is killed (a log write may block)."""
        if self.reported:
            return
        self.reported = True
        pid = self.process.pid
        if self.bound.fail_stop is not None:
            log.critical("fail-stop: Worker %s (pid %d): %s", self.worker_id, pid,
                         self.bound.fail_stop)  # fmt: skip
        else:
            log.critical(
                "fail-stop: Worker %s (pid %d) was %.3fs past its handlers' stop bound"
                " (a cancelled handler outlived its stop grace, and the Worker could not"
                " end itself); killed",
                self.worker_id,
                pid,
                overdue,
            )


async def hold_to_bound(worker: Watched, clock: Callable[[], float] = time.monotonic) -> None:
    """SIGKILL the Worker once `clock()` reaches its bound, or it says it fail-stops,
    and then log why. Cancel it when the Worker exits first."""
    open_ = True
    while True:
        open_ = open_ and worker.read()  # all that has arrived, before deciding
        now = clock()
        if worker.bound.due(now):
            break
        with trio.move_on_at(trio.current_time() + (worker.bound.kill_at - now)):
            if open_:
                await trio.lowlevel.wait_readable(worker.pipe)
            else:  # the Worker closed its end: its last bound still holds
                await trio.sleep_forever()
    worker.kill()
    worker.report(now - worker.bound.kill_at)


def start_worker(worker_id: str, command: list[str]) -> Watched:
    """Fork and exec one Worker with the write end of its pipe (from the main thread:
    see the module docstring)."""
    read, write = os.pipe()
    try:
        process = subprocess.Popen(
            [*command, "--watchdog-fd", str(write)],
            pass_fds=(write,),
            start_new_session=True,
            # No other thread runs yet: the log thread starts after the forks.
            preexec_fn=_die_with_parent(os.getpid()),  # noqa: PLW1509
        )
    finally:
        os.close(write)
    os.set_blocking(read, False)
    return Watched(worker_id, process, read)


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A Popen preexec_fn: on Linux, SIGKILL this child when the supervisor dies."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    PR_SET_PDEATHSIG = 1

    def arrange() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the supervisor died before the prctl
            os.kill(os.getpid(), signal.SIGKILL)

    return arrange


async def wait_for_exit(worker: Watched) -> int:
    """Its exit status, once it has exited (and been reaped)."""
    if sys.platform == "linux":
        pidfd = os.pidfd_open(worker.process.pid)
        try:
            await trio.lowlevel.wait_readable(pidfd)
        finally:
            os.close(pidfd)
        return worker.process.wait()
    return await trio.to_thread.run_sync(worker.process.wait, abandon_on_cancel=True)


async def supervise(workers: Sequence[tuple[str, list[str]]], log_thread: LogThread) -> int:
    """Start one process per (worker id, command), hold each to its bound, pass signals
    through, and return `final_status` of theirs once every one has exited."""
    for stop_signal in (signal.SIGTERM, signal.SIGINT):  # see commands.on_signals
        signal.signal(stop_signal, signal.SIG_IGN)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        watched = [start_worker(worker_id, command) for worker_id, command in workers]
        log_thread.start()  # only now: a preexec_fn must not run beside another thread
        if len(watched) > 1:  # one Worker's output is as if it ran alone
            log.info(
                "supervising %d Worker processes: %s",
                len(watched),
                ", ".join(f"{w.worker_id} (pid {w.process.pid})" for w in watched),
            )

        stopping = False

        def send(signum: int) -> None:
            for worker in watched:
                if worker.status is None:
                    worker.process.send_signal(signum)

        def stop() -> None:
            nonlocal stopping
            if not stopping:
                stopping = True
                send(signal.SIGTERM)

        async def watch(worker: Watched, nursery: trio.Nursery) -> None:
            async with trio.open_nursery() as guard:
                guard.start_soon(hold_to_bound, worker)
                status = await wait_for_exit(worker)
                guard.cancel_scope.cancel()
            worker.read()  # a fail-stop message it sent as it exited
            os.close(worker.pipe)
            if worker.killed or worker.bound.fail_stop is not None:
                worker.report()
                status = EXIT_FAIL_STOP
            worker.status = status
            if not stopping:
                if len(watched) > 1:
                    log.warning("Worker process %d exited with %d unasked: stopping the others",
                                worker.process.pid, status)  # fmt: skip
                stop()
            if all(w.status is not None for w in watched):
                nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            for worker in watched:
                nursery.start_soon(watch, worker, nursery)
            async for signum in signals:
                stopping = True
                log.info("%s: passed to the Workers", signal.Signals(signum).name)
                send(signum)
    return final_status([w.status for w in watched if w.status is not None])


def run_workers(workers: Sequence[tuple[str, list[str]]]) -> int:
    """Supervise the Workers until every one has exited, and return the status to exit
    with; with one Worker killed by a signal, end by the same signal instead."""
    log_thread = LogThread()
    try:
        status: int = trio.run(supervise, workers, log_thread)
    finally:
        written = log_thread.finish(FLUSH_LOGS_WITHIN)
    if status < 0:
        end_by_signal(-status)
        status = EXIT_ERROR  # a signal that does not end a process
    if not written:
        os._exit(status)  # its last lines are stuck: a normal exit would wait on them
    return status


def end_by_signal(signum: int) -> None:
    """End this process by `signum`, as its one Worker was (with no core file)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if signum not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
