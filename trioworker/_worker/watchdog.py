"""The pipe between a Worker and its supervisor, which kills the Worker when a cancelled
handler outlives its stop grace (docs/reliability.md, "The fail-stop from outside").

Nothing inside the Worker's interpreter can hold that bound: C code holding the GIL
stops the event loop and every thread alike, and a log write to a pipe nobody reads
blocks its writer. So the Worker only says, over this pipe, by when it must be dead,
and its supervisor process (trioworker/_cli/supervisor.py) does the killing.

One ASCII line a message, far below PIPE_BUF, so each write is atomic and whole:

    k <kill_at>      kill me at this time.monotonic() instant (inf: no bound), unless
                     a later k moves it
    f <message>      I fail-stop: log this for me (I exit 70 at once)

CLOCK_MONOTONIC is one clock for the whole machine on Linux, so an instant means the
same in both processes. `WatchdogLink` is the Worker's end; `Bound` is what the
supervisor has heard.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import NoReturn

import attrs

#: `python -m trioworker`'s fail-stop status (as trioworker/_cli/exits.py says).
EXIT_FAIL_STOP = 70
KILL_AT = b"k"
FAIL_STOP = b"f"
#: The most of a fail-stop message that is sent: its line stays well below PIPE_BUF.
MAX_MESSAGE = 2048


def fail_stop_line(message: str) -> bytes:
    """The `f` line: the message on one line, cut to MAX_MESSAGE bytes."""
    body = " ".join(message.splitlines()).encode("utf-8", "replace")[:MAX_MESSAGE]
    return FAIL_STOP + b" " + body + b"\n"


class WatchdogLink:
    """The Worker's end of its pipe: `publish` the bound, or `fail_stop` now."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)  # a full pipe drops a message rather than block
        os.set_inheritable(fd, False)  # no process a handler starts gets it
        self.fd = fd

    def publish(self, kill_at: float) -> None:
        """The supervisor SIGKILLs this process at `kill_at`, a `time.monotonic()`
        instant (math.inf: no bound), unless a later publish moves it."""
        try:  # noqa: SIM105  (cheaper than contextlib.suppress, on the loop's path)
            os.write(self.fd, b"k %r\n" % kill_at)
        except OSError:
            # The pipe is full (the supervisor reads it again soon: a later publish
            # gets through) or the supervisor is gone (the kernel is killing us).
            pass

    def fail_stop(self, message: str) -> NoReturn:
        """End the process at once with status 70; the supervisor logs `message`.
        Nothing is logged or flushed here: a full stderr would block that."""
        with contextlib.suppress(OSError):  # else the supervisor kills us at the bound
            os.write(self.fd, fail_stop_line(message))
        os._exit(EXIT_FAIL_STOP)


@attrs.define
class Bound:
    """What the supervisor has heard from one Worker: when to kill it, and whether it
    said it fail-stops."""

    kill_at: float = math.inf
    fail_stop: str | None = None
    _partial: bytes = b""

    def feed(self, data: bytes) -> None:
        """Take bytes read from the pipe; a line read in part waits for its end."""
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            tag, _, body = line.partition(b" ")
            if tag == KILL_AT:
                self.kill_at = _instant(body, self.kill_at)
            elif tag == FAIL_STOP:
                self.fail_stop = body.decode("utf-8", "replace")

    def due(self, now: float) -> bool:
        """Whether the Worker must be killed now (`now` by time.monotonic())."""
        return self.fail_stop is not None or now >= self.kill_at


def _instant(text: bytes, unchanged: float) -> float:
    """A `k` line's instant; a line no WatchdogLink writes leaves the bound as it was."""
    try:
        value = float(text)
    except ValueError:
        return unchanged
    return unchanged if math.isnan(value) else value
