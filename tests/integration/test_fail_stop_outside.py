"""The fail-stop from outside (issue 31): `run` is always a supervisor, which kills its
Worker once a cancelled handler has outlived its stop grace, however stuck the Worker's
interpreter is (C code holding the GIL, a log write to a pipe nobody reads). Real
processes, real PostgreSQL, a blackholed link, and the observer log, whose times are
`time.monotonic()`: one clock for every process here, the test's own too.

Lease 8 s, heartbeat 1 s, stop grace 2 s (as in the issue's finding): a cut-off attempt
self-stops 4 s after its last good heartbeat, its supervisor kills the Worker 2 s (the
grace) + 1 s (the kill margin) later, and another Worker may take the item once the
lease has run out, at 8 s.

"Before the lease ends" is the fail-stop's property (it is what keeps a stuck attempt
from running beside the next one), a bound in seconds from those settings: the tests
that hold it run alone (tests/support/alone.py), no other test competing for the cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.test_worker import target_of
from tests.support.fault_proxy import ProxyThread
from tests.support.processes import ROOT, ended, observed, wait_for, workers
from trioworker import Settings
from trioworker._cli.supervisor import FLUSH_LOGS_WITHIN

Conn = psycopg.Connection[Any]
SETTINGS = Settings(lease=8, heartbeat=1, stop_grace=2, poll=1)
ARGS = ["--lease", "8", "--heartbeat", "1", "--stop-grace", "2", "--poll", "1"]
#: After the self-stop deadline: the supervisor's kill, and the lease's end.
KILL_AFTER = SETTINGS.stop_grace + SETTINGS.kill_margin
LEASE_ENDS_AFTER = SETTINGS.lease - SETTINGS.self_stop_after


def events(tmp_path: Path, event: str, worker: str | None = None) -> list[dict[str, Any]]:
    return [
        e for e in observed(tmp_path)
        if e["event"] == event and (worker is None or e["worker"] == worker)
    ]  # fmt: skip


def advertised(pg: Conn, worker_id: str) -> bool:
    row = pg.execute(
        "SELECT count(*) FROM work_workers WHERE id = %s AND stopped_at IS NULL", [worker_id]
    ).fetchone()
    return row == (1,)


def lateness(output: str) -> float:
    """How late after the bound the supervisor says it killed."""
    found = re.search(r"was (\d+\.\d+)s past its handlers' stop bound", output)
    assert found, output
    return float(found[1])


@pytest.mark.alone
def test_a_handler_holding_the_gil_is_killed_before_its_lease_ends(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """Finding 6: a handler cut off from PostgreSQL holds the GIL in one C call for
    three leases, which stops the event loop and every thread. The supervisor kills the
    Worker after the stop grace and before the lease ends (counted from the last good
    heartbeat, as the handler saw it), logs why, and `run` exits 70; the handler wrote
    nothing after, and the item's next attempt, on another Worker, starts after the
    kill."""
    proxy = ProxyThread(*target_of(dsn))
    try:
        with workers(tmp_path) as start:
            cut_off = start(proxy.proxy.dsn(dsn), *ARGS, name="cut-off")
            wait_for(lambda: advertised(pg, "cut-off"), 30, "the Worker to start")
            payload = {"holder": "cut-off", "heartbeat": SETTINGS.heartbeat, "seconds": 24}
            pg.execute(
                "INSERT INTO work_items (kind, scope, payload) VALUES ('HoldGIL', 'x', %s)",
                [json.dumps(payload)],
            )
            [began] = wait_for(lambda: events(tmp_path, "start"), 30, "the handler to start")
            proxy.blackhole()
            [gil] = wait_for(lambda: events(tmp_path, "gil"), 10, "the handler to take the GIL")
            rescuer = start(dsn, *ARGS, name="rescuer")
            wait_for(lambda: ended(began["pid"]), SETTINGS.lease, "the Worker to be killed")
            dead_at = time.monotonic()
            code = cut_off.wait(timeout=10)
            [rescued] = wait_for(
                lambda: events(tmp_path, "start", "rescuer"), 30, "the next attempt"
            )
            rescuer.signal(signal.SIGTERM)
            assert rescuer.wait(timeout=30) == 0, rescuer.output()
    finally:
        proxy.close()
    output = cut_off.output()
    deadline = gil["deadline"]  # the last good heartbeat's send time + half the lease
    print(
        f"\nGIL held: killed {dead_at - deadline:.3f}s after the self-stop deadline (bound"
        f" {KILL_AFTER:g}s, lease ends {LEASE_ENDS_AFTER:g}s), {lateness(output):.3f}s past"
        f" its bound by the supervisor's clock; the next attempt started"
        f" {rescued['t'] - dead_at:.3f}s after the kill"
    )
    assert code == 70, output
    assert f"fail-stop: Worker cut-off (pid {began['pid']}) was" in output
    assert deadline + SETTINGS.stop_grace <= dead_at < deadline + LEASE_ENDS_AFTER
    assert lateness(output) < 0.25
    mine = [e["event"] for e in observed(tmp_path) if e["pid"] == began["pid"]]
    assert mine == ["start", "gil"]  # no end: it wrote nothing after
    assert (rescued["attempt"], rescued["worker"]) == (2, "rescuer") and rescued["t"] > dead_at


def blocked_writing_a_pipe(pid: int) -> bool:
    """Whether a thread of process `pid` waits in the kernel to write to a full pipe."""
    return any(
        "pipe_write" in wchan.read_text() for wchan in Path(f"/proc/{pid}/task").glob("*/wchan")
    )


def fill(fd: int) -> None:
    """Write to the non-blocking `fd` until its pipe takes not one byte more."""
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(fd, b"x")


@pytest.mark.alone
def test_a_worker_blocked_on_a_full_stderr_is_killed_and_run_still_exits_70(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """Finding 7: `run`'s stdout and stderr are a pipe nobody reads (a stuck log
    shipper), which a handler's thread fills with its log lines. Then the link is cut:
    the Worker's own warnings block on the pipe too, so it cannot end itself, and the
    handler ignores its cancel. The supervisor, whose stderr is that same pipe, kills the
    Worker after the stop grace and before the lease ends, and `run` exits 70."""
    proxy = ProxyThread(*target_of(dsn))
    read, write = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trioworker", "--dsn", proxy.proxy.dsn(dsn), "run",
         "--app", "tests.apps.recording:registry", "--worker-id", "flooded", *ARGS],
        cwd=ROOT,
        env={**os.environ, "TW_OBSERVER_LOG": str(tmp_path / "observer.jsonl")},
        stdout=write,
        stderr=write,
    )  # fmt: skip
    os.close(write)
    filler = os.open(f"/proc/self/fd/{read}", os.O_WRONLY | os.O_NONBLOCK)  # its own flags
    try:
        wait_for(lambda: advertised(pg, "flooded"), 30, "the Worker to start")
        pg.execute("INSERT INTO work_items (kind, scope) VALUES ('FloodLog', 'x')")
        [began] = wait_for(lambda: events(tmp_path, "start"), 30, "the handler to start")
        wait_for(lambda: blocked_writing_a_pipe(began["pid"]), 10, "the handler to fill the pipe")
        fill(filler)  # to the last byte: the supervisor's own lines block too
        proxy.blackhole()
        wait_for(lambda: ended(began["pid"]), 2 * SETTINGS.lease, "the Worker to be killed")
        dead_at = time.monotonic()
        code = proc.wait(timeout=FLUSH_LOGS_WITHIN + 10)
        exited_at = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()  # the supervisor (its Worker goes with it), or before it a Worker
            proc.wait(timeout=10)
        os.close(read)
        os.close(filler)
        proxy.close()
    deadline = events(tmp_path, "deadline")[-1]["deadline"]  # as the link was cut
    print(
        f"\nFull stderr: killed {dead_at - deadline:.3f}s after the self-stop deadline"
        f" (bound {KILL_AFTER:g}s, lease ends {LEASE_ENDS_AFTER:g}s); run exited"
        f" {exited_at - dead_at:.3f}s later"
    )
    assert code == 70
    assert deadline + SETTINGS.stop_grace <= dead_at < deadline + LEASE_ENDS_AFTER
    # Its fail-stop line stuck, the supervisor waited for it a bounded time, then exited.
    assert FLUSH_LOGS_WITHIN - 0.5 < exited_at - dead_at < FLUSH_LOGS_WITHIN + 2
    assert all(e["t"] < dead_at for e in observed(tmp_path) if e["pid"] == began["pid"])


def test_a_killed_supervisor_takes_its_worker_with_it(dsn: str, tmp_path: Path) -> None:
    """The Worker is a child of its supervisor's main thread (the kernel signals it when
    the thread that forked it ends, so not a helper thread that retires when idle), and
    a SIGKILLed supervisor's Worker is SIGKILLed too: none runs on with nobody holding
    its bound, nor drains as if asked to stop."""
    with workers(tmp_path) as start:
        run = start(dsn, *ARGS, name="orphan")
        pid = run.worker_pid()
        wait_for(lambda: "worker orphan ready" in run.output(), 30, "the Worker to be ready")
        run.signal(signal.SIGKILL)
        wait_for(lambda: ended(pid), 5, "the Worker to die with its supervisor")
    assert "stopping" not in run.output()


def test_the_workers_fail_stop_writes_nothing_but_its_pipe_and_exits_70() -> None:
    """WatchdogLink.fail_stop with stdout and stderr a full pipe and output waiting in
    stdout's buffer: the process exits 70 at once, its message on the watchdog pipe;
    nothing is logged or flushed on the way (either would block)."""
    watchdog_read, watchdog_write = os.pipe()
    full_read, full_write = os.pipe()
    os.set_blocking(full_write, False)
    fill(full_write)
    os.set_blocking(full_write, True)
    script = (
        "import sys; from trioworker._worker.watchdog import WatchdogLink;"
        " print('waits in the buffer', end='');"
        " WatchdogLink(int(sys.argv[1])).fail_stop('handler of item 9 did not stop\\nat all')"
    )
    buffered = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script, str(watchdog_write)],
            cwd=ROOT,
            env=buffered,
            pass_fds=(watchdog_write,),
            stdout=full_write,
            stderr=full_write,
            timeout=30,
            check=False,
        )
        # (This process holds the pipe's write end too: read only what is there.)
        ready, _, _ = select.select([watchdog_read], [], [], 10)
        sent = os.read(watchdog_read, 4096) if ready else b""
    finally:
        for fd in (watchdog_read, watchdog_write, full_read, full_write):
            os.close(fd)
    assert proc.returncode == 70
    assert sent == b"f handler of item 9 did not stop at all\n"
