"""`trioworker show ID`: one item, its payload, its attempts and why it failed."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

import attrs
from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from trioworker._cli.terminal import console as stdout_console
from trioworker._cli.terminal import utc as _when
from trioworker._core.jsontext import UndecodableValue, pretty
from trioworker._core.limits import Limit
from trioworker._core.model import ItemState
from trioworker._core.text import visible
from trioworker._store.api import HandlerStore
from trioworker._store.reads import Relative, limit_json


async def item_details(store: HandlerStore, id: int) -> dict[str, Any] | None:
    """The item's row and its attempts, as JSON-ready values (see `to_json`); None if
    there is none."""
    details = await store.show(id)
    if details is None:
        return None
    fields = {k: _jsonable(v) for k, v in attrs.asdict(details.item, recurse=False).items()}
    fields["status"] = details.item.status.value
    attempts = [
        {k: _jsonable(v) for k, v in attrs.asdict(a, recurse=False).items()}
        for a in details.attempts
    ]
    limits = [limit_json(lim) for lim in applying(await store.limits(), details.item)]
    steps = [
        {k: _jsonable(v) for k, v in attrs.asdict(step, recurse=False).items()}
        for step in details.steps
    ]
    return {
        "item": fields,
        "attempts": attempts,
        "limits": limits,
        # Why a Queued item is not running, or which parents a Waiting one waits for, a
        # reason a line (none for other statuses).
        "waiting": list(details.waiting),
        # The items it runs after (`after=`), and those that run after it, by id.
        "parents": [_relative(r) for r in details.parents],
        "children": [_relative(r) for r in details.children],
        # A Succeeded item's result (None: none, or not Succeeded), and its steps.
        "result": fields["result"],
        "steps": steps,
    }


def _relative(relative: Relative) -> dict[str, Any]:
    return {"id": relative.id, "kind": relative.kind, "status": relative.status.value}


def applying(limits: Sequence[Limit], item: ItemState) -> list[Limit]:
    """The limits an item runs under: its kind's, its scope's, and the default for a
    scope without a running limit of its own."""
    own = any(lim.scope == item.scope and lim.running is not None for lim in limits)
    return [
        lim
        for lim in limits
        if (lim.kind is not None and lim.kind == item.kind)
        or (lim.scope is not None and lim.scope == item.scope)
        or (lim.kind is None and lim.scope is None and item.scope is not None and not own)
    ]


def _jsonable(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.datetime) else value


def _json_default(value: Any) -> Any:
    """A stored value Python could not decode, as `show --json` documents it."""
    if isinstance(value, UndecodableValue):
        return {"undecodable": value.reason, "text": value.text}
    return str(value)


def to_json(details: dict[str, Any]) -> str:
    """`show --json`: the stored values exactly; a payload or a time that cannot be
    decoded as {"undecodable": why, "text": its stored text, cut to 2,000 characters}."""
    return json.dumps(details, indent=2, default=_json_default)


def _time(value: Any) -> Text | str:
    """A time in UTC; one Python cannot hold (an UndecodableValue) as its stored text
    and why, literally."""
    if isinstance(value, UndecodableValue):
        return _text(f"{value.text} ({value.reason})", style="red")
    return _when(value)


def _text(value: Any, *, lines: bool = False, style: str = "") -> Text:
    """Stored text shown literally: never markup, control characters escaped."""
    return Text(visible(str(value), lines=lines), style=style)


COUNTS = [
    ("priority", "priority"), ("attempt", "attempt"), ("stalls", "stalls"),
    ("failures", "failures"), ("dedup key", "dedup_key"), ("worker", "worker_id"),
    ("cancel requested", "cancel_requested"),
]  # fmt: skip
TIMES = [
    ("requested", "requested_at"), ("due", "run_after"), ("started", "started_at"),
    ("heartbeat", "heartbeat_at"), ("lease until", "lease_expires_at"),
    ("finished", "finished_at"),
]  # fmt: skip


def render_item(details: dict[str, Any]) -> RenderableType:
    item, attempts = details["item"], details["attempts"]
    parts: list[RenderableType] = []
    title = f"item {item['id']}  {item['kind']}  scope {item['scope'] or '-'}  {item['status']}"
    if item["reason"]:
        title += f" ({item['reason']})"
    parts.append(_text(title, style="bold"))
    fields = Table(box=None, show_header=False, pad_edge=False)
    fields.add_column(style="dim")
    fields.add_column()
    for label, key in COUNTS:
        value = item[key]  # 0 is a count, shown; None and False are "-"
        fields.add_row(label, "-" if value is None or value is False else _text(value))
    for label, key in TIMES:
        fields.add_row(label, _time(item[key]))
    parts.append(fields)
    parts.append(Text("payload", style="bold"))
    parts.append(_text(pretty(item["payload"]), lines=True))
    parts.extend(_result_and_steps(details))
    if attempts:
        table = Table(title="attempts", box=box.SIMPLE, title_justify="left")
        for column in ("#", "worker", "started", "ended", "outcome", "error"):
            table.add_column(column, overflow="fold")
        for a in attempts:
            table.add_row(str(a["attempt"]), _text(a["worker_id"] or "-"), _time(a["started_at"]),
                          _time(a["ended_at"]), _text(a["outcome"]),
                          _text(a["error"] or "", lines=True))  # fmt: skip
        parts.append(table)
    for relation in ("parents", "children"):
        if details.get(relation):
            parts.append(_relatives_table(relation, details[relation]))
    for lim in details.get("limits", []):
        parts.append(_text(_limit_line(lim, item)))
    for reason in details.get("waiting", []):
        parts.append(_text(f"waiting: {reason}", style="yellow"))
    if item["error"]:
        parts.append(_text(f"error: {item['error']}", lines=True, style="red"))
    if item["traceback"]:
        parts.append(Text("traceback (the last failed attempt's):", style="bold"))
        parts.append(_text(item["traceback"].rstrip("\n"), lines=True))
    return Group(*parts)


def _result_and_steps(details: dict[str, Any]) -> list[RenderableType]:
    """A Succeeded item's result, and the table of its recorded steps."""
    item = details["item"]
    parts: list[RenderableType] = []
    if item["status"] == "Succeeded" or item.get("result") is not None:
        parts.append(Text("result", style="bold"))
        parts.append(_text(pretty(item.get("result")), lines=True))
    if details.get("steps"):
        steps = Table(title="steps", box=box.SIMPLE, title_justify="left")
        for column in ("step", "attempt", "recorded", "value"):
            steps.add_column(column, overflow="fold")
        for step in details["steps"]:
            steps.add_row(_text(step["name"]), str(step["attempt"]), _time(step["recorded_at"]),
                          _text(_short(step["result"])))  # fmt: skip
        parts.append(steps)
    return parts


