"""The Worker's own store calls as operations (trioworker/_postgres/worker_operations.py),
run by the scripted driver of test_operations.py: what each sends and what it makes of
the rows. No database: the contract and Worker tests run them on PostgreSQL."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tests.unit.test_operations import run
from trioworker import ConfigurationError, Status, StoreError, WorkItem
from trioworker._core.jsontext import UndecodableValue
from trioworker._core.limits import Declared, Limit, LimitChange, Rate
from trioworker._core.model import Heartbeat, HeldLease, Recovered, ScopeHolder, WorkerInfo
from trioworker._core.schedule import Schedule
from trioworker._postgres import worker_operations as wops
from trioworker._postgres.operations import Query
from trioworker._store.reads import ALIVE_BEATS, ALIVE_WITHIN

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
CLAIM = {
    "worker_id": "w", "lease": 30.0, "limit": 4, "kinds": ["A", "B"], "scopes": ["s"],
    "unscoped": False,
}  # fmt: skip


def claimed_row(id: int, **changes: Any) -> dict[str, Any]:
    return {
        "id": id, "kind": "A", "scope": None, "payload": '{"n":1}', "attempt": 1, "stalls": 0,
        "failures": 0, "requested_at": T0, "dedup_key": None, "priority": 0,
        "trace_context": None, **changes,
    }  # fmt: skip


def item(id: int) -> WorkItem:
    return WorkItem(id=id, kind="A", scope=None, payload={"n": 1}, attempt=1, requested_at=T0)


# -- the claim -------------------------------------------------------------------------


def test_claim_params_carry_the_claimers_choice() -> None:
    """Kinds and scopes as lists (sequences of any kind); None scopes: every scope."""
    params = wops.claim_params("w", 30.0, 4, ("s",), unscoped=False, kinds=("A", "B"))
    assert params == CLAIM
    every = wops.claim_params("w", 1.5, 1, None, unscoped=True, kinds=["A"])
    assert every == {
        "worker_id": "w", "lease": 1.5, "limit": 1, "kinds": ["A"], "scopes": None,
        "unscoped": True,
    }  # fmt: skip


def test_claim_params_refuse_every_scope_without_unscoped_items() -> None:
    """Serving every scope means serving unscoped items too."""
    with pytest.raises(
        ValueError, match=r"^a Worker serving every scope serves unscoped items too$"
    ):
        wops.claim_params("w", 30.0, 1, None, unscoped=False, kinds=["A"])


def test_claim_reads_its_rows_as_stored_and_returns_the_items_by_id() -> None:
    """One statement, read as stored; the items decoded and sorted by id."""
    op = wops.claim(CLAIM)
    assert op.name == "claim" and not op.atomic
    result, sent = run(op, [claimed_row(9), claimed_row(3)])
    assert result == [item(3), item(9)]
    assert sent == [Query("claim", CLAIM, as_stored=True)]
    assert run(wops.claim(CLAIM), [])[0] == []


def test_claim_runs_again_from_the_start() -> None:
    """Each `steps()` is a fresh run (the driver's retry after a lost race)."""
    op = wops.claim(CLAIM)
    assert run(op, [claimed_row(1)])[0] == [item(1)]
    assert run(op, [claimed_row(2)])[0] == [item(2)]


def test_finish_and_claim_splits_the_completions_from_the_claims() -> None:
    """Rows with `finished` are completions applied; the others are claimed items, by id."""
    op = wops.finish_and_claim([(5, 2), (6, 1)], CLAIM)
    assert op.name == "finish_and_claim" and not op.atomic
    rows = [
        {"finished": 5, **dict.fromkeys(claimed_row(0))},
        {"finished": None, **claimed_row(8)},
        {"finished": None, **claimed_row(7)},
    ]
    result, sent = run(op, rows)
    assert result == ({5}, [item(7), item(8)])
    assert sent == [
        Query("finish_and_claim", {"ids": [5, 6], "attempts": [2, 1], **CLAIM}, as_stored=True)
    ]


def test_seconds_until_due() -> None:
    """The first row's seconds (None: nothing due later)."""
    op = wops.seconds_until_due(kinds=("A",), scopes=("s", "t"), unscoped=False)
    assert op.name == "seconds_until_due"
    result, sent = run(op, [{"seconds": 2.5}])
    assert result == 2.5
    assert sent == [
        Query("seconds_until_due", {"kinds": ["A"], "scopes": ["s", "t"], "unscoped": False})
    ]
    op = wops.seconds_until_due(kinds=["A"], scopes=None, unscoped=True)
    result, sent = run(op, [{"seconds": None}])
    assert result is None
    assert sent[0].params == {"kinds": ["A"], "scopes": None, "unscoped": True}


# -- heartbeats ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "answer"),
    [
        ({"lost": True, "cancel_requested": True}, Heartbeat.LOST),
        ({"lost": False, "cancel_requested": True}, Heartbeat.CANCEL_REQUESTED),
        ({"lost": False, "cancel_requested": False}, Heartbeat.OK),
    ],
)
def test_heartbeat(row: dict[str, Any], answer: Heartbeat) -> None:
    """Lost wins over a cancel request; else the request, else OK."""
    op = wops.heartbeat(4, 2, 30.0)
    assert op.name == "heartbeat"
    result, sent = run(op, [row])
    assert result is answer
    assert sent == [Query("heartbeat", {"id": 4, "attempt": 2, "lease": 30.0})]


