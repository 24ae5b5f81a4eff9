"""A fan of 1,000: what dependencies (`after=`, issue 34) cost the statements they ride on.

On one database with no Worker, each round enqueues a root, N children after it and one
item after all N (a fan-in), in one transaction, and then walks them through the
queue's own transitions on a plain connection, timing each statement against the same
statement for an item without parents or children:

- the enqueue: the children's INSERT (N rows) and the fan-in's (N parents), and the
  commit, whose deferred triggers settle each new Waiting item;
- the root's finish, which makes its N children Queued;
- each child's finish (its release of the fan-in), and the last one's, which makes the
  fan-in Queued;
- the claims of children (each checks its parent), and of the fan-in (N parents).

The plain series are the same statements on N + 2 items enqueued without `after`.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.common import Server, connect, save, show

CHILDREN = {"full": 1000, "quick": 100}
ROUNDS = {"full": 5, "quick": 2}
CLAIM = "SELECT id, attempt FROM work_claim_v3('bench', 60, %(n)s, ARRAY['Fan'])"
FINISH = "SELECT work_finish_v1(%(ids)s, %(attempts)s, 'Succeeded')"


def timed(conn: psycopg.Connection[Any], query: str, params: Any = None) -> tuple[float, Any]:
    t0 = time.perf_counter()
    rows = conn.execute(query, params).fetchall()
    return time.perf_counter() - t0, rows


def claim_all(conn: psycopg.Connection[Any], n: int) -> tuple[list[float], list[tuple[int, int]]]:
    """Claim `n` items one claim at a time: each claim's time, and the (id, attempt)s."""
    times, claimed = [], []
    for _ in range(n):
        seconds, rows = timed(conn, CLAIM, {"n": 1})
        assert len(rows) == 1, f"nothing to claim after {len(claimed)}"
        times.append(seconds)
        claimed.append((rows[0][0], rows[0][1]))
    return times, claimed


def finish(conn: psycopg.Connection[Any], ids: list[tuple[int, int]]) -> float:
    seconds, rows = timed(
        conn, FINISH, {"ids": [i for i, _ in ids], "attempts": [a for _, a in ids]}
    )
    assert len(rows) == len(ids)
    return seconds


def one_round(conn: psycopg.Connection[Any], n: int, fanned: bool) -> dict[str, Any]:
    """A root, n children and a fan-in, with `after` or without; each statement timed."""
    t0 = time.perf_counter()
    with conn.transaction():
        (root,) = conn.execute("INSERT INTO work_items (kind) VALUES ('Fan') RETURNING id")
        t_children, children = timed(
            conn,
            "INSERT INTO work_items (kind, after)"
            " SELECT 'Fan', CASE WHEN %(fanned)s THEN ARRAY[%(root)s::bigint] END"
            " FROM generate_series(1, %(n)s) RETURNING id",
            {"root": root[0], "n": n, "fanned": fanned},
        )
        t_fan_in, fan_in = timed(
            conn,
            "INSERT INTO work_items (kind, after)"
            " VALUES ('Fan', CASE WHEN %(fanned)s THEN %(parents)s::bigint[] END) RETURNING id",
            {"parents": [c[0] for c in children], "fanned": fanned},
        )
        t_before_commit = time.perf_counter()
    t_commit = time.perf_counter() - t_before_commit
    enqueue = time.perf_counter() - t0
    # Claims come in id order: the root, its children, then the fan-in (Waiting till
    # the last child has Succeeded, with after=; due at once, without).
    t_root_claim, (root_claim,) = claim_all(conn, 1)
    t_root_finish = finish(conn, [root_claim])
    t_claims, claimed = claim_all(conn, n)
    assert [c[0] for c in claimed] == [c[0] for c in children]
    t_finishes = [finish(conn, [c]) for c in claimed[:-1]]
    t_last = finish(conn, [claimed[-1]])
    t_fan_in_claim, (fan_in_claim,) = claim_all(conn, 1)
    assert fan_in_claim[0] == fan_in[0][0], (fan_in_claim, fan_in)
    finish(conn, [fan_in_claim])
    left = conn.execute("SELECT count(*) FROM work_items WHERE status <> 'Succeeded'").fetchone()
    assert left == (0,), left
    conn.execute("DELETE FROM work_items")
    conn.execute("VACUUM ANALYZE work_items")
    return {
        "enqueue_s": enqueue,
        "children_insert_s": t_children,
        "fan_in_insert_s": t_fan_in,
        "commit_s": t_commit,
        "root_finish_s": t_root_finish,
        "root_claim_s": t_root_claim[0],
        "child_claim_median_s": statistics.median(t_claims),
        "child_finish_median_s": statistics.median(t_finishes),
        "last_child_finish_s": t_last,
        "fan_in_claim_s": t_fan_in_claim[0],
    }


def main(srv: Server, quick: bool, out: Path) -> dict[str, Any]:
    size = "quick" if quick else "full"
    n, rounds = CHILDREN[size], ROUNDS[size]
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    with srv.database("fan_in") as dsn, connect(dsn) as conn:
        for r in range(rounds):
            for fanned in (True, False) if r % 2 == 0 else (False, True):
                runs[fanned].append(one_round(conn, n, fanned))
    keys = list(runs[True][0])
    medians = {
        fanned: {k: statistics.median(run[k] for run in runs[fanned]) for k in keys}
        for fanned in (True, False)
    }
    rows = [
        [k.removesuffix("_s").replace("_", " "), medians[True][k] * 1000,
         medians[False][k] * 1000, medians[True][k] / medians[False][k]]
        for k in keys
    ]  # fmt: skip
    show(
        f"A root, {n:,} children after it and one item after them (medians of {rounds} rounds)",
        ["statement", "with after= ms", "without ms", "ratio"],
        rows,
    )
    results = {
        "children": n,
        "rounds": rounds,
        "with_after": runs[True],
        "without": runs[False],
        "medians": {str(k): v for k, v in medians.items()},
    }
    print(f"  -> {save(out, 'fan_in', srv, {'children': n, 'rounds': rounds}, results)}")
    return results
