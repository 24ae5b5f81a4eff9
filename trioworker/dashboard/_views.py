"""What each page shows: its reads (one snapshot each) and their shaping into values
the templates lay out. The shaping functions are pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trioworker._core.jsontext import loads_or_mark
from trioworker._core.model import Status
from trioworker._store.reads import (
    ALIVE_BEATS,
    ALIVE_WITHIN,
    Relative,
    WaitFacts,
    parents_waited_for,
    waiting_reasons,
)
from trioworker.dashboard._chart import minutes, throughput_svg
from trioworker.dashboard._reader import Reader, Rows

STATUSES = [s.value for s in Status]
#: How the queries judge a Worker alive (trioworker._store.reads.alive_window).
ALIVE = {"alive_beats": ALIVE_BEATS, "alive_within": ALIVE_WITHIN}
#: The chart's span: the last hour, a bar a minute.
CHART_MINUTES = 60
#: The most rows a list page shows (its total is still counted).
PAGE_ROWS = 500
FAILURES_PAGE = 50
#: The most children an item's page lists (a parent may have any number; all counted).
CHILDREN_ROWS = 200


def counts_table(rows: Rows) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """({kind: {status: n}}, {status: total}) from (kind, status, n) rows; every status
    present, zero where there is none."""
    by_kind: dict[str, dict[str, int]] = {}
    for row in rows:
        by_kind.setdefault(row["kind"], dict.fromkeys(STATUSES, 0))[row["status"]] = row["n"]
    totals = {s: sum(k[s] for k in by_kind.values()) for s in STATUSES}
    return dict(sorted(by_kind.items())), totals


def attempt_history(item: Mapping[str, Any], noted: Sequence[Mapping[str, Any]]) -> Rows:
    """The item's attempts oldest first: those work_attempts noted, and its current one
    (Running or Succeeded: the item's own row) when that is not among them."""
    history = [dict(a) for a in noted]
    current = item["attempt"]
    if (
        item["status"] in (Status.RUNNING.value, Status.SUCCEEDED.value)
        and current > 0
        and all(a["attempt"] != current for a in history)
    ):
        history.append({
            "attempt": current,
            "worker_id": item["worker_id"],
            "started_at": item["started_at"],
            "ended_at": item["finished_at"],
            "outcome": "running" if item["status"] == Status.RUNNING.value else "succeeded",
            "error": None,
            "traceback": None,
            "took": None,
        })  # fmt: skip
    return history


async def overview(reader: Reader) -> dict[str, Any]:
    got = await reader.snapshot(
        clock={},
        counts={},
        queued={},
        scope_summary={},
        throughput={"minutes": CHART_MINUTES},
        worker_summary=ALIVE,
        unserved=ALIVE,
        limits={},
    )
    now = got["clock"][0]["now"]
    by_kind, totals = counts_table(got["counts"])
    buckets = minutes(got["throughput"], now=now, count=CHART_MINUTES)
    finished = {s: sum(b.counts.get(s, 0) for b in buckets) for s in STATUSES}
    return {
        "now": now,
        "statuses": STATUSES,
        "by_kind": by_kind,
        "totals": totals,
        "all_items": sum(totals.values()),
        "queued": got["queued"],
        "due": sum(r["due"] for r in got["queued"]),
        "delayed": sum(r["delayed"] for r in got["queued"]),
        "scopes": got["scope_summary"][0],
        "workers": got["worker_summary"][0],
        "unserved": got["unserved"],
        "chart": throughput_svg(buckets),
        "finished_last_hour": finished,
        "limits": got["limits"],
    }


async def running(reader: Reader) -> dict[str, Any]:
    got = await reader.snapshot(clock={}, running={"limit": PAGE_ROWS})
    rows = got["running"]
    return {"now": got["clock"][0]["now"], "rows": rows, "total": rows[0]["total"] if rows else 0}


async def scopes(reader: Reader, search: str | None) -> dict[str, Any]:
    got = await reader.snapshot(
        clock={}, scopes={"limit": PAGE_ROWS, "search": search}, scope_summary={}
    )
    rows = got["scopes"]
    return {
        "now": got["clock"][0]["now"],
        "rows": rows,
        "total": rows[0]["total"] if rows else 0,
        "search": search or "",
        "summary": got["scope_summary"][0],
    }


async def failures(reader: Reader, kind: str | None, offset: int) -> dict[str, Any]:
    got = await reader.snapshot(
        clock={},
        failures={"kind": kind, "limit": FAILURES_PAGE, "offset": offset},
        failure_kinds={},
    )
    rows = got["failures"]
    return {
        "now": got["clock"][0]["now"],
        "rows": rows,
        "total": rows[0]["total"]
        if rows
        else sum(r["n"] for r in got["failure_kinds"] if kind is None or r["kind"] == kind),
        "kind": kind,
        "kinds": got["failure_kinds"],
        "offset": offset,
        "page_size": FAILURES_PAGE,
    }


async def item(reader: Reader, id: int) -> dict[str, Any] | None:
    got = await reader.snapshot(
        clock={},
        item={"id": id},
        item_attempts={"id": id},
        item_steps={"id": id},
        wait_facts={"id": id, **ALIVE},
        item_parents={"id": id},
        item_children={"id": id, "limit": CHILDREN_ROWS},
    )
    if not got["item"]:
        return None
    row = dict(got["item"][0])
    waiting = []
    if got["wait_facts"]:  # (a row only for a Queued item)
        facts = WaitFacts(**got["wait_facts"][0])
        waiting = waiting_reasons(facts, row["kind"], row["scope"])
    if row["status"] == Status.WAITING.value:
        parents = [Relative(p["id"], p["kind"], Status(p["status"])) for p in got["item_parents"]]
        waiting = parents_waited_for(parents)
    children = got["item_children"]
    # Read as text, decoded here: what Python cannot decode stands as an UndecodableValue.
    row["payload"] = loads_or_mark(row["payload"])
    row["trace_context"] = loads_or_mark(row["trace_context"])
    row["result"] = loads_or_mark(row["result"])
    steps = [{**step, "result": loads_or_mark(step["result"])} for step in got["item_steps"]]
    return {
        "now": got["clock"][0]["now"],
        "item": row,
        "attempts": attempt_history(row, got["item_attempts"]),
        "steps": steps,
        "waiting": waiting,
        "parents": got["item_parents"],
        "children": children,
        "children_total": children[0]["total"] if children else 0,
    }


async def workers(reader: Reader) -> dict[str, Any]:
    got = await reader.snapshot(clock={}, workers=ALIVE)
    rows = got["workers"]
    return {
        "now": got["clock"][0]["now"],
        "rows": rows,
        "alive": sum(1 for r in rows if r["alive"]),
        "alive_beats": ALIVE_BEATS,
    }


async def schedules(reader: Reader) -> dict[str, Any]:
    got = await reader.snapshot(clock={}, schedules={})
    return {"now": got["clock"][0]["now"], "rows": got["schedules"]}


async def pauses(reader: Reader) -> dict[str, Any]:
    got = await reader.snapshot(clock={}, pauses={})
    return {"now": got["clock"][0]["now"], "rows": got["pauses"]}