def test_heartbeat_wants_exactly_one_row() -> None:
    """No row is an error, not an answer."""
    with pytest.raises(ValueError, match="not enough values"):
        run(wops.heartbeat(4, 2, 30.0), [])


def test_heartbeat_many_answers_each_attempt_the_statement_named() -> None:
    """Lost, a cancel request or OK by (id, attempt); a row with neither is left out."""
    op = wops.heartbeat_many([(1, 1), (2, 3), (3, 1), (4, 1)], 20.0)
    assert op.name == "heartbeat_many"
    rows = [
        {"id": 1, "attempt": 1, "lost": True, "cancel_requested": None},
        {"id": 2, "attempt": 3, "lost": False, "cancel_requested": True},
        {"id": 3, "attempt": 1, "lost": False, "cancel_requested": False},
        {"id": 4, "attempt": 1, "lost": False, "cancel_requested": None},
    ]
    result, sent = run(op, rows)
    assert result == {
        (1, 1): Heartbeat.LOST,
        (2, 3): Heartbeat.CANCEL_REQUESTED,
        (3, 1): Heartbeat.OK,
    }
    params = {"ids": [1, 2, 3, 4], "attempts": [1, 3, 1, 1], "lease": 20.0}
    assert sent == [Query("heartbeat_many", params)]


# -- the fenced finishes ---------------------------------------------------------------


def test_finish_sends_the_outcome_and_returns_the_ids_applied() -> None:
    """Status by value, reason, error, traceback and whether to wait for held rows."""
    op = wops.finish([(1, 2), (3, 4)], Status.FAILED, "r", "e", wait=False, traceback="tb")
    assert op.name == "finish"
    result, sent = run(op, [{"id": 3}])
    assert result == {3}
    params = {
        "ids": [1, 3], "attempts": [2, 4], "status": "Failed", "reason": "r", "error": "e",
        "wait": False, "traceback": "tb",
    }  # fmt: skip
    assert sent == [Query("finish", params)]


def test_finish_defaults() -> None:
    """No reason, error or traceback; waits for held rows."""
    _, sent = run(wops.finish([(1, 1)], Status.SUCCEEDED), [])
    assert sent[0].params == {
        "ids": [1], "attempts": [1], "status": "Succeeded", "reason": None, "error": None,
        "wait": True, "traceback": None,
    }  # fmt: skip


