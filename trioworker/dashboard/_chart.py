"""The overview's chart: items finished per minute, as inline SVG drawn on the server.

Pure: numbers in, markup out (no script, no styles beyond class names the dashboard's
stylesheet colours, so the page's Content-Security-Policy needs no exception).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

import attrs

#: The statuses the chart stacks, bottom to top, and their CSS classes.
SERIES = (("Succeeded", "ok"), ("Failed", "bad"), ("Cancelled", "off"))


@attrs.frozen
class Minute:
    """How many items finished (by status) in the minute starting at `start`."""

    start: dt.datetime
    counts: dict[str, int] = attrs.field(factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.get(status, 0) for status, _ in SERIES)


def minutes(rows: Sequence[Mapping[str, Any]], *, now: dt.datetime, count: int) -> list[Minute]:
    """`count` whole minutes ending with the current one, from `throughput` rows
    (bucket, status, n); minutes without rows count zero."""
    first = now.replace(second=0, microsecond=0) - dt.timedelta(minutes=count - 1)
    buckets = [Minute(first + dt.timedelta(minutes=i)) for i in range(count)]
    for row in rows:
        bucket = int(row["bucket"])
        if 0 <= bucket < count:
            buckets[bucket].counts[str(row["status"])] = int(row["n"])
    return buckets


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5 times a power of ten that is at least `value` (>= 1)."""
    if value <= 1:
        return 1
    power: int = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    raise AssertionError("unreachable")  # pragma: no cover


def throughput_svg(buckets: Sequence[Minute], *, width: int = 720, height: int = 180) -> str:
    """Stacked bars, one per minute, with a y axis of 0, half and the maximum and a
    time label every ten minutes; each bar's tooltip gives its counts."""
    left, right, top, bottom = 40, 8, 10, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = nice_ceiling(max((b.total for b in buckets), default=0))
    slot = plot_w / max(len(buckets), 1)
    bar = max(slot - 2, 1)
    total = sum(b.total for b in buckets)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        f' role="img" aria-label="items finished per minute, last {len(buckets)} minutes:'
        f' {total} in all" xmlns="http://www.w3.org/2000/svg">'
    ]
    for fraction in (0, 0.5, 1):
        y = top + plot_h * (1 - fraction)
        label = f"{peak * fraction:g}"
        parts.append(
            f'<line class="grid" x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{label}</text>'
        )
    for i, minute in enumerate(buckets):
        x = left + i * slot + 1
        y = top + plot_h
        tip = ", ".join(f"{minute.counts.get(status, 0)} {status.lower()}" for status, _ in SERIES)
        parts.append(f'<g class="minute"><title>{minute.start:%H:%M} UTC: {escape(tip)}</title>')
        # An empty minute still gets a full-height target for its tooltip.
        parts.append(
            f'<rect class="slot" x="{x:.1f}" y="{top}" width="{bar:.1f}" height="{plot_h}"/>'
        )
        for status, css in SERIES:
            n = minute.counts.get(status, 0)
            if not n:
                continue
            h = plot_h * n / peak
            y -= h
            parts.append(
                f'<rect class="{css}" x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}"'
                f' data-status="{status}" data-n="{n}"/>'
            )
        parts.append("</g>")
        if i % 10 == 0 or i == len(buckets) - 1:
            parts.append(
                f'<text class="axis" x="{x + bar / 2:.1f}" y="{height - 6}"'
                f' text-anchor="middle">{minute.start:%H:%M}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)
