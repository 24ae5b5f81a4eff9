"""The attempt rule on real processes (issue 31, acceptance 1): Workers run as users
run them (`python -m trioworker run`), on real PostgreSQL, one link cut by a
blackholing proxy where a test needs it, judged by the observer log the handlers
write (tests/apps/attempt_rule.py), whose times are `time.monotonic()`: one clock for
every process here, the test's own too.

The cut-off cases use lease 6 s and heartbeat 0.5 s: an attempt self-stops 3 s after
its last good heartbeat, and another Worker may take its item 3 s later.
"""

from __future__ import annotations

import collections
import itertools
import json
import signal
import time
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
import pytest

from examples.media._observer import overlaps
from tests.integration.test_fail_stop_outside import advertised, events
from tests.integration.test_hostile_input import finished
from tests.integration.test_worker import target_of
from tests.support.fault_proxy import ProxyThread
from tests.support.processes import attempt_spans, ended, observed, wait_for, workers
from trioworker import Settings

Conn = psycopg.Connection[Any]
APP = "tests.apps.attempt_rule:registry"
#: Stopped by its kind's timeout (2.5 s) or the shutdown (2 s after SIGTERM) before its
#: deadline (3 s after its last good heartbeat), its cleanup may take 2.7 s more.
CUT = Settings(lease=6, heartbeat=0.5, poll=0.5, stop_grace=2.7, shutdown_grace=2)
#: A handler that will not stop: fail-stopped 2 s after its deadline.
STUBBORN = Settings(lease=6, heartbeat=0.5, poll=0.5, stop_grace=2)
FAST = Settings(lease=4, heartbeat=1, poll=0.1, stop_grace=1)


def run_args(settings: Settings, concurrency: int = 1) -> list[str]:
    return [
        "--lease", f"{settings.lease:g}", "--heartbeat", f"{settings.heartbeat:g}",
        "--poll", f"{settings.poll:g}", "--stop-grace", f"{settings.stop_grace:g}",
        "--shutdown-grace", f"{settings.shutdown_grace:g}", "--concurrency", str(concurrency),
    ]  # fmt: skip


def enqueue(pg: Conn, kind: str, payload: dict[str, Any], scope: str | None = None) -> int:
    row = pg.execute(
        "INSERT INTO work_items (kind, scope, payload) VALUES (%s, %s, %s) RETURNING id",
        [kind, scope, json.dumps(payload)],
    ).fetchone()
    assert row is not None
    return int(row[0])


def attempts(pg: Conn, id: int) -> list[tuple[int, str, str]]:
    """The item's past attempts as work_attempts notes them: (attempt, outcome, Worker).
    Each write of an attempt but a success notes its outcome; lease recovery notes
    "stalled"."""
    rows = pg.execute(
        "SELECT attempt, outcome, worker_id FROM work_attempts WHERE item_id = %s ORDER BY 1",
        [id],
    ).fetchall()
    return [(a, outcome, worker) for a, outcome, worker in rows]


class CutOff(NamedTuple):
    """What became of a cut-off attempt (`cut_off_past_its_deadline`)."""

    #: Attempt 1's began, cut, cancelled, deadline, healed and end, as `time.monotonic()`.
    times: dict[str, float]
    #: The item's row once it finished, and its attempts as work_attempts notes them.
    row: dict[str, Any]
    noted: list[tuple[int, str, str]]
    #: Attempt 2's start lines.
    again: list[dict[str, Any]]
    #: The cut-off Worker's exit code (None: still running), and its output.
    code: int | None
    output: str


