"""The client operations (trioworker/_postgres/operations.py), run by a scripted driver:
what each sends, in what order, and what it makes of the rows it is sent back. No
database: the contract tests run the same operations on PostgreSQL."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest

from trioworker import (
    AttemptRecord,
    CancelOutcome,
    Enqueued,
    InvalidWorkItem,
    ItemDetails,
    ItemNotSucceeded,
    NewItem,
    Pause,
    QueueCounts,
    ScheduleState,
    Status,
    StepRecord,
    StoreError,
    UnknownItem,
)
from trioworker._core.jsontext import UndecodableValue
from trioworker._core.limits import Limit, LimitChange, Rate
from trioworker._core.model import ScopeHolder
from trioworker._postgres import operations
from trioworker._postgres.operations import Operation, Query, Rows
from trioworker._store.reads import (
    ALIVE_BEATS,
    ALIVE_WITHIN,
    Failure,
    Relative,
    RunningItem,
    WorkerState,
)

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
MIN = dt.datetime.min.replace(tzinfo=dt.UTC)

Answer = Rows | Callable[[Query], Rows]


def run(op: Operation[Any], *answers: Answer) -> tuple[Any, list[Query]]:
    """Run `op`, answering its queries with `answers` in turn; its result and what it
    sent. Every answer must be used."""
    steps = op.steps()
    sent: list[Query] = []
    given = list(answers)
    try:
        query = next(steps)
        while True:
            sent.append(query)
            assert given, f"no answer left for {query.name}"
            answer = given.pop(0)
            query = steps.send(answer(query) if callable(answer) else answer)
    except StopIteration as done:
        assert not given, f"{len(given)} answers left over"
        return done.value, sent


def enqueue_params(**changes: Any) -> dict[str, Any]:
    return {
        "kind": "A", "scope": None, "payload": "{}", "priority": 0, "dedup_key": None,
        "run_at": None, "delay": 0.0, "trace_context": None, "parents": None, **changes,
    }  # fmt: skip


# -- enqueue ---------------------------------------------------------------------------


def test_enqueue_sends_the_checked_request_and_returns_the_new_id() -> None:
    """One INSERT with every option as the table takes it; its row is the new item."""
    op = operations.enqueue(
        "A", scope="s", payload={"n": 1}, dedup_key="k", run_after=dt.timedelta(minutes=2),
        priority=7, trace_context={"traceparent": "00-x"},
    )  # fmt: skip
    assert op.name == "enqueue"
    result, sent = run(op, [{"id": 4}])
    assert result == Enqueued(id=4, deduplicated=False)
    expected = enqueue_params(
        scope="s", payload='{"n":1}', priority=7, dedup_key="k", delay=120.0,
        trace_context='{"traceparent":"00-x"}',
    )  # fmt: skip
    assert sent == [Query("enqueue", expected)]


def test_enqueue_at_a_time_sends_it_as_is() -> None:
    """An aware datetime is the due time itself, not a delay."""
    when = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    _, sent = run(operations.enqueue("A", run_after=when), [{"id": 1}])
    assert sent[0].params["run_at"] == when and sent[0].params["delay"] == 0.0


def test_enqueue_checks_its_input_before_anything_is_sent() -> None:
    """Bad input raises InvalidWorkItem when the operation is made; known kinds hold."""
    with pytest.raises(InvalidWorkItem, match="scope must not be empty"):
        operations.enqueue("A", scope=" ")
    with pytest.raises(InvalidWorkItem, match=r"unknown kind 'B' \(known kinds: A\)"):
        operations.enqueue("B", known_kinds=frozenset({"A"}))
    assert operations.enqueue("A", known_kinds=frozenset({"A"})).name == "enqueue"


def test_enqueue_after_checks_its_parents_exist_then_sends_them() -> None:
    """With parents: the unknown ones are looked for first; none unknown, the insert
    carries them ascending and each once."""
    result, sent = run(operations.enqueue("A", after=[9, 3, 9]), [], [{"id": 10}])
    assert result == Enqueued(id=10, deduplicated=False)
    assert sent == [
        Query("unknown_items", {"ids": [3, 9]}),
        Query("enqueue", enqueue_params(parents=[3, 9])),
    ]


def test_enqueue_after_unknown_items_writes_nothing() -> None:
    """Unknown parents raise InvalidWorkItem naming them; no insert is sent."""
    with pytest.raises(InvalidWorkItem, match=r"^after names items that do not exist: 3, 9$"):
        run(operations.enqueue("A", after=[9, 3, 5]), [{"id": 3}, {"id": 9}])


def test_enqueue_many_names_the_first_item_whose_parent_is_unknown() -> None:
    """One lookup for every item's parents; the first item naming an unknown one is
    named, with its own unknown ids; the batch is not inserted."""
    items = [NewItem("A", after=[1]), NewItem("A"), NewItem("A", after=[2, 7, 8])]
    with pytest.raises(
        InvalidWorkItem, match=r"^item 2: after names items that do not exist: 7, 8$"
    ) as unknown:
        run(operations.enqueue_many(items), [{"id": 7}, {"id": 8}])
    assert unknown.value.index == 2
    _, sent = run(operations.enqueue_many(items), [], [{"id": 4, "dedup_key": None}] * 3)
    assert sent[0] == Query("unknown_items", {"ids": [1, 2, 7, 8]})
    assert sent[1].params["parent_lists"] == ["{1}", None, "{2,7,8}"]


def test_a_taken_dedup_key_returns_the_queued_holder() -> None:
    """No row inserted: the Queued item holding the key is the result, deduplicated."""
    result, sent = run(operations.enqueue("A", dedup_key="k"), [], [{"id": 9}])
    assert result == Enqueued(id=9, deduplicated=True)
    params = enqueue_params(dedup_key="k")
    assert sent == [Query("enqueue", params), Query("queued_with_dedup_key", params)]


def test_a_dedup_key_claimed_in_between_is_inserted_next_round() -> None:
    """Taken, but its holder was claimed before the lookup: the insert goes through."""
    result, sent = run(operations.enqueue("A", dedup_key="k"), [], [], [{"id": 3}])
    assert result == Enqueued(id=3, deduplicated=False)
    assert [q.name for q in sent] == ["enqueue", "queued_with_dedup_key", "enqueue"]


def test_a_dedup_key_that_keeps_changing_hands_gives_up_after_five_rounds() -> None:
    """Each round an insert and a lookup; after ENQUEUE_ROUNDS of them, a StoreError."""
    steps = operations.enqueue("A", dedup_key="k").steps()
    names = [next(steps).name]
    with pytest.raises(StoreError, match=r"^enqueue: the dedup key kept changing hands; try"):
        while True:
            names.append(steps.send([]).name)
    assert names == ["enqueue", "queued_with_dedup_key"] * operations.ENQUEUE_ROUNDS
    assert operations.ENQUEUE_ROUNDS == 5


# -- enqueue_many ----------------------------------------------------------------------


def test_enqueue_many_of_nothing_sends_nothing() -> None:
    op = operations.enqueue_many([])
    assert op.name == "enqueue_many"
    assert run(op) == ([], [])


def test_enqueue_many_sends_one_statement_of_columns() -> None:
    """Every item checked, sent as one array per column, results in order."""
    items = [NewItem("A", scope="s", payload=[1], priority=2), NewItem("B", dedup_key="k")]
    result, sent = run(
        operations.enqueue_many(items), [{"id": 1, "dedup_key": None}, {"id": 2, "dedup_key": "k"}]
    )
    assert result == [Enqueued(1, False), Enqueued(2, False)]
    assert sent == [
        Query(
            "enqueue_many",
            {
                "kinds": ["A", "B"], "scopes": ["s", None], "payloads": ["[1]", "{}"],
                "priorities": [2, 0], "dedup_keys": [None, "k"], "run_ats": [None, None],
                "delays": [0.0, 0.0], "trace_contexts": [None, None],
                "parent_lists": [None, None],
            },
        )
    ]  # fmt: skip


def test_enqueue_many_at_a_time_sends_it_as_is() -> None:
    """An aware datetime is checked against now and sent as the due time."""
    when = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    _, sent = run(
        operations.enqueue_many([NewItem("A", run_after=when)]), [{"id": 1, "dedup_key": None}]
    )
    assert sent[0].params["run_ats"] == [when] and sent[0].params["delays"] == [0.0]
    with pytest.raises(InvalidWorkItem, match=r"item 0: run_after .* is further than 366 days"):
        operations.enqueue_many([NewItem("A", run_after=when + dt.timedelta(days=400))])


def test_enqueue_many_looks_up_only_the_keys_it_could_not_insert() -> None:
    """An item inserted with its key is not looked up; one whose key is held is."""
    items = [NewItem("A", dedup_key="new"), NewItem("A", dedup_key="held")]
    result, sent = run(
        operations.enqueue_many(items),
        [{"id": 1, "dedup_key": "new"}],
        [{"id": 7, "dedup_key": "held"}],
    )
    assert result == [Enqueued(1, False), Enqueued(7, True)]
    assert sent[1] == Query("queued_with_dedup_keys", {"dedup_keys": ["held"]})


def test_enqueue_many_checks_every_item_first() -> None:
    with pytest.raises(InvalidWorkItem, match="item 1: unknown kind 'C'"):
        operations.enqueue_many([NewItem("A"), NewItem("C")], known_kinds={"A"})


def test_enqueue_many_merges_onto_holders_and_inserts_those_claimed_in_between() -> None:
    """Keys a Queued item holds are looked up once, sorted; one whose holder was claimed
    meanwhile is inserted on its own, and a later item of the batch with it merges."""
    items = [NewItem("A", dedup_key="held"), NewItem("A", dedup_key="gone"),
             NewItem("A", dedup_key="gone"), NewItem("A")]  # fmt: skip
    result, sent = run(
        operations.enqueue_many(items),
        [{"id": 10, "dedup_key": None}],
        [{"id": 5, "dedup_key": "held"}],
        [{"id": 11}],
    )
    assert result == [Enqueued(5, True), Enqueued(11, False), Enqueued(11, True),
                      Enqueued(10, False)]  # fmt: skip
    assert sent[1] == Query("queued_with_dedup_keys", {"dedup_keys": ["gone", "held"]})
    assert sent[2] == Query("enqueue", enqueue_params(dedup_key="gone"))
    assert len(sent) == 3


def test_match_inserted_pairs_rows_with_the_batch() -> None:
    """Inserted rows in order; a repeated key merges onto the batch's first; a key the
    INSERT skipped is left for the lookup."""
    keys = ["a", None, "a", "b", None]
    pairs = operations.match_inserted(keys, [(1, "a"), (2, None), (3, None)])
    assert pairs == [
        ("a", Enqueued(1, False)), (None, Enqueued(2, False)), ("a", Enqueued(1, True)),
        ("b", None), (None, Enqueued(3, False)),
    ]  # fmt: skip


def test_match_inserted_refuses_rows_it_cannot_pair() -> None:
    with pytest.raises(StoreError, match=r"^enqueue_many: the inserted rows came back out of"):
        operations.match_inserted([None], [(1, "a")])
    with pytest.raises(StoreError, match=r"^enqueue_many: the inserted rows came back out of"):
        operations.match_inserted([None], [])
    with pytest.raises(StoreError, match=r"^enqueue_many: more rows came back than were asked"):
        operations.match_inserted(["a"], [(1, "a"), (2, "b")])


# -- cancel, retry, pause --------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "found", "outcome"),
    [
        ("Cancelled", None, CancelOutcome.CANCELLED),
        ("Running", None, CancelOutcome.REQUESTED),
        (None, [{"status": "Succeeded"}], CancelOutcome.ALREADY_FINISHED),
        (None, [], CancelOutcome.NOT_FOUND),
    ],
)
def test_cancel_outcomes(status: str | None, found: Rows | None, outcome: CancelOutcome) -> None:
    """What request_cancel returned says it; only when it changed nothing is the item
    looked up, to tell finished from missing."""
    op = operations.cancel(7)
    assert op.name == "cancel"
    answers: list[Answer] = [[{"status": status}]] + ([] if found is None else [found])
    result, sent = run(op, *answers)
    assert result is outcome
    assert sent[0] == Query("request_cancel", {"id": 7})
    assert sent[1:] == ([] if found is None else [Query("status_of", {"id": 7})])


def test_retry_sends_each_id_once_in_order_in_one_statement_that_marks_them() -> None:
    op = operations.retry([3, 1, 3])
    assert op.name == "retry" and not op.atomic
    result, sent = run(op, [{"id": 1}])
    assert result == [1]
    assert sent == [Query("retry_items", {"ids": [1, 3]})]


def test_only_an_operation_of_several_writes_asks_for_a_transaction() -> None:
    assert not operations.cancel(1).atomic
    assert not operations.enqueue("A").atomic


def test_failed_items_since_the_beginning_by_default() -> None:
    op = operations.failed_items()
    assert op.name == "failed_items"
    result, sent = run(op, [{"id": 2}, {"id": 5}])
    assert result == [2, 5]
    assert sent == [Query("failed_items", {"kind": None, "since": MIN})]
    _, sent = run(operations.failed_items(kind="A", since=T0), [])
    assert sent == [Query("failed_items", {"kind": "A", "since": T0})]


@pytest.mark.parametrize("verb", ["pause", "resume"])
def test_pause_and_resume_take_a_kind_or_a_scope(verb: str) -> None:
    make = getattr(operations, verb)
    op = make(kind="A")
    assert op.name == verb
    assert run(op, [{"changed": True}]) == (True, [Query(verb, {"kind": "A", "scope": None})])
    op = make(scope="s")
    assert run(op, [{"changed": False}]) == (False, [Query(verb, {"kind": None, "scope": "s"})])
    with pytest.raises(InvalidWorkItem, match="give exactly one"):
        make()


def test_pauses_are_read_as_they_come() -> None:
    op = operations.pauses()
    assert op.name == "pauses"
    result, sent = run(op, [{"kind": "A", "scope": None, "paused_at": T0}])
    assert result == [Pause("A", None, T0)] and sent == [Query("pauses", {})]


# -- reads -----------------------------------------------------------------------------

ROW = {
    "id": 1, "kind": "A", "scope": None, "payload": '{"n": 1}', "priority": 0,
    "status": "Queued", "attempt": 0, "stalls": 0, "failures": 0, "worker_id": None,
    "requested_at": T0, "run_after": T0, "started_at": None, "finished_at": None,
    "heartbeat_at": None, "lease_expires_at": None, "dedup_key": None,
    "cancel_requested": False, "reason": None, "error": None, "traceback": None,
    "trace_context": '{"traceparent": "00-x"}',
}  # fmt: skip
ATTEMPT = {"attempt": 1, "worker_id": "w", "started_at": T0, "ended_at": T0,
           "outcome": "failed", "error": "E", "traceback": "tb"}  # fmt: skip


def test_get_item_decodes_its_row() -> None:
    """get_item reads its row as stored (a time Python cannot hold stands as an
    UndecodableValue) and decodes its payload and trace context."""
    op = operations.get_item(1)
    assert op.name == "get_item"
    item, sent = run(op, [ROW])
    assert sent == [Query("get_item", {"id": 1}, as_stored=True)]
    assert item.status is Status.QUEUED and item.payload == {"n": 1}
    assert item.trace_context == {"traceparent": "00-x"}
    assert run(operations.get_item(2), [])[0] is None


def test_a_row_python_cannot_decode_is_marked_not_lost() -> None:
    """A payload Python cannot decode is an UndecodableValue; such a trace context is
    dropped; a missing one stays None."""
    row = operations.decoded({**ROW, "payload": "[" * 100_000, "trace_context": "{" * 100_000})
    assert isinstance(row["payload"], UndecodableValue) and row["trace_context"] is None
    assert operations.decoded({**ROW, "trace_context": None})["trace_context"] is None


CLAIMED = {
    "id": 7, "kind": "A", "scope": "s", "payload": '{"n": 1}', "priority": 0, "attempt": 1,
    "stalls": 0, "failures": 0, "requested_at": T0, "dedup_key": None,
    "trace_context": None,
}  # fmt: skip
INFINITY = UndecodableValue("cannot be decoded: timestamp too large (after year 10K)", "infinity")


def test_a_claimed_row_is_decoded_on_its_own() -> None:
    """A claimed row whose time psycopg could not load (read as stored) is a WorkItem
    all the same: the column named in `undecodable` with why, its field None, the rest
    decoded; an undecodable payload stays in `payload`, as before; a row with neither
    has nothing in `undecodable`."""
    item = operations.claimed_item({**CLAIMED, "requested_at": INFINITY})
    assert item.undecodable == (("requested_at", INFINITY.reason),)
    assert (item.id, item.attempt, item.requested_at, item.payload) == (7, 1, None, {"n": 1})
    poisoned = operations.claimed_item({**CLAIMED, "payload": "[" * 100_000})
    assert isinstance(poisoned.payload, UndecodableValue) and poisoned.undecodable == ()
    plain = operations.claimed_item(CLAIMED)
    assert (plain.requested_at, plain.undecodable) == (T0, ())


def test_attempts_and_show() -> None:
    """show: the item, then its attempts, both read as stored; no item, no second
    query."""
    op = operations.attempts(1)
    assert op.name == "attempts"
    assert run(op, [ATTEMPT]) == (
        [AttemptRecord(**ATTEMPT)],
        [Query("attempts", {"id": 1}, as_stored=True)],
    )
    op = operations.show(1)
    assert op.name == "show"
    step = {"name": "scan /a", "attempt": 1, "recorded_at": T0, "result": '["x.jpg"]'}
    running = {**ROW, "status": "Running", "result": '{"n": 2}'}
    details, sent = run(op, [running], [ATTEMPT], [step], [])
    assert isinstance(details, ItemDetails) and details.item.id == 1
    assert details.item.result == {"n": 2}
    assert details.attempts == [AttemptRecord(**ATTEMPT)]
    assert details.steps == [StepRecord("scan /a", 1, T0, ["x.jpg"])]
    assert details.waiting == []  # only a Queued or Waiting item is asked why it waits
    assert (details.parents, details.children) == ([], [])
    assert sent == [
        Query("get_item", {"id": 1}, as_stored=True),
        Query("attempts", {"id": 1}, as_stored=True),
        Query("steps", {"id": 1}, as_stored=True),
        Query("family", {"id": 1}),
    ]
    assert run(operations.show(2), []) == (None, [Query("get_item", {"id": 2}, as_stored=True)])


def test_show_says_why_a_queued_item_waits() -> None:
    """A Queued item: its wait facts are read (with the Workers' liveness bounds) and
    worded; none come back (deleted in between): no reasons."""
    queued = {**ROW, "status": "Queued", "kind": "K", "scope": "S"}
    facts = {
        "due_in": -1.0, "kind_paused": True, "scope_paused": False, "served": True,
        "scope_running": 1, "scope_limit": 1, "kind_running": 1, "kind_limit": None,
        "rate_spent": False, "ahead": 0,
    }  # fmt: skip
    details, sent = run(operations.show(1), [queued], [], [], [facts], [])
    assert details is not None
    assert list(details.waiting) == ["kind K is paused", "scope S is full: 1 of 1 Running"]
    assert sent[-2] == Query(
        "wait_facts", {"id": 1, "alive_beats": ALIVE_BEATS, "alive_within": ALIVE_WITHIN}
    )
    details, _ = run(operations.show(1), [queued], [], [], [], [])
    assert details is not None and list(details.waiting) == []


def test_show_lists_the_family_and_which_parents_a_waiting_item_waits_for() -> None:
    """An item's parents and children come from one `family` read, by relation; a
    Waiting item is not asked the wait facts: its parents not Succeeded say why."""
    waiting = {**ROW, "id": 5, "status": "Waiting"}
    family = [
        {"relation": "parent", "id": 2, "kind": "Thumb", "status": "Succeeded"},
        {"relation": "parent", "id": 3, "kind": "Thumb", "status": "Running"},
        {"relation": "child", "id": 8, "kind": "Zip", "status": "Waiting"},
    ]
    details, sent = run(operations.show(5), [waiting], [], [], family)
    assert details.parents == [
        Relative(2, "Thumb", Status.SUCCEEDED),
        Relative(3, "Thumb", Status.RUNNING),
    ]
    assert details.children == [Relative(8, "Zip", Status.WAITING)]
    assert details.waiting == ["for parent 3 (Thumb, Running)"]
    assert [q.name for q in sent] == ["get_item", "attempts", "steps", "family"]


def test_result_state() -> None:
    """Waiting for a result reads the item's status: not ended yet, its result once
    Succeeded, ItemNotSucceeded naming the status and error otherwise, UnknownItem for
    no item."""
    assert operations.result_state(7).name == "result_state"
    sent = [Query("result_state", {"id": 7})]
    row = {"status": "Running", "reason": None, "error": None, "result": None}
    assert run(operations.result_state(7), [row]) == ((False, None), sent)
    done = {**row, "status": "Succeeded", "result": '{"a": [1]}'}
    assert run(operations.result_state(7), [done]) == ((True, {"a": [1]}), sent)
    failed = {**row, "status": "Failed", "reason": "failed 5 of 5 attempts", "error": "E: x"}
    with pytest.raises(ItemNotSucceeded, match="item 7 ended Failed: failed 5 of 5 attempts; E: x"):
        run(operations.result_state(7), [failed])
    with pytest.raises(ItemNotSucceeded, match="Cancelled") as raised:
        run(operations.result_state(7), [{**row, "status": "Cancelled"}])
    assert (raised.value.status, raised.value.error) == ("Cancelled", None)
    with pytest.raises(UnknownItem, match="no item 7"):
        run(operations.result_state(7), [])


COUNTS = [{"kind": "A", "status": "Queued", "n": 2}]
SCHEDULE = {"name": "s", "kind": "A", "scope": None, "spec": "every 60",
            "next_due": T0, "last_due": None, "last_item": None}  # fmt: skip


def test_queue_counts() -> None:
    op = operations.queue_counts()
    assert op.name == "queue_counts"
    counts, sent = run(op, COUNTS, [{"n": 3}])
    assert counts == QueueCounts({"A": {s.value: 2 * (s is Status.QUEUED) for s in Status}}, 3)
    assert sent == [Query("counts_by_kind_and_status", {}), Query("busy_scopes", {})]


def test_schedules() -> None:
    op = operations.schedules()
    assert op.name == "schedules"
    assert run(op, [SCHEDULE]) == ([ScheduleState(**SCHEDULE)], [Query("schedules", {})])


def test_status_reads_each_part_from_its_own_query() -> None:
    worker = {"id": "w", "host": "h", "pid": 1, "started_at": T0, "last_seen": T0,
              "stopped_at": None, "kinds": ["A"], "scopes": ["s"], "unscoped": False,
              "concurrency": 2, "alive": True}  # fmt: skip
    every = {**worker, "id": "v", "scopes": None}
    failure = {"id": 3, "kind": "A", "scope": None, "attempt": 1, "finished_at": T0,
               "reason": "r", "error": "e"}  # fmt: skip
    running = {"id": 4, "kind": "A", "scope": "s", "attempt": 1, "worker_id": "w",
               "started_at": T0, "lease_left": 5.0}  # fmt: skip
    pause = {"kind": None, "scope": "s", "paused_at": T0}
    limit = {"kind": "A", "scope": None, "running": 8, "rate": 10, "per": 1.0,
             "updated_at": T0, "in_use": 3, "started_in_window": 2, "waiting": 5}  # fmt: skip
    unlimited = {**limit, "kind": None, "scope": "s", "rate": None, "per": None}
    op = operations.status(failures=3)
    assert op.name == "status"
    status, sent = run(
        op, [worker, every], [failure], [{"kind": "B", "n": 2}], COUNTS, [{"n": 1}], [running],
        [SCHEDULE], [pause], [limit, unlimited],
    )  # fmt: skip
    alive = {"alive_beats": ALIVE_BEATS, "alive_within": ALIVE_WITHIN}
    assert sent == [
        Query("workers", alive), Query("recent_failures", {"limit": 3}),
        Query("unserved_kinds", alive), Query("counts_by_kind_and_status", {}),
        Query("busy_scopes", {}), Query("running_items", {}), Query("schedules", {}),
        Query("pauses", {}), Query("limits", {}),
    ]  # fmt: skip
    assert status.workers == [
        WorkerState(**{**worker, "kinds": ("A",), "scopes": ("s",)}),
        WorkerState(**{**every, "kinds": ("A",), "scopes": None}),
    ]
    assert status.recent_failures == [Failure(**failure)]
    assert status.unserved_kinds == {"B": 2}
    assert status.counts.busy_scopes == 1 and status.counts.by_kind["A"]["Queued"] == 2
    assert status.running == [RunningItem(**running)]
    assert status.schedules == [ScheduleState(**SCHEDULE)]
    assert status.pauses == [Pause(None, "s", T0)]
    assert status.limits == [
        Limit("A", None, 8, Rate(10, 1.0), T0, in_use=3, started_in_window=2, waiting=5),
        Limit(None, "s", 8, None, T0, in_use=3, started_in_window=2, waiting=5),
    ]
    _, sent = run(operations.status(), [], [], [], [], [{"n": 0}], [], [], [], [])
    assert sent[1] == Query("recent_failures", {"limit": 10})


def test_scope_holder() -> None:
    """The scope's Running item, or None, and whether a head is left."""
    op = operations.scope_holder("s")
    assert op.name == "scope_holder"
    held = {"id": 4, "attempt": 1, "kind": "A", "worker_id": "w", "cancel_requested": False,
            "lease_left": 5.0, "heads": 0}  # fmt: skip
    result, sent = run(op, [held])
    assert sent == [Query("scope_holder", {"scope": "s"})]
    assert result == (ScopeHolder(4, 1, "A", "w", False, 5.0), False)
    free = dict.fromkeys(held, None) | {"heads": 1}
    assert run(operations.scope_holder("s"), [free])[0] == (None, True)


@pytest.mark.parametrize(
    ("row", "before"),
    [
        ({"running": None, "rate": None, "per": None, "written": True}, None),
        ({"running": 5, "rate": None, "per": None, "written": True}, (5, None)),
        ({"running": None, "rate": 10, "per": 60.0, "written": True}, (None, Rate(10, 60.0))),
        ({"running": 2, "rate": 3, "per": 1.0, "written": False}, (2, Rate(3, 1.0))),
    ],
)
def test_a_declare_limit_row_says_what_the_kind_had_and_whether_it_was_written(
    row: dict[str, Any], before: tuple[int | None, Rate | None] | None
) -> None:
    declared = LimitChange("K", None, 2, None)
    done = operations.declared_of(declared, row)
    assert (done.declared, done.before, done.written) == (declared, before, row["written"])
