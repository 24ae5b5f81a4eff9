"""Where `status` and `show` print: rich's Console, and times as UTC with a `Z`."""

from __future__ import annotations

import datetime as dt
import os
import sys

from rich.console import Console

#: Piped (not a terminal, no $COLUMNS) a line is as long as it needs, up to this: rich
#: would otherwise wrap at 80 columns and split timestamps across lines.
PIPED_WIDTH = 1000


def console() -> Console:
    """A terminal's width on a terminal, or $COLUMNS; piped, PIPED_WIDTH."""
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return Console()
    return Console(width=PIPED_WIDTH)


def utc(value: str | dt.datetime | None, *, date: bool = True) -> str:
    """An ISO 8601 time (or a datetime) as `2026-12-02 15:04:05Z`, in UTC whatever the
    session's TimeZone; `date=False`: `15:04:05Z`. None and "" are `-`."""
    if not value:
        return "-"
    when = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    if when.tzinfo is None:  # timestamptz always has one; be safe for plain timestamps
        when = when.replace(tzinfo=dt.UTC)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ" if date else "%H:%M:%SZ")
