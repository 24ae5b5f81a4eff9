"""The fail-stop's clock (`StopWatch`) on its own: the earliest bound of the running
handlers, told to the watchdog once each time it changes, and only then."""

from __future__ import annotations

import math

from trioworker._worker.stops import StopWatch


def watch() -> tuple[StopWatch, list[float]]:
    told: list[float] = []
    return StopWatch(told.append), told


def test_the_first_bound_and_an_earlier_one_are_told() -> None:
    """A bound earlier than every other is the new earliest, told at once."""
    stops, told = watch()
    stops.add(10.0)
    stops.add(5.0)
    assert (stops.earliest, told) == (5.0, [10.0, 5.0])


def test_a_later_or_equal_bound_added_tells_nothing() -> None:
    """Another handler at or after the earliest bound leaves it, and nobody is told."""
    stops, told = watch()
    stops.add(5.0)
    stops.add(5.0)
    stops.add(8.0)
    assert (stops.earliest, told) == (5.0, [5.0])


def test_dropping_a_later_bound_tells_nothing() -> None:
    """A handler at a later bound ending leaves the earliest."""
    stops, told = watch()
    stops.add(5.0)
    stops.add(8.0)
    stops.discard(8.0)
    assert (stops.earliest, told) == (5.0, [5.0])


def test_dropping_the_earliest_bound_tells_the_next() -> None:
    """The last handler at the earliest bound ending makes the next bound the earliest;
    one of two at the earliest ending leaves it."""
    stops, told = watch()
    stops.add(5.0)
    stops.add(5.0)
    stops.add(8.0)
    stops.discard(5.0)
    assert (stops.earliest, told) == (5.0, [5.0])
    stops.discard(5.0)
    assert (stops.earliest, told) == (8.0, [5.0, 8.0])
    stops.discard(8.0)
    assert (stops.earliest, told) == (math.inf, [5.0, 8.0, math.inf])


def test_changes_together_are_told_once_after() -> None:
    """Inside `together` nothing is told, an earlier bound added neither; on leaving it
    the earliest is told once if it changed."""
    stops, told = watch()
    stops.add(8.0)
    with stops.together():
        stops.add(3.0)
        stops.move(8.0, 9.0)
        assert (stops.earliest, told) == (8.0, [8.0])
    assert (stops.earliest, told) == (3.0, [8.0, 3.0])
    with stops.together():
        stops.discard(3.0)
        stops.add(3.0)
    assert (stops.earliest, told) == (3.0, [8.0, 3.0])


def test_a_moved_bound_is_told_when_it_moves_the_earliest() -> None:
    """A bound moved sooner than the earliest is told; moved from the earliest to later,
    the next earliest is told; moved between later bounds, nothing."""
    stops, told = watch()
    stops.add(5.0)
    stops.add(8.0)
    stops.move(8.0, 9.0)
    assert told == [5.0]
    stops.move(9.0, 2.0)
    assert (stops.earliest, told) == (2.0, [5.0, 2.0])
    stops.move(2.0, 7.0)
    assert (stops.earliest, told) == (5.0, [5.0, 2.0, 5.0])