def cut_off_past_its_deadline(dsn: str, pg: Conn, tmp_path: Path, kind: str) -> CutOff:
    """Run attempt 1 of a `kind` item on a Worker whose link is cut as the handler
    starts; its handler is stopped (by `kind`'s timeout, or the shutdown: SIGTERM just
    after the cut) and cleans up, shielded, past its self-stop deadline; the link heals
    after that deadline and before the handler ends. Then the item is left to finish
    (ShutDown: a second Worker is started as the first stops)."""
    healed = tmp_path / "healed"
    payload = {"heartbeat": CUT.heartbeat, "healed": str(healed), "after_heal": 0.3}
    proxy = ProxyThread(*target_of(dsn))
    try:
        with workers(tmp_path) as start:
            cut_off = start(proxy.proxy.dsn(dsn), *run_args(CUT), name="cut-off", app=APP)
            wait_for(lambda: advertised(pg, "cut-off"), 30, "the Worker to start")
            id = enqueue(pg, kind, payload, scope="7")
            [began] = wait_for(lambda: events(tmp_path, "start"), 30, "the handler to start")
            proxy.blackhole()
            cut_at = time.monotonic()
            if kind == "ShutDown":
                cut_off.signal(signal.SIGTERM)
                start(dsn, *run_args(CUT), name="rescuer", app=APP)
            [cleanup] = wait_for(lambda: first_attempts(tmp_path, "cleanup"), 10, "a cleanup")
            # The link heals once the handler's deadline has passed, as it cleans up.
            time.sleep(max(0.0, cleanup["deadline"] + 0.3 - time.monotonic()))
            proxy.heal()
            healed_at = time.monotonic()
            healed.touch()
            [end] = wait_for(lambda: first_attempts(tmp_path, "end"), 10, "the handler to end")
            if kind == "ShutDown":
                cut_off.wait(timeout=30)
            row = finished(pg, [id], timeout=30)[id]
            code = cut_off.proc.poll()
            output = cut_off.output()
    finally:
        proxy.close()
    [cancelled] = first_attempts(tmp_path, "cancelled")
    times = {
        "began": began["t"], "cut": cut_at, "cancelled": cancelled["t"],
        "deadline": cleanup["deadline"], "healed": healed_at, "end": end["t"],
    }  # fmt: skip
    again = [e for e in events(tmp_path, "start") if e["attempt"] == 2]
    print(f"\n{kind}, from the start of attempt 1:" + ", ".join(
        f" {name} {t - began['t']:.3f}s" for name, t in times.items()
    ) + "".join(f"; attempt 2 began at {e['t'] - began['t']:.3f}s" for e in again))  # fmt: skip
    return CutOff(times, row, attempts(pg, id), again, code, output)


def first_attempts(tmp_path: Path, event: str) -> list[dict[str, Any]]:
    return [e for e in events(tmp_path, event) if e["attempt"] == 1]


def assert_as_in_finding_1(times: dict[str, float]) -> None:
    """Stopped first, the self-stop deadline passed while the handler cleaned up, then
    the link healed, and after that the handler ended, well within its stop grace.

    The finding is about times: a cancel (the kind's 2.5 s timeout, or the shutdown
    grace) that comes before the self-stop deadline (lease/2 after the last good
    heartbeat), a cleanup that outlives it and ends within the stop grace. Those are
    the configured settings' own times, so the tests that build it run alone
    (tests/support/alone.py): another test competing for the cores could move them."""
    assert times["cancelled"] < times["deadline"] < times["healed"] < times["end"]
    assert times["end"] < times["cancelled"] + CUT.stop_grace