def test_finish_result() -> None:
    """Each attempt with its result's JSON text; the ids applied."""
    op = wops.finish_result([(1, 1), (2, 1)], ['{"a":1}', None], wait=False)
    assert op.name == "finish_result"
    result, sent = run(op, [{"id": 1}, {"id": 2}])
    assert result == {1, 2}
    params = {"ids": [1, 2], "attempts": [1, 1], "results": ['{"a":1}', None], "wait": False}
    assert sent == [Query("finish_result", params)]
    _, sent = run(wops.finish_result([(1, 1)], (None,)), [])
    assert sent[0].params["wait"] is True and sent[0].params["results"] == [None]


def test_requeue() -> None:
    """Back to Queued: True when the row came back Queued, False with no row."""
    op = wops.requeue(4, 2, "retry", delay=1.5, error="e", traceback="tb")
    assert op.name == "requeue"
    result, sent = run(op, [{"status": "Queued"}])
    assert result is True
    params = {
        "ids": [4], "attempts": [2], "cause": "retry", "delay": 1.5, "error": "e",
        "traceback": "tb",
    }  # fmt: skip
    assert sent == [Query("requeue", params)]
    result, sent = run(wops.requeue(4, 2, "release"), [])
    assert result is False
    assert sent[0].params == {
        "ids": [4], "attempts": [2], "cause": "release", "delay": 0.0, "error": None,
        "traceback": None,
    }  # fmt: skip


def test_requeue_left_running_by_a_dedup_race_is_an_error() -> None:
    """A row still Running: a sibling with its dedup key is being enqueued; try again."""
    with pytest.raises(
        StoreError,
        match=r"^release: an item with the same dedup key is being enqueued; try again$",
    ):
        run(wops.requeue(4, 2, "release"), [{"status": "Running"}])


# -- what a handler reads --------------------------------------------------------------


def test_step() -> None:
    """A recorded step's value, decoded (one Python cannot decode, marked); none: False."""
    op = wops.step(4, "fetch")
    assert op.name == "step"
    result, sent = run(op, [{"result": '{"a":[1]}'}])
    assert result == (True, {"a": [1]})
    assert sent == [Query("step", {"id": 4, "name": "fetch"})]
    assert run(wops.step(4, "fetch"), [{"result": None}])[0] == (True, None)
    assert run(wops.step(4, "fetch"), [])[0] == (False, None)
    found, value = run(wops.step(4, "fetch"), [{"result": "[" * 100_000}])[0]
    assert found and isinstance(value, UndecodableValue)


def test_parent_results() -> None:
    """Each parent's result by id, decoded."""
    op = wops.parent_results(9)
    assert op.name == "parent_results"
    result, sent = run(op, [{"id": 1, "result": "2"}, {"id": 3, "result": None}])
    assert result == {1: 2, 3: None}
    assert sent == [Query("parent_results", {"id": 9})]


# -- maintenance -----------------------------------------------------------------------


def test_recover_expired_leases() -> None:
    """One batch; each row a Recovered with its status as a Status."""
    op = wops.recover_expired_leases(3, 50)
    assert op.name == "recover_expired_leases"
    row = {"id": 1, "kind": "A", "scope": "s", "attempt": 2, "stalls": 1, "status": "Queued",
           "reason": None, "worker_id": "w"}  # fmt: skip
    result, sent = run(op, [row])
    assert result == [Recovered(1, "A", "s", 2, 1, Status.QUEUED, None, "w")]
    assert sent == [Query("recover_expired_leases", {"max_stalls": 3, "batch": 50})]


def test_held_leases() -> None:
    op = wops.held_leases(7)
    assert op.name == "held_leases"
    row = {"id": 1, "kind": "A", "scope": None, "attempt": 1, "worker_id": "w",
           "expired_for": 2.0, "holder": 99}  # fmt: skip
    result, sent = run(op, [row])
    assert result == [HeldLease(1, "A", None, 1, "w", 2.0, 99)]
    assert sent == [Query("held_leases", {"limit": 7})]


