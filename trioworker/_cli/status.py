"""`trioworker status`: what the queue holds, as a table people read or JSON."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from trioworker._cli.terminal import console as stdout_console
from trioworker._cli.terminal import utc
from trioworker._core.text import visible
from trioworker._store.api import HandlerStore
from trioworker._store.reads import STATUS_ORDER


async def gather(store: HandlerStore, *, failures: int = 10) -> dict[str, Any]:
    """What `status` shows, as the JSON `status --json` prints."""
    return (await store.status(failures=failures)).to_json()


def _cell(value: str | None, none: str = "-") -> Text:
    """Text an item, a Worker or a schedule carries, shown literally (never markup)."""
    return Text(none if value is None else visible(value))


def render(status: dict[str, Any]) -> Group:
    """The tables `status` prints. Every text from the queue goes in as a `Text` of
    its `visible` form, so no kind, scope or error is read as markup or control codes."""
    counts = Table(title="Work items by kind and status", box=box.SIMPLE_HEAVY)
    counts.add_column("kind")
    for s in STATUS_ORDER:
        counts.add_column(s, justify="right")
    for kind, row in sorted(status["counts"].items()):
        counts.add_row(_cell(kind), *(_n(row[s]) for s in STATUS_ORDER))
    if status["counts"]:
        counts.add_section()
    counts.add_row("all", *(_n(status["totals"][s]) for s in STATUS_ORDER), style="bold")

    running = Table(
        title=f"Running ({len(status['running'])}; busy scopes: {status['busy_scopes']})",
        box=box.SIMPLE_HEAVY,
    )
    for column in ("id", "kind", "scope", "attempt", "worker", "lease left"):
        running.add_column(column, justify="right" if column in ("id", "attempt") else "left")
    for r in status["running"]:
        left = r["lease_left"]
        running.add_row(
            str(r["id"]),
            _cell(r["kind"]),
            _cell(r["scope"]),
            str(r["attempt"]),
            _cell(r["worker_id"]),
            f"{left:.1f}s" if left >= 0 else f"expired {-left:.1f}s ago",
            style="red" if left < 0 else None,
        )

    failures = Table(title="Recent failures", box=box.SIMPLE_HEAVY)
    for column in ("id", "kind", "scope", "finished", "reason", "error"):
        failures.add_column(column, overflow="fold")
    for r in status["recent_failures"]:
        failures.add_row(
            str(r["id"]),
            _cell(r["kind"]),
            _cell(r["scope"]),
            utc(r["finished_at"]),
            _cell(r["reason"], ""),
            _cell((r["error"] or "")[:120]),
        )
    alive = [w for w in status["workers"] if w["alive"]]
    workers = Table(title=f"Workers ({len(alive)} alive)", box=box.SIMPLE_HEAVY)
    for column in ("worker", "kinds", "scopes", "conc", "last seen"):
        workers.add_column(column, overflow="fold")
    for w in alive:
        workers.add_row(
            _cell(w["id"]),
            _cell(", ".join(w["kinds"])),
            _cell(None if w["scopes"] is None else ", ".join(w["scopes"]), "all"),
            str(w["concurrency"]),
            utc(w["last_seen"], date=False),
        )
    parts: list[Any] = [counts, running, workers, *_optional_tables(status)]
    if status["pauses"]:
        listed = ", ".join(
            f"kind {p['kind']}" if p["kind"] is not None else f"scope {p['scope']}"
            for p in status["pauses"]
        )
        parts.append(Text.assemble(("Paused (not claimed; running items go on):", "bold yellow"),
                                   " ", visible(listed)))  # fmt: skip
    if status["unserved_kinds"]:
        listed = ", ".join(f"{k} ({n:,})" for k, n in status["unserved_kinds"].items())
        parts.append(Text.assemble(("Queued kinds no live Worker serves:", "bold red"),
                                   " ", visible(listed)))  # fmt: skip
    parts.append(failures)
    return Group(*parts)


def _optional_tables(status: dict[str, Any]) -> list[Table]:
    """The schedules and the limits, when there are any."""
    tables = []
    if status["schedules"]:
        tables.append(_schedules_table(status["schedules"]))
    if status.get("limits"):
        tables.append(_limits_table(status["limits"]))
    return tables


def _schedules_table(rows: list[dict[str, Any]]) -> Table:
    schedules = Table(title="Schedules", box=box.SIMPLE_HEAVY)
    for column in ("name", "kind", "scope", "when", "next due", "last item"):
        schedules.add_column(column, overflow="fold")
    for r in rows:
        schedules.add_row(
            _cell(r["name"]),
            _cell(r["kind"]),
            _cell(r["scope"]),
            _cell(r["spec"]),
            utc(r["next_due"]),
            "-" if r["last_item"] is None else str(r["last_item"]),
        )
    return schedules


def _limits_table(rows: list[dict[str, Any]]) -> Table:
    """Each limit (docs/design/limits.md): slots in use of its running limit, starts in
    its rate window, and the due items it holds back while full."""
    limits = Table(title="Limits", box=box.SIMPLE_HEAVY)
    for column in ("kind", "scope", "running", "rate", "in window", "waiting"):
        limits.add_column(column, overflow="fold")
    for r in rows:
        default = r["kind"] is None and r["scope"] is None
        limits.add_row(
            _cell(r["kind"]),
            _cell(r["scope"], "default" if default else "-"),
            "-" if r["running"] is None else f"{r['in_use']}/{r['running']}",
            _cell(r["rate"]),
            "-" if r["rate"] is None else str(r["started_in_window"]),
            _n(r["waiting"]),
        )
    return limits


def _n(value: int) -> str:
    return f"{value:,}" if value else "·"


def print_status(status: dict[str, Any], console: Console | None = None) -> None:
    (console or stdout_console()).print(render(status))
