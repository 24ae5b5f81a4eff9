"""What every scenario shares: scratch databases, statistics, tables and JSON output."""

from __future__ import annotations

# trio_asyncio before psycopg, or psycopg's async calls find no running event loop.
import trio_asyncio  # noqa: F401  isort: skip

import contextlib
import datetime as dt
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import uuid
from collections.abc import Iterable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, LiteralString, cast

import psycopg
from psycopg import sql

from trioworker import migrate

#: The server the benchmarks use when no --dsn or $TRIOWORKER_DSN is given.
DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
ROOT = Path(__file__).parent.parent


def parse(text: str) -> dict[str, LiteralString]:
    """Split a queries file on `-- name:` headers; each body runs to the next one."""
    parts = re.split(r"^-- name: (\w+)\s*$", text, flags=re.MULTILINE)
    pairs = zip(parts[1::2], parts[2::2], strict=True)
    return {name: cast(LiteralString, body.strip().rstrip(";")) for name, body in pairs}


#: The benchmarks' own statements (loading, baselines, checks), named like trioworker's.
QUERIES = parse(resources.files("bench").joinpath("queries.sql").read_text())


def with_dbname(dsn: str, dbname: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, dbname=dbname)


class Server:
    """The PostgreSQL server under test; makes throwaway databases on it.

    A migrated template is made once, on first use, and copied for each database.
    """

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._admin = psycopg.connect(dsn, autocommit=True)
        self._template: str | None = None

    def version(self) -> str:
        row = self._admin.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"

    def settings(self) -> dict[str, str]:
        names = ["synchronous_commit", "fsync", "shared_buffers", "max_connections", "jit"]
        rows = self._admin.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [names]
        ).fetchall()
        return {name: setting for name, setting in rows}

    def _create(self, name: str, template: str | None) -> None:
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            query = sql.SQL("{} TEMPLATE {}").format(query, sql.Identifier(template))
        self._admin.execute(query)

    def _drop(self, name: str) -> None:
        self._admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )

    def _migrated_template(self) -> str:
        if self._template is None:
            name = f"trioworker_bench_template_{os.getpid()}"
            self._drop(name)
            self._create(name, None)
            migrate(with_dbname(self.dsn, name))
            self._template = name
        return self._template

    @contextlib.contextmanager
    def database(self, label: str, *, migrated: bool = True) -> Iterator[str]:
        """A fresh database (with trioworker's schema unless `migrated=False`); its DSN."""
        name = f"trioworker_bench_{label}_{uuid.uuid4().hex[:8]}"
        self._create(name, self._migrated_template() if migrated else None)
        try:
            yield with_dbname(self.dsn, name)
        finally:
            self._drop(name)

    def close(self) -> None:
        if self._template is not None:
            self._drop(self._template)
        self._admin.close()


@contextlib.contextmanager
def server(dsn: str) -> Iterator[Server]:
    s = Server(dsn)
    try:
        yield s
    finally:
        s.close()


def connect(dsn: str) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(dsn, autocommit=True)


# -- statistics ----------------------------------------------------------------------


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), interpolated between the nearest ranks."""
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median_measured(values: Iterable[float | None]) -> float:
    """The median of the values that were measured (None and NaN are not); NaN if none."""
    measured = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(measured) if measured else math.nan


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """n, median, p99, mean and min of samples given in seconds, in milliseconds."""
    ms = [s * 1000 for s in samples_s]
    if not ms:
        return {"n": 0}
    return {
        "n": len(ms),
        "median_ms": statistics.median(ms),
        "p99_ms": percentile(ms, 99),
        "mean_ms": statistics.fmean(ms),
        "min_ms": min(ms),
    }


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


# -- output ----------------------------------------------------------------------------


def source_tree() -> dict[str, Any]:
    """The commit measured, and which of trioworker's files differ from it."""

    def git(*args: str) -> str:
        result = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        )
        return result.stdout.rstrip()

    changed = git("status", "--porcelain", "--", "trioworker", "migrations")
    return {"commit": git("rev-parse", "HEAD"), "changed": changed.splitlines()}


def machine(srv: Server) -> dict[str, Any]:
    return {
        "tree": source_tree(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "postgresql": srv.version(),
        "postgresql_settings": srv.settings(),
        "load_average": os.getloadavg(),
    }


def save(out: Path, scenario: str, srv: Server, params: dict[str, Any], results: Any) -> Path:
    """Write one scenario's results as JSON; the path written."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"{scenario}-{stamp}.json"
    document = {
        "scenario": scenario,
        "when": stamp,
        "command": " ".join(["python -m bench", *sys.argv[1:]]),
        "machine": machine(srv),
        "params": params,
        "results": results,
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    return path


def show(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a table; floats to three significant-ish places."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
    # Wide enough for every table when output goes to a file or a pipe.
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)