def test_settle_noted_scopes() -> None:
    """How many this batch settled."""
    op = wops.settle_noted_scopes(100)
    assert op.name == "settle_noted_scopes"
    result, sent = run(op, [{"settled": 4}])
    assert result == 4
    assert sent == [Query("settle_noted_scopes", {"limit": 100})]


def test_repair_heads() -> None:
    """The scopes fixed."""
    op = wops.repair_heads(1000)
    assert op.name == "repair_heads"
    result, sent = run(op, [{"scope": "a"}, {"scope": "b"}])
    assert result == ["a", "b"]
    assert sent == [Query("repair_heads", {"limit": 1000})]


def test_delete_finished() -> None:
    """One batch: the finished times of the items deleted."""
    params = {"older_than": 60.0, "batch": 2, "statuses": ["failed"], "after": T0}
    op = wops.delete_finished(params)
    assert op.name == "delete_finished"
    later = T0 + dt.timedelta(seconds=1)
    result, sent = run(op, [{"finished_at": T0}, {"finished_at": later}])
    assert result == [T0, later]
    assert sent == [Query("delete_finished", params)]


def test_scope_holders() -> None:
    """Each Running item of the scope (a row without one is no holder), and the head."""
    op = wops.scope_holders("s")
    assert op.name == "scope_holder"
    holder = {"id": 1, "attempt": 2, "kind": "A", "worker_id": "w", "cancel_requested": False,
              "lease_left": 3.0, "slot": 1}  # fmt: skip
    result, sent = run(op, [{**holder, "heads": 1}])
    assert result == ([ScopeHolder(**holder)], True)
    assert sent == [Query("scope_holder", {"scope": "s"})]
    free = {**dict.fromkeys(holder), "heads": 0}
    assert run(wops.scope_holders("s"), [free])[0] == ([], False)


# -- limits and schedules ----------------------------------------------------------------


def test_set_limit() -> None:
    """The change's parts as the statement takes them; the limit as it now stands."""
    op = wops.set_limit(LimitChange("A", None, 2, Rate(10, 1.0)))
    assert op.name == "set_limit"
    row = {"kind": "A", "scope": None, "running": 2, "rate": 10, "per": 1.0,
           "updated_at": T0, "in_use": 1}  # fmt: skip
    result, sent = run(op, [row])
    assert result == Limit("A", None, 2, Rate(10, 1.0), T0, in_use=1)
    params = {"kind": "A", "scope": None, "running": 2, "rate": 10, "per": 1.0}
    assert sent == [Query("set_limit", params)]


def test_limit_params_without_a_rate() -> None:
    assert wops.limit_params(LimitChange(None, "s", 1, None)) == {
        "kind": None, "scope": "s", "running": 1, "rate": None, "per": None,
    }  # fmt: skip


def test_declare_limit() -> None:
    """What stood before, and whether it was written."""
    declared = LimitChange("A", None, 3, None)
    op = wops.declare_limit(declared)
    assert op.name == "declare_limit"
    result, sent = run(op, [{"running": 1, "rate": None, "per": None, "written": True}])
    assert result == Declared(declared, (1, None), True)
    params = {"kind": "A", "scope": None, "running": 3, "rate": None, "per": None}
    assert sent == [Query("declare_limit", params)]


def test_clear_limit() -> None:
    op = wops.clear_limit("A", None)
    assert op.name == "clear_limit"
    result, sent = run(op, [{"cleared": True}])
    assert result is True
    assert sent == [Query("clear_limit", {"kind": "A", "scope": None})]
    assert run(wops.clear_limit(None, "s"), [{"cleared": False}])[0] is False


def test_limits() -> None:
    op = wops.limits()
    assert op.name == "limits"
    row = {"kind": None, "scope": "s", "running": 1, "rate": None, "per": None,
           "updated_at": T0, "waiting": 2}  # fmt: skip
    result, sent = run(op, [row])
    assert result == [Limit(None, "s", 1, None, T0, waiting=2)]
    assert sent == [Query("limits", {})]


