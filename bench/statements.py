"""What the server did for the items of one run: transactions, function calls, rows.

There is no pg_stat_statements on the benchmarks' server (it needs
`shared_preload_libraries`, so a restart of a server everyone shares), so what is
counted comes from the cumulative statistics of the database under test:

- transactions: `xact_commit + xact_rollback` of `pg_stat_database`, less the harness's
  own (its polls, one autocommit statement each). Every statement the systems send
  outside an explicit transaction is a transaction of its own, so for a queue on
  autocommit statements this is its statements; a multi-statement transaction (a
  fenced one, procrastinate's?) counts once.
- function calls: `pg_stat_user_functions`, with `track_functions = 'all'` set on the
  database before any Worker connects (`track`): trioworker's claim, heartbeat and
  finish are PL/pgSQL functions (work_claim_v3, work_finish_v1, ...), procrastinate's
  fetch and finish too; pgqueuer's statement-level trigger counts its writing statements.
- rows written: `n_tup_ins + n_tup_upd + n_tup_del` over the database's tables.

Items per claim and per finish come from the claim's and the finish's function calls
where a system has such functions (`CLAIM_FINISH`), else from the Workers' own count of
their calls (bench/peer_pgqueuer.py and bench/graphile/run.mjs print them on SIGWINCH).

PostgreSQL 15 backends flush their statistics at most once a second, an idle one only
after 10 s, and every one as it exits: the snapshot after a run is taken once the
Workers have stopped and their sessions ended (bench/e2e.py). So a run's figures also
hold the Workers' few statements as they stop (a handful each, against 10,000 items)
and, at most, the warm-up's (100 items) where a session had not flushed them by the
first snapshot. Each snapshot flushes the harness's own session's first
(`pg_stat_force_next_flush`), so its statements can be subtracted exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from psycopg import sql

#: (claim functions, finish functions) by system family, where they are functions.
CLAIM_FINISH: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "trioworker": (("work_claim_v3",), ("work_finish_v1",)),
    "procrastinate": (("procrastinate_fetch_job_v2",), ("procrastinate_finish_job_v1",)),
}

_SNAPSHOT = """
SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database
        WHERE datname = current_database()) AS transactions,
       (SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables)
           AS rows_written,
       (SELECT coalesce(json_object_agg(funcname, calls), '{}') FROM pg_stat_user_functions)
           AS calls
"""
#: How many transactions a snapshot adds before its figures: the flush.
_OWN = 1


def track(conn: Any) -> None:
    """Count function calls in `conn`'s database from the next session on."""
    name = conn.execute("SELECT current_database()").fetchone()[0]
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET track_functions = 'all'").format(sql.Identifier(name))
    )


def snapshot(conn: Any) -> dict[str, Any]:
    """The database's counts so far, with `conn`'s own statements flushed (the flush
    itself is counted, the snapshot's statement is not)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    transactions, rows_written, calls = conn.execute(_SNAPSHOT).fetchone()
    return {"transactions": int(transactions), "rows_written": int(rows_written),
            "calls": {k: int(v) for k, v in dict(calls).items()}}  # fmt: skip


def per_item(
    before: dict[str, Any],
    after: dict[str, Any],
    items: int,
    *,
    harness: int,
    family: str,
    counted: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The run's figures an item; `harness`: the harness's own statements in between
    (besides the snapshots); `counted`: the Workers' own counts of claims and finishes
    (claims, claimed, finishes, finished), where they keep them."""
    transactions = after["transactions"] - before["transactions"] - harness - _OWN
    calls = {
        name: n - before["calls"].get(name, 0)
        for name, n in after["calls"].items()
        if n - before["calls"].get(name, 0) > 0
    }
    claims = finishes = None
    if family in CLAIM_FINISH:
        claim_names, finish_names = CLAIM_FINISH[family]
        claims = sum(calls.get(name, 0) for name in claim_names) or None
        finishes = sum(calls.get(name, 0) for name in finish_names) or None
    elif counted:
        claims, finishes = counted.get("claims") or None, counted.get("finishes") or None
    return {
        "transactions_per_item": transactions / items,
        "rows_written_per_item": (after["rows_written"] - before["rows_written"]) / items,
        "function_calls_per_item": {
            name: n / items for name, n in sorted(calls.items(), key=lambda kv: -kv[1])
        },
        "items_per_claim": items / claims if claims else None,
        "items_per_finish": items / finishes if finishes else None,
    }


COUNTS = "bench-counts "


def read_counts(logs: list[Path]) -> list[dict[str, int]]:
    """Each Worker log's `bench-counts {...}` lines (peer_pgqueuer's), in order, summed
    across the logs line by line: the first line of each, the second, ..."""
    each = [
        [json.loads(line[len(COUNTS) :]) for line in log.read_text(errors="replace").splitlines()
         if line.startswith(COUNTS)]
        for log in logs
    ]  # fmt: skip
    depth = min((len(lines) for lines in each), default=0)
    return [
        {key: sum(lines[i].get(key, 0) for lines in each) for key in each[0][i]}
        for i in range(depth)
    ]
