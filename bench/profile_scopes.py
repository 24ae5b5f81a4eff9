"""Where the server's time an item goes with 50 scopes (issue 32): the e2e run of
"trioworker, 50 scopes" in a scratch database whose sessions count every function call
(`track_functions = 'all'`) and, with `--explain`, log every statement's plan, nested
ones too (auto_explain, `log_nested_statements`), read back from the server's log.

    python -m bench.profile_scopes [--items N] [--explain] [--dsn DSN]

Prints each function's calls, total and self time an item (pg_stat_user_functions), and
with --explain each statement's executions and time an item, summed over the run.
Changes nothing outside its own database (the settings are the database's own).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from psycopg import sql

from bench import cpu
from bench.common import DEFAULT_DSN, QUERIES, connect, server
from bench.e2e import PROCESSES, wait_finished
from bench.procs import processes, wait_until
from bench.systems import SERIAL_KEYS, Trioworker

LOG = "/var/log/postgresql/postgresql-15-main.log"


def log_size(conn: Any) -> int:
    row = conn.execute("SELECT (pg_stat_file(%s)).size", [LOG]).fetchone()
    return int(row[0])


def statements(conn: Any, start: int, dbname: str) -> dict[str, list[float]]:
    """auto_explain's JSON plans logged since `start` by this database's sessions:
    each statement's text -> [executions, total ms]."""
    size = log_size(conn)
    text = conn.execute("SELECT pg_read_file(%s, %s, %s)", [LOG, start, size - start]).fetchone()[0]
    found: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    # Each entry: "... LOG:  duration: X ms  plan:\n\t{json}" up to the next log line.
    for block in re.split(r"\n(?=\d{4}-\d\d-\d\d )", text):
        duration = re.search(r"duration: ([0-9.]+) ms\s+plan:", block)
        if duration is None or f"@{dbname} " not in block[:300]:
            continue
        body = block[duration.end() :]
        try:
            plan = json.loads(body)
        except ValueError:
            continue
        query = " ".join(plan.get("Query Text", "").split())[:160]
        found[query][0] += 1
        found[query][1] += float(duration.group(1))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_scopes")
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--dsn", default=os.environ.get("TRIOWORKER_DSN") or DEFAULT_DSN)
    args = parser.parse_args()
    system = Trioworker(f"trioworker, {SERIAL_KEYS} scopes", True, PROCESSES, concurrency=32)
    out = Path("/tmp/profile_scopes")
    with server(args.dsn) as srv, srv.database("profile") as dsn, connect(dsn) as conn:
        dbname = conn.info.dbname
        settings = {"track_functions": "all"}
        if args.explain:
            settings |= {
                "session_preload_libraries": "auto_explain",
                "auto_explain.log_min_duration": "0",
                "auto_explain.log_nested_statements": "on",
                "auto_explain.log_analyze": "on",
                "auto_explain.log_format": "json",
            }
        for name, value in settings.items():
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(dbname),
                    sql.SQL(name),
                    sql.Literal(value),  # constants
                )
            )
        with processes(out) as procs:
            for i, command in enumerate(system.worker_commands(dsn)):
                procs.start(command, f"worker-{i}")
            wait_until(
                lambda: conn.execute(QUERIES["other_backends"]).fetchone()[0] >= PROCESSES,
                60,
                "workers connecting",
            )
            system.enqueue(dsn, 50 * PROCESSES)
            wait_finished(conn, system, procs, 60)
            conn.execute(QUERIES["vacuum_analyze"])
            conn.execute("SELECT pg_stat_reset()")
            start = log_size(conn) if args.explain else 0
            pids = procs.pids()
            own = [
                r[0]
                for r in conn.execute(  # this database's backends alone
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                )
            ]
            before = cpu.snapshot(pids, own)
            began = system.enqueue(dsn, args.items)
            left = wait_finished(conn, system, procs, 600)
            seconds = time.monotonic() - began
            after = cpu.snapshot(pids, own)
            time.sleep(1.0)  # the stats collector's flush
        n = args.items - left
        print(f"{n} items in {seconds:.1f} s; {cpu.ms_per_item(before, after, n)}")
        rows = conn.execute(
            "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions"
            " ORDER BY total_time DESC"
        ).fetchall()
        print(f"{'function':34} {'calls/item':>10} {'total us/item':>14} {'self us/item':>13}")
        for name, calls, total, self_ in rows:
            print(f"{name:34} {calls / n:10.2f} {total * 1000 / n:14.1f} {self_ * 1000 / n:13.1f}")
        if args.explain:
            found = statements(conn, start, dbname)
            print(f"\n{'execs/item':>10} {'us/item':>8}  statement")
            for query, (count, ms) in sorted(found.items(), key=lambda kv: -kv[1][1])[:40]:
                print(f"{count / n:10.2f} {ms * 1000 / n:8.1f}  {query}")


if __name__ == "__main__":
    main()
