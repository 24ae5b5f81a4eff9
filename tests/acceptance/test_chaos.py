"""Chaos: many Worker processes, real faults, judged by an observer log outside the
database (see tests/support/chaos.py and docs/reliability.md).

The rule-on run must come out clean; the same harness with the rule switched off must
find overlaps, or a clean rule-on run would prove nothing. The soak is the rule-on run
for longer: `./dev test tests/acceptance/test_chaos.py --soak -k soak -s`, for
$TRIOWORKER_SOAK_SECONDS (default 600) of load and faults.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import attrs
import pytest

from tests.support.chaos import Counts, Scenario, run_chaos

RULE_ON = Scenario()

RULE_OFF = attrs.evolve(
    RULE_ON,
    rule_off=True,
    record_items=600,
    feed_seconds=20.0,
    faults=((5, "kill"), (8, "blackhole"), (20, "restart")),
)


def soak(seconds: float, seed: int = 7) -> Scenario:
    """The rule-on run for `seconds`: the same rate of items, a fault every 8-20 s."""
    rng = random.Random(seed)
    faults = []
    at = 10.0
    while at < seconds - 5:
        faults.append((at, rng.choice(["kill", "kill", "kill2", "blackhole", "restart"])))
        at += rng.uniform(8, 20)
    return attrs.evolve(
        RULE_ON,
        record_items=int(RULE_ON.record_items * seconds / RULE_ON.feed_seconds),
        feed_seconds=seconds,
        faults=tuple(faults),
        drain_timeout=600.0,
        seed=seed,
    )


def report(capsys: pytest.CaptureFixture[str], counts: Counts, label: str) -> None:
    with capsys.disabled():
        print("\n" + counts.line(label))


def assert_clean(counts: Counts, scenario: Scenario) -> None:
    """Every check of the issue, on the counts of a rule-on run."""
    # The run was what it claims: enough processes, scopes, items and faults.
    assert counts.workers >= 4 and counts.scopes >= 20
    assert counts.record_items >= 2000
    planned = [what for _, what in scenario.faults]
    assert counts.kills == planned.count("kill") + 2 * planned.count("kill2")
    assert counts.blackholes == planned.count("blackhole") >= 1
    assert counts.restarts == planned.count("restart") >= 1
    assert counts.cut_off_items >= 1  # a blackhole caught handlers mid-way
    assert counts.self_stops >= 1 and counts.stalls >= 1
    # No Worker died but by our hand; none had to fail-stop.
    assert counts.unexpected_exits == [] and counts.fail_stops == 0
    # Every item terminal, none lost: Succeeded, or Failed with its stated reason, and
    # only the ones doomed on purpose Failed (so none for a self-stop or for stalls).
    assert counts.missing_items == 0
    assert set(counts.statuses) <= {"Succeeded", "Failed"}, counts.statuses
    assert counts.failed_reasons == {"handler said not to retry": scenario.doomed}
    assert counts.max_stalls_seen < scenario.max_stalls
    # Each success is an attempt the observer saw end.
    assert counts.succeeded_without_end == 0
    # The rule: no two attempts of one scope at once.
    assert counts.overlaps == 0, counts.overlap_examples
    # The media scenario: no active asset without its proxies.
    assert counts.media_cycles >= 20 and counts.active_assets > 0
    assert counts.assets_missing_proxies == 0


def test_chaos_with_the_rule_no_scope_ever_runs_twice_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """5 Worker processes, 28 scopes plus unscoped items, 2,000+ Record items and the
    media scenario, under SIGKILLs, blackholes and database restarts: no overlap in the
    observer log, every item terminal, only the doomed ones Failed, no active asset
    without its proxies."""
    counts = run_chaos(RULE_ON, tmp_path)
    report(capsys, counts, "chaos, rule on")
    assert_clean(counts, RULE_ON)


def test_chaos_without_the_rule_the_checks_find_overlaps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same harness with the rule off (the claim ignores scopes, the unique index
    dropped): the observer log shows attempts of one scope overlapping."""
    counts = run_chaos(RULE_OFF, tmp_path)
    report(capsys, counts, "chaos, rule OFF")
    assert counts.overlaps > 0
    assert counts.unexpected_exits == []


#: Two at a time per Record scope: a shorter run, its faults the rule-on run's first ones.
TWO_PER_SCOPE = attrs.evolve(
    RULE_ON,
    scope_limit=2,
    record_items=1200,
    feed_seconds=30.0,
    faults=((6, "kill"), (12, "blackhole"), (20, "restart"), (26, "kill")),
)


def test_chaos_with_two_per_scope_never_more_than_two_of_a_scope_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Record scopes at limit 2 (the media scopes at the default 1), under SIGKILLs,
    a blackhole and a database restart: the observer never sees more than two attempts
    of a Record scope open at once, nor two of a media scope, and it does see two (the
    limit was used); every item terminal, only the doomed Failed, nothing lost."""
    counts = run_chaos(TWO_PER_SCOPE, tmp_path)
    report(capsys, counts, "chaos, two per scope")
    record = {s: n for s, n in counts.most_at_once.items() if s.startswith("s")}
    media_scopes = {s: n for s, n in counts.most_at_once.items() if s.startswith("m")}
    assert max(record.values()) == 2, record
    assert max(media_scopes.values(), default=1) == 1, media_scopes
    assert counts.missing_items == 0 and counts.unexpected_exits == []
    assert set(counts.statuses) <= {"Succeeded", "Failed"}, counts.statuses
    assert counts.failed_reasons == {"handler said not to retry": TWO_PER_SCOPE.doomed}
    assert counts.succeeded_without_end == 0
    assert counts.blackholes == 1 and counts.restarts == 1
    assert counts.assets_missing_proxies == 0


def test_most_at_once_counts_open_attempts_per_scope() -> None:
    """The chaos judge's count: three attempts of one scope where two meet, and one
    left open, give 2 and (with the open one) 3."""
    from examples.media import Span
    from tests.support.chaos import most_at_once

    def span(id: int, start: float, end: float | None, scope: str = "a") -> Span:
        return Span(id, 1, "K", scope, "w", 1, start, end)

    assert most_at_once([span(1, 0, 2), span(2, 1, 3), span(3, 3.5, 4)]) == {"a": 2}
    assert most_at_once([span(1, 0, 2), span(2, 1, 3), span(3, 1.5, None)]) == {"a": 3}
    assert most_at_once([span(1, 0, 2), span(2, 1, 3), span(3, 2.5, None)]) == {"a": 2}
    assert most_at_once([span(1, 0, 1), span(2, 1, 2, "b")]) == {"a": 1, "b": 1}


@pytest.mark.slow
def test_soak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The rule-on run for $TRIOWORKER_SOAK_SECONDS (600) of load and faults."""
    scenario = soak(float(os.environ.get("TRIOWORKER_SOAK_SECONDS", "600")))
    counts = run_chaos(scenario, tmp_path)
    report(capsys, counts, f"soak, {scenario.feed_seconds:.0f}s")
    assert_clean(counts, scenario)