@pytest.mark.alone
def test_a_cut_off_attempt_writes_nothing_past_its_deadline_though_its_timeout_came_first(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """Finding 1: the kind's timeout (2.5 s, under half the lease) cancels the handler,
    whose heartbeats fail; its shielded cleanup runs past its self-stop deadline, the
    link heals, then the handler ends. The attempt writes nothing (max_attempts=1: its
    timeout would have failed the item) and says it self-stopped: lease recovery
    requeues the item as a stall, and the same Worker, still running, succeeds at
    attempt 2."""
    run = cut_off_past_its_deadline(dsn, pg, tmp_path, "TimedOut")
    assert_as_in_finding_1(run.times)
    assert (run.row["status"], run.row["stalls"], run.row["failures"]) == ("Succeeded", 1, 0)
    assert run.noted == [(1, "stalled", "cut-off")]
    assert "self-stopped: no heartbeat succeeded" in run.output
    assert [e["worker"] for e in run.again] == ["cut-off"]
    assert run.again[0]["t"] > run.times["end"] and run.code is None


@pytest.mark.alone
def test_a_cut_off_attempt_writes_nothing_past_its_deadline_though_a_shutdown_came_first(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """Finding 1 again, stopped first by the shutdown: SIGTERM, and the shutdown grace
    (2 s) runs out before the deadline. The attempt writes nothing (no release) and
    says it self-stopped, its Worker exits 0, and another Worker's lease recovery
    requeues the item as a stall and succeeds at attempt 2."""
    run = cut_off_past_its_deadline(dsn, pg, tmp_path, "ShutDown")
    assert_as_in_finding_1(run.times)
    assert run.times["cancelled"] - run.times["cut"] >= CUT.shutdown_grace
    assert (run.row["status"], run.row["stalls"], run.row["failures"]) == ("Succeeded", 1, 0)
    assert run.noted == [(1, "stalled", "cut-off")]
    assert "self-stopped: no heartbeat succeeded" in run.output
    assert [e["worker"] for e in run.again] == ["rescuer"]
    assert run.again[0]["t"] > run.times["end"] and run.code == 0


def test_a_handler_reaching_for_its_scope_gets_an_attribute_error_and_the_worker_goes_on(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """Finding 2: a handler that moves its scope's deadline away, or cancels its scope,
    as 0.1 let it, gets an AttributeError there, which becomes its item's error (Failed,
    no stall); the Worker runs the next item."""
    ids = [enqueue(pg, "ReachesForItsScope", {"how": how}) for how in ("move", "cancel")]
    with workers(tmp_path) as start:
        worker = start(dsn, *run_args(FAST), name="w1", app=APP)
        items = finished(pg, ids, timeout=30)
        later = enqueue(pg, "Record", {"seconds": 0.1})
        assert finished(pg, [later], timeout=30)[later]["status"] == "Succeeded"
        assert worker.proc.poll() is None, worker.output()
    for id in ids:
        item = items[id]
        assert (item["status"], item["failures"], item["stalls"]) == ("Failed", 1, 0)
        assert item["error"].startswith(
            "AttributeError: ctx.cancel_scope is gone: the attempt's cancel scope belongs"
            " to the Worker."
        )
    reached = sorted((e["id"], e["event"]) for e in observed(tmp_path) if e["id"] in ids)
    assert reached == [(ids[0], "start"), (ids[1], "start")]  # neither went on


@pytest.mark.alone
def test_a_handler_that_ignores_its_deadline_is_still_stopped_at_it(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """Finding 2, the harm: a handler tries to move its scope's deadline away, catches
    its cancel and goes on, shielded, writing a line every 0.1 s; its link is cut. Its
    Worker fail-stops (run exits 70) a stop grace after the self-stop deadline, before
    the lease ends; another Worker then runs the item's next attempt, and the defiant
    handler wrote nothing after that began. Before the lease ends is the property (the
    fail-stop is what keeps two attempts from running at once), a bound in seconds
    from the settings (deadline + stop grace, lease - lease/2): it runs alone
    (tests/support/alone.py)."""
    proxy = ProxyThread(*target_of(dsn))
    try:
        with workers(tmp_path) as start:
            defiant = start(proxy.proxy.dsn(dsn), *run_args(STUBBORN), name="defiant", app=APP)
            wait_for(lambda: advertised(pg, "defiant"), 30, "the Worker to start")
            id = enqueue(pg, "Defiant", {"holder": "defiant"}, scope="7")
            [began] = wait_for(lambda: events(tmp_path, "start"), 30, "the handler to start")
            wait_for(lambda: events(tmp_path, "tick"), 10, "the handler to tick")
            proxy.blackhole()
            cut_at = time.monotonic()
            rescuer = start(dsn, *run_args(STUBBORN), name="rescuer", app=APP)
            wait_for(lambda: ended(began["pid"]), STUBBORN.lease, "the defiant Worker to end")
            dead_at = time.monotonic()
            code = defiant.wait(timeout=10)
            row = finished(pg, [id], timeout=30)[id]
            rescuer.signal(signal.SIGTERM)
            assert rescuer.wait(timeout=30) == 0, rescuer.output()
    finally:
        proxy.close()
    deadline = events(tmp_path, "tick", "defiant")[-1]["deadline"]  # as the link was cut
    [rescued] = events(tmp_path, "start", "rescuer")
    last = max(e["t"] for e in observed(tmp_path) if e["pid"] == began["pid"])
    print(
        f"\nDefiant: cut {deadline - cut_at:.3f}s before its deadline, dead"
        f" {dead_at - deadline:.3f}s after it (its stop grace {STUBBORN.stop_grace:g}s),"
        f" its last line {dead_at - last:.3f}s before; the next attempt began"
        f" {rescued['t'] - dead_at:.3f}s after"
    )
    output = defiant.output()
    assert code == 70, output
    assert f"fail-stop: Worker defiant (pid {began['pid']}): handler of item {id} " in output
    assert "did not stop within 2s of being cancelled (self_stop)" in output
    assert [e["event"] for e in events(tmp_path, "cancelled")] == ["cancelled"]
    lease_ends = deadline + STUBBORN.lease - STUBBORN.self_stop_after
    assert deadline + STUBBORN.stop_grace - 0.1 <= dead_at < lease_ends
    assert last < dead_at < rescued["t"]
    assert (rescued["attempt"], row["status"], row["stalls"]) == (2, "Succeeded", 1)


def test_a_scope_is_not_handed_on_until_the_handler_that_completed_it_has_returned(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """Finding 4: 30 items of one scope, each completed in its fenced transaction by a
    handler whose shielded cleanup then takes 0.2 s, on two Workers: every item
    Succeeded once, both Workers ran some, and the observer saw no item of the scope
    start before the previous one's handler (its cleanup included) had ended. (A Worker
    claims along with its completions, work_finish_and_claim_v3, so the one that
    finishes the scope's item takes its next one in the same transaction: the scope
    passes to the other Worker when the first one stops, a graceful SIGTERM mid-way.)"""
    ids = [enqueue(pg, "CleansUp", {"seconds": 0.2}, scope="s") for _ in range(30)]
    with workers(tmp_path) as start:
        first = start(dsn, *run_args(FAST), name="w1", app=APP)
        finished(pg, ids[:10], timeout=60)
        start(dsn, *run_args(FAST), name="w2", app=APP)
        first.signal(signal.SIGTERM)
        items = finished(pg, ids, timeout=60)
    spans = attempt_spans(tmp_path)
    gap = min(b.start - a.end for a, b in itertools.pairwise(spans) if a.end is not None)
    shares = collections.Counter(s.worker for s in spans)
    print(f"\nCleansUp: items run {dict(shares)}; one's end to the next start >= {gap:.4f}s")
    assert overlaps(spans) == []
    assert all(s.end is not None for s in spans)  # each ended before its item Succeeded
    assert {item["status"] for item in items.values()} == {"Succeeded"}
    assert sorted((s.id, s.attempt) for s in spans) == [(id, 1) for id in ids]
    assert {s.worker for s in spans} == {"w1", "w2"}


HOSTILE = {
    "str raises KeyboardInterrupt": "Hostile: <str() of the error raised KeyboardInterrupt>",
    "str raises SystemExit": "Hostile: <str() of the error raised SystemExit>",
    "str raises BaseException": "Hostile: <str() of the error raised BaseException>",
    "forged Cancelled": "Cancelled: cancelled due to explicit",  # then its task's repr
    "forged Cancelled in a group": "BaseExceptionGroup: forged (1 sub-exception)",
    "ExceptionGroup nested 2,000 deep": "ExceptionGroup: deeper (1 sub-exception)",
}


def test_whatever_a_handler_raises_is_its_items_error_and_the_worker_goes_on(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """Finding 5, what tests/integration/test_hostile_input.py does not raise: a
    __str__ raising KeyboardInterrupt, SystemExit or BaseException, a forged
    trio.Cancelled alone and in a group, a group nested 2,000 deep, each raised while
    two innocent items claimed with them run (in one claim: one started_at; they run
    until every hostile item has ended, and are Running then); and, after a cancel
    request, an exception whose __repr__ raises KeyboardInterrupt. Each hostile item is
    Failed with its error stored (the cancelled one Cancelled), none stalled; the
    innocent ones and one enqueued afterwards Succeeded, and the one Worker process
    that ran them all is still running."""
    let_go = tmp_path / "let-go"
    innocent = [enqueue(pg, "Outwaits", {"until": str(let_go)}, scope=f"i{n}") for n in range(2)]
    hostile = {what: enqueue(pg, "Hostile", {"raise": what}) for what in HOSTILE}
    after_cancel = enqueue(
        pg, "Hostile", {"raise": "repr raises KeyboardInterrupt after a cancel request"}
    )
    with workers(tmp_path) as start:
        worker = start(dsn, *run_args(FAST, concurrency=10), name="w1", app=APP)
        wait_for(
            lambda: any(e["id"] == after_cancel for e in events(tmp_path, "start")),
            30,
            "the handler to wait for its cancel",
        )
        pg.execute("UPDATE work_items SET cancel_requested = true WHERE id = %s", [after_cancel])
        finished(pg, [*hostile.values(), after_cancel], timeout=30)
        still = pg.execute(
            "SELECT status FROM work_items WHERE id = ANY(%s)", [innocent]
        ).fetchall()
        let_go.touch()
        items = finished(pg, [*hostile.values(), *innocent, after_cancel], timeout=30)
        later = enqueue(pg, "Record", {"seconds": 0.1})
        assert finished(pg, [later], timeout=30)[later]["status"] == "Succeeded"
        assert worker.proc.poll() is None, worker.output()
        output = worker.output()
    # Claimed together (one claim, one transaction's now()), and every hostile item
    # ended while both innocent ones ran.
    claimed = pg.execute(
        "SELECT count(DISTINCT started_at) FROM work_items WHERE id = ANY(%s)",
        [[*hostile.values(), *innocent, after_cancel]],
    ).fetchone()
    assert claimed == (1,)
    assert still == [("Running",), ("Running",)]
    ends = [e["id"] for e in events(tmp_path, "end") if e["id"] != later]
    assert sorted(ends) == sorted(innocent)
    errors = {what: (items[id]["status"], items[id]["stalls"]) for what, id in hostile.items()}
    assert errors == {what: ("Failed", 0) for what in HOSTILE}
    for what, id in hostile.items():
        assert items[id]["error"].startswith(HOSTILE[what]), (what, items[id]["error"])
    assert [items[id]["status"] for id in innocent] == ["Succeeded", "Succeeded"]
    assert (items[after_cancel]["status"], items[after_cancel]["stalls"]) == ("Cancelled", 0)
    assert "after the cancel the handler raised Hostile" in output
