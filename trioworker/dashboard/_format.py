"""How the dashboard writes numbers, durations and times (Jinja filters)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any


def number(value: int | None) -> str:
    """1234567 -> "1,234,567"; None -> "-"."""
    return "-" if value is None else f"{value:,}"


def duration(seconds: float | None) -> str:
    """A span of time, to the two units that matter: "4.2 s", "3 min 5 s", "2 h 7 min",
    "3 d 4 h". Negative spans are written as their size."""
    if seconds is None:
        return "-"
    s = abs(seconds)
    if s < 10:  # noqa: PLR2004
        return f"{s:.1f} s"
    if s < 60:  # noqa: PLR2004
        return f"{s:.0f} s"
    m, s = divmod(int(s), 60)
    if m < 60:  # noqa: PLR2004
        return f"{m} min {s} s" if s else f"{m} min"
    h, m = divmod(m, 60)
    if h < 24:  # noqa: PLR2004
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def moment(value: dt.datetime | None) -> str:
    """A point in time, in UTC to the second: "2025-12-01 12:03:04"."""
    if value is None:
        return "-"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


FILTERS = {"number": number, "duration": duration, "moment": moment, "json": pretty_json}
