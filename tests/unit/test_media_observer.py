"""The observer log's reading: attempts, deaths and overlaps."""

from __future__ import annotations

import json
from pathlib import Path

from examples.media import Span, overlaps, read_spans


def span(id: int, start: float, end: float | None, scope: str | None = "c") -> Span:
    return Span(
        id=id, attempt=1, kind="Crawl", scope=scope, worker="w", pid=1, start=start, end=end
    )


def test_back_to_back_attempts_do_not_overlap() -> None:
    """One attempt ending as the next one starts is not an overlap."""
    assert overlaps([span(1, 0, 1), span(2, 1, 2), span(3, 2.5, 3)]) == []


def test_a_long_attempt_overlaps_a_later_one_past_a_short_one() -> None:
    """[0, 10] overlaps [3, 4] even with [1, 2] between them."""
    found = overlaps([span(1, 0, 10), span(2, 1, 2), span(3, 3, 4)])
    assert [(a.id, b.id) for a, b in found] == [(1, 2), (1, 3)]


def test_an_attempt_without_an_end_lasts_forever_and_scopes_are_apart() -> None:
    """An open attempt overlaps every later one of its scope, none of other scopes or
    unscoped ones."""
    spans = [span(1, 0, None), span(2, 5, 6), span(3, 5, 6, "d"), span(4, 5, 6, None)]
    assert [(a.id, b.id) for a, b in overlaps(spans)] == [(1, 2)]


def test_read_spans_ends_an_attempt_when_its_process_died(tmp_path: Path) -> None:
    """A start with no end ends at its process's death, when known."""
    log = tmp_path / "observer.jsonl"
    lines = [
        {"event": "start", "id": 1, "attempt": 1, "scope": "c", "pid": 7, "t": 1.0},
        {"event": "end", "id": 1, "attempt": 1, "scope": "c", "pid": 7, "t": 2.0},
        {"event": "start", "id": 2, "attempt": 1, "scope": "c", "pid": 7, "t": 3.0},
        {"event": "start", "id": 3, "attempt": 1, "scope": "c", "pid": 8, "t": 3.5},
    ]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    spans = {s.id: s for s in read_spans(log, {7: 4.0})}
    assert (spans[1].end, spans[2].end, spans[3].end) == (2.0, 4.0, None)
