"""The supervisor holding a Worker to its bound (`hold_to_bound`), on Trio's virtual
clock: a real pipe between a WatchdogLink and the supervisor's end, a fake process."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from typing import Any, cast

import pytest
import trio
import trio.testing

from trioworker._cli.supervisor import Watched, hold_to_bound
from trioworker._worker.watchdog import WatchdogLink


class FakeProcess:
    """Records when it was killed, and in what order with the supervisor's log lines."""

    pid = 4242

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.killed_at: float | None = None

    def kill(self) -> None:
        self.killed_at = trio.current_time()
        self.events.append("killed")


class Events(logging.Handler):
    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append(record.getMessage())


@pytest.fixture
def events() -> Iterator[list[str]]:
    seen: list[str] = []
    handler = Events(seen)
    logger = logging.getLogger("trioworker")
    logger.addHandler(handler)
    yield seen
    logger.removeHandler(handler)


@pytest.fixture
def pair(events: list[str]) -> Iterator[tuple[WatchdogLink, Watched]]:
    """A Worker's link and the supervisor's view of it, on one pipe."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    process = cast(Any, FakeProcess(events))
    link = WatchdogLink(write)
    yield link, Watched("w1", process, read)
    os.close(read)
    if link.fd >= 0:
        os.close(link.fd)
    link.fd = -1


def killed_at(worker: Watched) -> float | None:
    return cast(FakeProcess, worker.process).killed_at


async def holding(worker: Watched, seconds: float) -> None:
    """Run hold_to_bound (on Trio's clock) for `seconds`, or until it has killed."""
    with trio.move_on_after(seconds):
        await hold_to_bound(worker, clock=trio.current_time)


async def test_the_worker_is_killed_at_its_bound_and_not_before(
    autojump_clock: trio.testing.MockClock, pair: tuple[WatchdogLink, Watched], events: list[str]
) -> None:
    """Killed at kill_at itself, then one line says so, with how late it came."""
    link, worker = pair
    link.publish(5.0)
    await holding(worker, 100)
    assert killed_at(worker) == 5.0 and worker.killed
    assert events[0] == "killed"
    assert events[1:] == [
        "fail-stop: Worker w1 (pid 4242) was 0.000s past its handlers' stop bound (a"
        " cancelled handler outlived its stop grace, and the Worker could not end itself);"
        " killed"
    ]


async def test_a_later_bound_rearms_the_kill_and_an_earlier_one_brings_it_forward(
    autojump_clock: trio.testing.MockClock, pair: tuple[WatchdogLink, Watched]
) -> None:
    """Each publish replaces the bound: a heartbeat moves it later, a new attempt with
    an earlier deadline moves it earlier, inf lifts it."""
    link, worker = pair
    link.publish(5.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(holding, worker, 100)
        await trio.sleep(4.0)
        link.publish(9.0)  # a heartbeat got through
        await trio.sleep(4.5)  # 8.5
        link.publish(math.inf)  # its attempt ended
        await trio.sleep(20.0)  # 28.5
        assert killed_at(worker) is None
        link.publish(30.0)
        await trio.sleep(0.5)  # 29
        link.publish(29.25)
    assert killed_at(worker) == 29.25


async def test_every_message_that_has_arrived_counts_before_the_decision(
    autojump_clock: trio.testing.MockClock, pair: tuple[WatchdogLink, Watched]
) -> None:
    """Woken at its bound, the supervisor first reads all the Worker wrote: a later
    bound that arrived meanwhile spares it."""
    link, worker = pair
    link.publish(5.0)
    link.publish(8.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(holding, worker, 100)
        await trio.sleep(7.9)
        assert killed_at(worker) is None
        link.publish(9.0)
        link.publish(12.0)
        # The supervisor did not run as the bound passed: the lines wait in the pipe.
        autojump_clock.jump(0.2)
    assert killed_at(worker) == 12.0


async def test_a_fail_stop_message_kills_at_once_and_is_logged_after_the_kill(
    autojump_clock: trio.testing.MockClock, pair: tuple[WatchdogLink, Watched], events: list[str]
) -> None:
    """The Worker says it fail-stops (and exits 70): it is killed if still there, then
    its message is logged, once."""
    link, worker = pair
    link.publish(50.0)
    os.write(link.fd, b"f handler of item 3 did not stop within 1s\n")
    await holding(worker, 100)
    assert killed_at(worker) == 0.0
    assert events == [
        "killed",
        "fail-stop: Worker w1 (pid 4242): handler of item 3 did not stop within 1s",
    ]
    worker.report()
    assert len(events) == 2


async def test_no_bound_no_kill_and_a_closed_pipe_keeps_its_last_bound(
    autojump_clock: trio.testing.MockClock, pair: tuple[WatchdogLink, Watched]
) -> None:
    """Without a bound the Worker lives on; once it closes its end, the last bound it
    published still holds."""
    link, worker = pair
    await holding(worker, 1e6)
    assert killed_at(worker) is None
    link.publish(1e6 + 10)
    os.close(link.fd)
    link.fd = -1
    await holding(worker, 100)
    assert killed_at(worker) == 1e6 + 10