def test_sync_schedule() -> None:
    """The schedule's fields, its payload as JSON ({} for none), and its first due time."""
    schedule = Schedule("A", every=60.0, scope="s", payload={"x": 1}, priority=3, name="n")
    op = wops.sync_schedule(schedule, T0)
    assert op.name == "sync_schedule"
    result, sent = run(op, [])
    assert result is None
    assert sent == [
        Query(
            "sync_schedule",
            {"name": "n", "kind": "A", "scope": "s", "payload": '{"x": 1}', "priority": 3,
             "spec": schedule.spec, "next_due": T0},
        )
    ]  # fmt: skip
    _, sent = run(wops.sync_schedule(Schedule("A", every=60.0), T0), [])
    assert sent[0].params["payload"] == "{}"


# -- the Worker's presence -------------------------------------------------------------

WORKER = WorkerInfo("w1", "h", 10, ("A",), ("s",), False, 4, 5.0)
ADVERTISED = {
    "id": "w1", "host": "h", "pid": 10, "kinds": ["A"], "scopes": ["s"], "unscoped": False,
    "concurrency": 4, "advertise_every": 5.0, "alive_beats": ALIVE_BEATS,
    "alive_within": ALIVE_WITHIN, "gone_pid": None,
}  # fmt: skip


def never(pid: int) -> bool:
    raise AssertionError("no process to look at")


def test_advertise_records_the_worker() -> None:
    """One statement when the id is free (or the Worker's own)."""
    op = wops.advertise(WORKER, gone=never)
    assert op.name == "advertise_worker"
    result, sent = run(op, [{"id": "w1"}])
    assert result is None
    assert sent == [Query("advertise_worker", ADVERTISED)]
    every = WorkerInfo("w1", "h", 10, ("A",), None, True, 4)
    _, sent = run(wops.advertise(every, gone=never), [{"id": "w1"}])
    assert sent[0].params["scopes"] is None and sent[0].params["advertise_every"] is None


def test_advertise_takes_over_from_an_ended_process_of_its_host() -> None:
    """The holder on this host whose process is gone: its id taken over at once."""
    asked = []

    def gone(pid: int) -> bool:
        asked.append(pid)
        return True

    holder = {"host": "h", "pid": 7, "seen_ago": 1.0}
    result, sent = run(wops.advertise(WORKER, gone=gone), [], [holder], [{"id": "w1"}])
    assert result is None and asked == [7]
    assert sent == [
        Query("advertise_worker", ADVERTISED),
        Query("worker_holding", {"id": "w1"}),
        Query("advertise_worker", {**ADVERTISED, "gone_pid": 7}),
    ]


@pytest.mark.parametrize(
    ("holder", "gone", "answers"),
    [
        ({"host": "h", "pid": 7, "seen_ago": 1.0}, False, 0),  # alive on this host
        ({"host": "x", "pid": 7, "seen_ago": 1.0}, True, 0),  # another host's
        ({"host": "h", "pid": 7, "seen_ago": 1.0}, True, 1),  # taken over by another
    ],
)
def test_advertise_refuses_an_id_a_live_worker_holds(
    holder: dict[str, Any], gone: bool, answers: int
) -> None:
    """ConfigurationError naming the holder."""
    with pytest.raises(
        ConfigurationError,
        match=r"^worker id 'w1' is in use by a live Worker \(host \w, pid 7, seen 1.0s ago\)",
    ):
        run(wops.advertise(WORKER, gone=lambda _: gone), [], [holder], *[[]] * answers)


def test_advertise_refuses_when_the_holder_is_gone_between() -> None:
    """No holder row (it stopped in between), still refused: the error's defaults."""
    with pytest.raises(ConfigurationError, match=r"\(host \?, pid 0, seen 0.0s ago\)"):
        run(wops.advertise(WORKER, gone=never), [], [])


def test_worker_stopped() -> None:
    op = wops.worker_stopped("w1")
    assert op.name == "worker_stopped"
    result, sent = run(op, [])
    assert result is None
    assert sent == [Query("worker_stopped", {"id": "w1"})]
