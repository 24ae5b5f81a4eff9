"""Why a Queued item waits (reads.waiting_reasons), each reason on its own, and which
parents a Waiting one waits for (reads.parents_waited_for)."""

from __future__ import annotations

import attrs
import pytest

from trioworker._core.model import Status
from trioworker._store.reads import (
    NAMED_PARENTS,
    Relative,
    WaitFacts,
    parents_waited_for,
    waiting_reasons,
)

FREE = WaitFacts(
    due_in=-1.0,
    kind_paused=False,
    scope_paused=False,
    served=True,
    scope_running=0,
    scope_limit=1,
    kind_running=0,
    kind_limit=None,
    rate_spent=False,
    ahead=0,
)
NOTHING = "nothing holds it back: a Worker should take it within its poll"


def test_nothing_holding_it_back_is_said_as_such() -> None:
    assert waiting_reasons(FREE, "K", "S") == [
        "nothing holds it back: a Worker should take it within its poll"
    ]
    assert waiting_reasons(attrs.evolve(FREE, due_in=0.0), "K", None) == [
        "nothing holds it back: a Worker should take it within its poll"
    ]


@pytest.mark.parametrize(
    ("change", "scope", "reason"),
    [
        ({"due_in": 90.4}, "S", "not due for another 90s (its run_after)"),
        ({"due_in": float("inf")}, "S", "never due: its run_after is infinity"),
        ({"due_in": float("-inf")}, "S", NOTHING),
        ({"kind_paused": True}, "S", "kind K is paused"),
        ({"scope_paused": True}, "S", "scope S is paused"),
        ({"served": False}, "S", "no live Worker serves kind K in scope S"),
        ({"served": False}, None, "no live Worker serves kind K"),
        ({"scope_running": 2, "scope_limit": 2}, "S", "scope S is full: 2 of 2 Running"),
        ({"kind_running": 4, "kind_limit": 4}, None, "kind K is full: 4 of 4 Running"),
        ({"rate_spent": True}, "S", "a rate of its kind or scope has no start left in its window"),
        ({"ahead": 3}, "S", "3 due item(s) of scope S come before it"),
    ],
)
def test_each_reason(change: dict[str, object], scope: str | None, reason: str) -> None:
    assert waiting_reasons(attrs.evolve(FREE, **change), "K", scope) == [reason]


@pytest.mark.parametrize(
    ("change", "scope"),
    [
        ({"scope_running": 1, "scope_limit": 2}, "S"),  # room left
        ({"scope_running": 5, "scope_limit": 1}, None),  # unscoped: no scope to be full
        ({"kind_running": 3, "kind_limit": 4}, None),
        ({"kind_running": 9, "kind_limit": None}, None),
    ],
)
def test_room_left_is_no_reason(change: dict[str, object], scope: str | None) -> None:
    assert waiting_reasons(attrs.evolve(FREE, **change), "K", scope) == [
        "nothing holds it back: a Worker should take it within its poll"
    ]


def test_every_reason_that_holds_is_given_in_order() -> None:
    facts = attrs.evolve(
        FREE, due_in=5.0, kind_paused=True, scope_paused=True, served=False, scope_running=1,
        kind_running=2, kind_limit=2, rate_spent=True, ahead=1,
    )  # fmt: skip
    assert [r.split(" ")[0:2] for r in waiting_reasons(facts, "K", "S")] == [
        ["not", "due"], ["kind", "K"], ["scope", "S"], ["no", "live"], ["scope", "S"],
        ["kind", "K"], ["a", "rate"], ["1", "due"],
    ]  # fmt: skip


def parent(id: int, status: Status, kind: str = "Thumb") -> Relative:
    return Relative(id, kind, status)


def test_a_waiting_item_waits_for_the_parents_that_have_not_succeeded() -> None:
    """Its parents that have not Succeeded, by id, each with its kind and status, on
    one line; those that have are not named."""
    parents = [
        parent(12, Status.RUNNING),
        parent(13, Status.SUCCEEDED),
        parent(14, Status.QUEUED, "Resize"),
        parent(15, Status.WAITING),
    ]
    assert parents_waited_for(parents) == [
        "for parent 12 (Thumb, Running), parent 14 (Resize, Queued), parent 15 (Thumb, Waiting)"
    ]


def test_past_ten_parents_the_rest_are_counted() -> None:
    """At most NAMED_PARENTS are named; the others not Succeeded are counted."""
    parents = [parent(id, Status.QUEUED) for id in range(1, 13)] + [parent(13, Status.SUCCEEDED)]
    (line,) = parents_waited_for(parents)
    assert NAMED_PARENTS == 10
    assert line == (
        "for " + ", ".join(f"parent {id} (Thumb, Queued)" for id in range(1, 11)) + " and 2 more"
    )
    exactly = parents_waited_for(parents[:10])
    assert exactly == ["for " + ", ".join(f"parent {id} (Thumb, Queued)" for id in range(1, 11))]


@pytest.mark.parametrize("ended", [Status.FAILED, Status.CANCELLED])
def test_a_parent_that_ended_otherwise_is_named_first(ended: Status) -> None:
    """A parent Failed or Cancelled (a settle another transaction held off): it is
    named, the first such by id, as what a Worker's settle pass cancels the item for."""
    parents = [parent(3, Status.RUNNING), parent(4, ended), parent(5, Status.FAILED)]
    assert parents_waited_for(parents) == [
        f"parent 4 (Thumb, {ended.value}) will not succeed: a Worker's next settle pass cancels it"
    ]


def test_every_parent_succeeded_or_none_known() -> None:
    """Every parent Succeeded (a settle another transaction held off): a Worker's pass
    queues it. No parents at all: nothing to say."""
    assert parents_waited_for([parent(1, Status.SUCCEEDED), parent(2, Status.SUCCEEDED)]) == [
        "every parent has Succeeded: a Worker's next settle pass queues it"
    ]
    assert parents_waited_for([]) == []
