"""The pipe between a Worker and its supervisor (trioworker/_worker/watchdog.py): what
the Worker writes, and what the supervisor makes of it."""

from __future__ import annotations

import contextlib
import math
import os
import select
import threading
from collections.abc import Iterator

import pytest

from trioworker._cli.exits import EXIT_FAIL_STOP
from trioworker._worker.watchdog import (
    EXIT_FAIL_STOP as WORKER_EXIT_FAIL_STOP,
)
from trioworker._worker.watchdog import (
    MAX_MESSAGE,
    Bound,
    WatchdogLink,
    fail_stop_line,
)


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    yield read, write
    for fd in (read, write):
        with contextlib.suppress(OSError):  # closed by the test
            os.close(fd)


def heard(data: bytes) -> Bound:
    bound = Bound()
    bound.feed(data)
    return bound


def test_a_published_instant_arrives_exactly(pipe: tuple[int, int]) -> None:
    """publish() writes one `k` line the supervisor reads back as the same float;
    the latest line wins, whether it moves the bound later or earlier, and inf lifts it."""
    read, write = pipe
    link = WatchdogLink(write)
    instants = [12345.678901234567, 12399.5, 12301.25, math.inf]
    bound = Bound()
    for instant in instants:
        link.publish(instant)
        bound.feed(os.read(read, 4096))
        assert bound.kill_at == instant
    link.publish(1.0)
    link.publish(2.0)
    assert os.read(read, 4096) == b"k 1.0\nk 2.0\n"


def test_the_link_never_blocks_on_a_full_pipe_and_drops_the_message(
    pipe: tuple[int, int],
) -> None:
    """With the pipe full, publish() gives up at once rather than wait for the
    supervisor to read."""
    read, write = pipe
    link = WatchdogLink(write)
    while select.select([], [write], [], 0)[1]:
        try:
            os.write(write, b"x" * 4096)
        except BlockingIOError:
            break

    def publish() -> None:
        for _ in range(100):
            link.publish(5.0)

    # Nothing reads the pipe: a publish that waited for room would never return.
    publishing = threading.Thread(target=publish, daemon=True)
    publishing.start()
    publishing.join(timeout=60)
    assert not publishing.is_alive(), "publish() waited for the full pipe to drain"
    assert b"k 5.0" not in os.read(read, 1 << 20)


def test_the_link_survives_its_supervisor(pipe: tuple[int, int]) -> None:
    """A publish after the reader is gone (the supervisor died: the kernel is killing
    this process) raises nothing."""
    read, write = pipe
    link = WatchdogLink(write)
    os.close(read)
    link.publish(5.0)


def test_the_link_is_not_inherited(pipe: tuple[int, int]) -> None:
    """No process a handler starts gets the pipe, and writes to it do not block."""
    _, write = pipe
    os.set_inheritable(write, True)
    WatchdogLink(write)
    assert not os.get_inheritable(write) and not os.get_blocking(write)


def test_a_fail_stop_line_is_one_short_line() -> None:
    """The message on one line, cut to MAX_MESSAGE bytes, well below PIPE_BUF (atomic)."""
    line = fail_stop_line("handler of item 7\ndid not stop")
    assert line == b"f handler of item 7 did not stop\n"
    long = fail_stop_line("é" * 5000)
    assert long.count(b"\n") == 1 and len(long) == MAX_MESSAGE + 3 < select.PIPE_BUF
    assert heard(long).fail_stop == "é" * (MAX_MESSAGE // 2)


def test_the_exit_status_is_the_command_lines() -> None:
    """The Worker's fail-stop exits with the status `python -m trioworker` documents."""
    assert WORKER_EXIT_FAIL_STOP == EXIT_FAIL_STOP == 70


def test_a_line_read_in_parts_counts_once_whole() -> None:
    """A read may end inside a line: its start waits for its end."""
    bound = Bound()
    bound.feed(b"k 10.5\nk 2")
    assert bound.kill_at == 10.5
    bound.feed(b"0.25\nf it would not")
    assert (bound.kill_at, bound.fail_stop) == (20.25, None)
    bound.feed(b" stop\n")
    assert bound.fail_stop == "it would not stop"


@pytest.mark.parametrize("line", [b"k soon\n", b"k nan\n", b"k\n", b"x 1.0\n", b"\n"])
def test_lines_no_link_writes_leave_the_bound_as_it_was(line: bytes) -> None:
    """A `k` line without a number (or NaN, which no comparison would ever pass) and
    lines of other shapes change nothing."""
    bound = heard(b"k 7.0\n" + line)
    assert (bound.kill_at, bound.fail_stop) == (7.0, None)


def test_the_supervisor_kills_at_the_bound_or_on_a_fail_stop() -> None:
    """Due at kill_at and after, not before; at once when the Worker says it fail-stops;
    never with no bound."""
    bound = heard(b"k 100.0\n")
    assert not bound.due(99.999) and bound.due(100.0) and bound.due(250.0)
    assert not Bound().due(1e300)
    assert heard(b"k inf\nf stuck\n").due(0.0)
