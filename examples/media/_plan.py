"""Decisions of the media handlers as pure functions over plain values."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

import attrs


@attrs.frozen
class Burst:
    asset_ids: tuple[int, ...]
    started_at: dt.datetime
    ended_at: dt.datetime


def group_bursts(
    captures: Iterable[tuple[int, dt.datetime]],
    *,
    gap: dt.timedelta,
    min_size: int = 2,
) -> list[Burst]:
    """Assets captured within `gap` of the previous one form a burst (of `min_size`+)."""
    ordered = sorted(captures, key=lambda c: (c[1], c[0]))
    runs: list[list[tuple[int, dt.datetime]]] = []
    for capture in ordered:
        if runs and capture[1] - runs[-1][-1][1] <= gap:
            runs[-1].append(capture)
        else:
            runs.append([capture])
    return [
        Burst(tuple(i for i, _ in run), run[0][1], run[-1][1])
        for run in runs
        if len(run) >= min_size
    ]


def chunks(items: Sequence[str], size: int) -> list[Sequence[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
