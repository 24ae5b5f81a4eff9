"""Why a Queued item waits (reads.waiting_reasons), each reason on its own."""

from __future__ import annotations

import attrs
import pytest

from trioworker._store.reads import WaitFacts, waiting_reasons

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
