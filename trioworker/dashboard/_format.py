"""How the dashboard writes numbers, durations, times and stored text (Jinja filters).

Stored text (kinds, scopes, errors, payloads) comes from other programs: every page
writes it HTML-escaped (autoescape), and each character a reader would not see, or
that would reorder what they see, as its escape (`visible`, applied by `finalize` to
every value a template writes). A form's field that must send a name back exactly
takes `exact` instead.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from markupsafe import Markup, escape

from trioworker._core.jsontext import UndecodableValue, pretty
from trioworker._core.text import visible


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


def moment(value: dt.datetime | UndecodableValue | None) -> str:
    """A point in time, in UTC to the second: "2025-12-01 12:03:04"; one Python cannot
    hold (the item page reads its rows as stored) as its stored text and why."""
    if value is None:
        return "-"
    if isinstance(value, UndecodableValue):
        return f"{value.text} ({value.reason})"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def finalize(value: Any) -> Any:
    """What a template writes for `{{ value }}`: text made visible on one line (markup
    the templates made themselves, and numbers, pass as they are)."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return visible(value)
    return value


def exact(value: object) -> Markup:
    """A form field's value exactly as stored (HTML-escaped only), so the form sends
    back the very name the page shows."""
    return escape(value)


_EDGES = re.compile(r"^\s+|\s+$")


def name(value: str) -> Markup:
    """A kind or scope for reading: visible, its leading and trailing whitespace marked
    (so `' ws '` does not pass for `'ws'`)."""
    shown = str(escape(visible(value)))  # the spans below are its only markup
    return Markup(_EDGES.sub(lambda m: f'<span class="edge">{m[0]}</span>', shown))


def text(value: str) -> Markup:
    """An error or a traceback for a <pre>: visible, its lines kept."""
    return escape(visible(value, lines=True))


def json_text(value: Any) -> Markup:
    """A decoded payload (or an UndecodableValue) as indented JSON for a <pre>."""
    return text(pretty(value))


FILTERS = {
    "number": number,
    "duration": duration,
    "moment": moment,
    "json": json_text,
    "exact": exact,
    "name": name,
    "text": text,
}
