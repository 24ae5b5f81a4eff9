#!/usr/bin/env python
"""Where the server's CPU an item goes, statement by statement, in two trees side by
side (issue 32; docs/benchmarks.md, "Issue 32: the server's cost an item").

Two fresh databases on one server, each migrated with one tree's migrations (BEFORE:
a checkout of the revision before, e.g. `git worktree add /tmp/before main`; AFTER:
this tree), rounds alternating between them. Each database holds 256 Running items
beside the round's (`bench e2e`'s 2 Workers x 32, claims of up to 128). A round is 100
unscoped no-op items through the Worker's statements: an INSERT of 100 rows (as `bench
e2e` enqueues), two claims of 50 (`work_claim_v3`), and a finish of the 100
(`work_finish_v1`, Succeeded, as a completion batch); then 100 more, the finish of the
first 50 and the claim of the next 50 in one call (`work_finish_and_claim_v3`) where the
tree has one, else in two (their CPU summed). The figure is each statement's server
CPU (the database's own backend, /proc/PID/schedstat) an item, median over the rounds
(the first rounds warm the plans up and are not counted).

Usage:
    .venv/bin/python scripts/measure-server-cost.py BEFORE_TREE AFTER_TREE [ROUNDS] [ADMIN_DSN]
"""

from __future__ import annotations

import statistics
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg
from yoyo import get_backend, read_migrations

from tests.support.database import with_dbname
from trioworker._postgres.migrate import yoyo_uri

Conn = psycopg.Connection[Any]
BATCH = 100
RUNNING = 256
WARM = 5

INSERT = "INSERT INTO work_items (kind) SELECT 'Noop' FROM generate_series(1, %s)"
CLAIM = "SELECT id, attempt FROM work_claim_v3('w', 60, %s, ARRAY['Noop']) ORDER BY id"
FINISH = "SELECT f FROM work_finish_v1(%s, %s, 'Succeeded', NULL, NULL, false, NULL) AS f"
FINISH_AND_CLAIM = (
    "SELECT f.finished, (f.item).id, (f.item).attempt"
    " FROM work_finish_and_claim_v3(%s, %s, 'w', 60, %s, ARRAY['Noop']) AS f"
)


def cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


@contextmanager
def database(admin: str, tree: Path) -> Iterator[Conn]:
    name = f"trioworker_cost_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        dsn = with_dbname(admin, name)
        backend = get_backend(yoyo_uri(dsn))
        try:
            migrations = read_migrations(str(tree / "migrations"))
            with backend.lock():
                backend.apply_migrations(backend.to_apply(migrations))
                backend.run_post_apply(migrations)
        finally:
            backend.connection.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(INSERT, (RUNNING,))
            conn.execute("ANALYZE work_items")
            conn.execute(CLAIM, (RUNNING,)).fetchall()  # the Running items beside
            yield conn
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


class Meter:
    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        self.pid = int(row[0])
        self.us: dict[str, list[float]] = defaultdict(list)
        self.wal: dict[str, list[float]] = defaultdict(list)

    def lsn(self) -> int:
        row = self.conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])

    def run(self, label: str, query: str, params: Any, items: int) -> list[tuple[Any, ...]]:
        wal = self.lsn()  # (outside the CPU measured)
        before = cpu_ns(self.pid)
        cur = self.conn.execute(query, params)  # type: ignore[call-overload]
        rows = cur.fetchall() if cur.description else []
        self.us[label].append((cpu_ns(self.pid) - before) / 1000 / items)
        self.wal[label].append((self.lsn() - wal) / items)
        return rows


def one_round(m: Meter, combined: bool) -> None:
    m.run("enqueue (INSERT of 100)", INSERT, (BATCH,), BATCH)
    half = BATCH // 2
    first = m.run("claim of 50", CLAIM, (half,), half)
    second = m.run("claim of 50", CLAIM, (half,), half)
    both = first + second
    m.run("finish of 100", FINISH, ([r[0] for r in both], [r[1] for r in both]), BATCH)
    # Then: claim 50, finish them and claim 50 more (in one call where the tree has
    # work_finish_and_claim_v3, else in two, each statement's CPU summed), finish those.
    m.run("enqueue (INSERT of 100)", INSERT, (BATCH,), BATCH)
    first = m.run("claim of 50 (second round)", CLAIM, (half,), half)
    ids, attempts = [r[0] for r in first], [r[1] for r in first]
    label = "finish of 50 + claim of 50"
    if combined:
        rows = m.run(label, FINISH_AND_CLAIM, (ids, attempts, half), BATCH)
        claimed = [(r[1], r[2]) for r in rows if r[0] is None]
    else:
        m.run(label, FINISH, (ids, attempts), BATCH)
        claimed = m.run(label + " ", CLAIM, (half,), BATCH)
        m.us[label][-1] += m.us[label + " "].pop()
        m.wal[label][-1] += m.wal[label + " "].pop()
        del m.us[label + " "], m.wal[label + " "]
    m.run(
        "finish of 50 (second round)",
        FINISH,
        ([r[0] for r in claimed], [r[1] for r in claimed]),
        half,
    )


def main() -> None:
    before, after = Path(sys.argv[1]), Path(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 200  # noqa: PLR2004
    admin = sys.argv[4] if len(sys.argv) > 4 else "host=127.0.0.1 user=postgres dbname=postgres"  # noqa: PLR2004
    with ExitStack() as stack:
        meters = {
            "before": Meter(stack.enter_context(database(admin, before))),
            "after": Meter(stack.enter_context(database(admin, after))),
        }
        combined = {
            name: m.conn.execute(
                "SELECT to_regproc('work_finish_and_claim_v3') IS NOT NULL"
            ).fetchone()
            == (True,)
            for name, m in meters.items()
        }
        for _ in range(rounds):
            for name, m in meters.items():
                one_round(m, combined[name])
        labels = list(dict.fromkeys(k for m in meters.values() for k in m.us))
        print(f"server CPU us an item, median of {rounds - WARM} rounds "
              f"(beside {RUNNING} Running)")  # fmt: skip
        print(f"{'statement':40} {'before':>8} {'after':>8} {'WAL B before':>13} {'after':>6}")
        for label in labels:
            cells = []
            for m in meters.values():
                values = m.us.get(label, [])[WARM:]
                cells.append(f"{statistics.median(values):8.1f}" if values else f"{'-':>8}")
            for m, width in zip(meters.values(), (13, 6), strict=True):
                values = m.wal.get(label, [])[WARM:]
                shown = f"{statistics.median(values):.0f}" if values else "-"
                cells.append(shown.rjust(width))
            print(f"{label:40} {' '.join(cells)}")


if __name__ == "__main__":
    main()
