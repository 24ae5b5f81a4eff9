"""Tests marked `alone` run while no other test of the run does.

A few tests hold a bound in seconds that is their property (a fail-stop before the
lease ends, a vanished host's scope freed within two leases, a page's target time): a
bound derived from the settings they configure, which a second pytest worker competing
for this machine's two cores could break without the code being wrong. Under
pytest-xdist each test holds a shared lock on a file of the run's for its setup, call
and teardown; an `alone` test holds it exclusively, so it starts once the tests running
on other workers have ended, and they start their next only after it. A second file,
the gate, lets an `alone` test waiting for its turn stop others from starting (no
worker's run of tests can starve it). Without xdist tests run one at a time anyway.

The lock is an autouse function fixture's, so it covers what function fixtures start:
session and module fixtures are set up before it and torn down after it. The only
wider fixture an `alone` test uses is the session's browser, idle between its requests;
another worker's module fixture that keeps something running (the dashboard tests'
Worker polling every 0.5 s) may run beside an `alone` test: a light load, not a
competing test.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def turn(run_dir: Path, alone: bool) -> Iterator[None]:
    """Hold the run's test lock (in `run_dir`, shared by the run's workers): shared, or
    exclusive if `alone`."""
    with (run_dir / "alone.gate").open("a") as gate, (run_dir / "alone.lock").open("a") as lock:
        if alone:
            fcntl.flock(gate, fcntl.LOCK_EX)  # no test starts from now on ...
            fcntl.flock(lock, fcntl.LOCK_EX)  # ... and the running ones have ended
        else:
            fcntl.flock(gate, fcntl.LOCK_SH)  # no alone test is waiting or running
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # (closing the files releases the locks)