#: The most parents or children `show` lists (`show --json` has every one).
RELATIVES_LIMIT = 50


def _relatives_table(title: str, relatives: Sequence[dict[str, Any]]) -> Table:
    """The item's parents or children: id, kind and status, by id."""
    table = Table(title=title, box=box.SIMPLE, title_justify="left")
    table.add_column("id", justify="right")
    for column in ("kind", "status"):
        table.add_column(column, overflow="fold")
    for r in relatives[:RELATIVES_LIMIT]:
        table.add_row(str(r["id"]), _text(r["kind"]), r["status"])
    if len(relatives) > RELATIVES_LIMIT:
        more = len(relatives) - RELATIVES_LIMIT
        table.add_row("...", f"{more} more (show --json lists them all)", "", style="dim")
    return table


#: A step's value is shown cut to this many characters (`show --json` has it whole).
STEP_VALUE_LIMIT = 200


def _short(value: Any) -> str:
    """A step's value as one line of JSON, cut to STEP_VALUE_LIMIT characters."""
    if isinstance(value, UndecodableValue):
        text = f"(cannot be shown as JSON: {value.reason})"
    else:
        text = json.dumps(value, ensure_ascii=False)
    if len(text) > STEP_VALUE_LIMIT:
        return text[: STEP_VALUE_LIMIT - 3] + "..."
    return text


def _limit_line(lim: dict[str, Any], item: dict[str, Any]) -> str:
    """`limit kind K: 8/8 Running (full, this item waits on it)`, and the like."""
    what = (
        f"kind {lim['kind']}" if lim["kind"] is not None
        else f"scope {lim['scope']}" if lim["scope"] is not None else "default for scopes"
    )  # fmt: skip
    held = []
    full = False
    if lim["running"] is not None:
        held.append(f"{lim['in_use']}/{lim['running']} Running")
        full = lim["in_use"] >= lim["running"]
    if lim["rate"] is not None:
        held.append(f"rate {lim['rate']}, {lim['started_in_window']} started in its window")
        full = full or lim["waiting"] > 0
    waits = full and item["status"] == "Queued"
    return f"limit {what}: {', '.join(held)}" + (" (full: this item waits on it)" if waits else "")


def print_item(details: dict[str, Any], console: Console | None = None) -> None:
    (console or stdout_console()).print(render_item(details))
