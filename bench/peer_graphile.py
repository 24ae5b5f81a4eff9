"""Graphile Worker (Node.js), for the end-to-end comparison: its setup and commands.

`bench/graphile/` pins one `graphile-worker` in `package.json` and `package-lock.json`;
`ensure_installed` runs `npm ci` there when `node_modules` is missing or was installed
from another lock (like `./dev` for the venv), and `install` then creates its schema
with `run.mjs install` (as `graphile-worker --schema-only` does), so neither is timed.
Each worker is one `node run.mjs worker` process, measured like the Python peers.
Without `node` on PATH the Graphile systems do not run (`available`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import urllib.parse

import psycopg.conninfo

from bench.common import ROOT

FOLDER = ROOT / "bench" / "graphile"
RUNNER = FOLDER / "run.mjs"
LOCK = FOLDER / "package-lock.json"
#: The lock's hash, written once `npm ci` has installed from it.
STAMP = FOLDER / "node_modules" / ".trioworker-installed-lock"


def node() -> str | None:
    return shutil.which("node")


def available() -> bool:
    return node() is not None


def _lock_hash() -> str:
    return hashlib.sha256(LOCK.read_bytes()).hexdigest()


def ensure_installed() -> None:
    """`npm ci` in bench/graphile unless node_modules was installed from this lock."""
    wanted = _lock_hash()
    if STAMP.exists() and STAMP.read_text().strip() == wanted:
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(f"no npm on PATH to install {FOLDER}/node_modules")
    print(f"  graphile: npm ci in {FOLDER.relative_to(ROOT)} ...", flush=True)
    # graphile-worker 0.18 declares node >= 22.18 (its support policy); npm's engine
    # warning is left out here and the node version is recorded in the settings.
    result = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=FOLDER, capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"npm ci in {FOLDER} failed:\n{result.stderr[-3000:]}")
    STAMP.write_text(wanted + "\n")


def url(dsn: str) -> str:
    """A libpq DSN as the postgres:// URL node-postgres takes (socket hosts as ?host=)."""
    given = psycopg.conninfo.conninfo_to_dict(dsn)
    host, port = str(given.pop("host", "")), given.pop("port", None)
    user, password = given.pop("user", None), given.pop("password", None)
    dbname = str(given.pop("dbname", ""))
    query = {key: str(value) for key, value in given.items()}
    if host.startswith("/"):
        query["host"], host = host, ""
    auth = ""
    if user is not None:
        auth = urllib.parse.quote(str(user), safe="")
        if password is not None:
            auth += ":" + urllib.parse.quote(str(password), safe="")
        auth += "@"
    netloc = auth + host + (f":{port}" if port else "")
    query_text = "?" + urllib.parse.urlencode(query) if query else ""
    return f"postgres://{netloc}/{urllib.parse.quote(dbname, safe='')}{query_text}"


def command(dsn: str, action: str, *args: str) -> list[str]:
    found = node()
    if found is None:
        raise RuntimeError("no node on PATH")
    return [found, str(RUNNER), action, "--url", url(dsn), *args]


def install(dsn: str) -> None:
    """graphile-worker's schema in the database `dsn`, installed before anything is timed."""
    ensure_installed()
    result = subprocess.run(
        command(dsn, "install"), cwd=FOLDER, capture_output=True, text=True, check=False,
        timeout=120,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"graphile-worker's migrations failed:\n{result.stderr[-3000:]}")


def versions() -> dict[str, str | None]:
    """The node and graphile-worker that run (for the JSON's settings)."""
    found = node()
    node_version = None
    if found:
        out = subprocess.run([found, "--version"], capture_output=True, text=True, check=False)
        node_version = out.stdout.strip()
    package = FOLDER / "node_modules" / "graphile-worker" / "package.json"
    installed = json.loads(package.read_text())["version"] if package.exists() else None
    return {"node": node_version, "graphile_worker": installed}
