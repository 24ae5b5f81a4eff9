"""Dependencies (issue 34) on the command line: `enqueue --after`, `enqueue --from` lines
with "after", and what `show` and `status` say of Waiting items."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.test_cli import trioworker

Conn = psycopg.Connection[Any]


def one(pg: Conn, sql: str, params: Any = None) -> Any:
    row = pg.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def queued(pg: Conn, kind: str = "Thumb") -> int:
    return int(one(pg, "INSERT INTO work_items (kind) VALUES (%s) RETURNING id", [kind]))


def running(pg: Conn, kind: str = "Thumb") -> int:
    return int(
        one(
            pg,
            "INSERT INTO work_items (kind, status, attempt, worker_id, started_at,"
            " lease_expires_at) VALUES (%s, 'Running', 1, 'w', now(), now() + interval '1 h')"
            " RETURNING id",
            [kind],
        )
    )


def succeeded(pg: Conn, kind: str = "Thumb") -> int:
    return int(
        one(
            pg,
            "INSERT INTO work_items (kind, status, attempt, started_at, finished_at)"
            " VALUES (%s, 'Succeeded', 1, now(), now()) RETURNING id",
            [kind],
        )
    )


def enqueued(*args: str, dsn: str) -> int:
    result = trioworker("enqueue", *args, dsn=dsn)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def waiting_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.startswith("waiting:")]


def table_rows(text: str, title: str) -> list[list[str]]:
    """The rows of the table `show` titles `title`: each its cells' words."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            if rows:
                break
            continue
        if re.fullmatch(r"\s*[─━]+\s*", line) or line.split()[:1] == ["id"]:
            continue
        rows.append(line.split())
    return rows


def test_enqueue_after_stores_a_waiting_item_with_its_parents(dsn: str, pg: Conn) -> None:
    """`enqueue KIND --after ID --after ID` prints the new id; the item is Waiting, its
    parents are the ids given (each once), and it becomes Queued once they Succeed."""
    first, second = queued(pg), running(pg)
    child = enqueued("Publish", "--after", str(second), "--after", str(first),
                     "--after", str(first), dsn=dsn)  # fmt: skip
    assert one(pg, "SELECT status FROM work_items WHERE id = %s", [child]) == "Waiting"
    assert one(pg, "SELECT after FROM work_items WHERE id = %s", [child]) == sorted([first, second])
    parents = pg.execute(
        "SELECT parent_id FROM work_dependencies WHERE child_id = %s ORDER BY 1", [child]
    ).fetchall()
    assert parents == [(first,), (second,)]
    ready = enqueued("Publish", "--after", str(succeeded(pg)), dsn=dsn)
    assert one(pg, "SELECT status FROM work_items WHERE id = %s", [ready]) == "Queued"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--after", "x"], "argument --after: must be an integer, not 'x'"),
        (["--after", "0"], "argument --after: must be at least 1 and at most"),
        (["--after", "-3"], "argument --after: must be at least 1 and at most"),
        (["--after", "1.5"], "argument --after: must be an integer, not '1.5'"),
        (["--after", "\u0661"], "argument --after: must be an integer"),  # an Arabic-Indic 1
        (["--after", str(2**63)], "argument --after: must be at least 1 and at most"),
        (["--after", "1", "--dedup-key", "k"], "an item enqueued after others takes no dedup_key"),
    ],
)
def test_a_bad_after_is_a_usage_error_and_writes_nothing(
    dsn: str, pg: Conn, args: list[str], message: str
) -> None:
    """An --after that is no item id (or one given with a dedup key): exit 2 before
    anything connects, naming the option, and nothing written."""
    parent = queued(pg)
    result = trioworker("enqueue", "Publish", *args, dsn=dsn)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr.splitlines()[-1]
    assert one(pg, "SELECT count(*) FROM work_items WHERE id <> %s", [parent]) == 0


def test_an_unknown_parent_is_named_and_nothing_is_written(dsn: str, pg: Conn) -> None:
    """--after an id no item has (never enqueued, or deleted): exit 1, one line naming
    each unknown id, and no item written."""
    parent = queued(pg)
    result = trioworker("enqueue", "Publish", "--after", str(parent), "--after", "999",
                        "--after", "998", dsn=dsn)  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert result.stderr == "trioworker: error: after names items that do not exist: 998, 999\n"
    assert one(pg, "SELECT count(*) FROM work_items") == 1
    assert one(pg, "SELECT count(*) FROM work_dependencies") == 0


def test_from_lines_take_after(dsn: str, pg: Conn, tmp_path: Path) -> None:
    """`enqueue --from` lines take "after": a list of ids (null or [] for none); each
    line's item waits for its own parents."""
    first, second = queued(pg), queued(pg)
    path = tmp_path / "items.jsonl"
    path.write_text(
        f'{{"kind": "Publish", "after": [{first}, {second}]}}\n'
        f'{{"kind": "Zip", "after": [{second}], "payload": {{"n": 1}}}}\n'
        '{"kind": "Plain", "after": null}\n{"kind": "Plain", "after": []}\n',
        encoding="utf-8",
    )
    result = trioworker("enqueue", "--from", str(path), dsn=dsn)
    assert result.returncode == 0, result.stderr
    ids = [int(line) for line in result.stdout.split()]
    rows = pg.execute(
        "SELECT id, kind, status, after FROM work_items WHERE id = ANY(%s) ORDER BY id", [ids]
    ).fetchall()
    assert rows == [
        (ids[0], "Publish", "Waiting", [first, second]),
        (ids[1], "Zip", "Waiting", [second]),
        (ids[2], "Plain", "Queued", None),
        (ids[3], "Plain", "Queued", None),
    ]


@pytest.mark.parametrize(
    ("after", "message"),
    [
        ('"12"', "line 2: after must be a list of item ids, not str"),
        ("12", "line 2: after must be a list of item ids, not int"),
        ("[1.0]", "line 2: after takes item ids (integers), not float"),
        ("[true]", "line 2: after takes item ids (integers), not bool"),
        ("[[1]]", "line 2: after takes item ids (integers), not list"),
        ('{"1": 1}', "line 2: after takes item ids (integers), not str"),
        ("[0]", "line 2: after: 0 is not an item id"),
        (f"[{2**63}]", f"line 2: after: {2**63} is not an item id"),
        (str(list(range(1, 1002))), "line 2: after names 1001 items; at most 1000"),
    ],
)
def test_a_bad_after_line_is_a_usage_error_naming_it(
    dsn: str, pg: Conn, tmp_path: Path, after: str, message: str
) -> None:
    """A line whose "after" is not a list of item ids: exit 2 naming the line, before
    anything connects; nothing written (the good line 1 neither)."""
    path = tmp_path / "items.jsonl"
    path.write_text('{"kind": "K"}\n{"kind": "K", "after": ' + after + "}\n", encoding="utf-8")
    result = trioworker("enqueue", "--from", str(path), dsn=dsn)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"trioworker: error: {message}\n"
    assert one(pg, "SELECT count(*) FROM work_items") == 0


def test_a_from_line_with_an_unknown_parent_writes_nothing(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """An unknown parent on any line: exit 1 naming its line and the id, and no line's
    item written;
    --after beside --from is refused, each item takes its parents from its line."""
    parent = queued(pg)
    path = tmp_path / "items.jsonl"
    path.write_text(
        f'{{"kind": "K", "after": [{parent}]}}\n{{"kind": "K", "after": [{parent}, 777]}}\n',
        encoding="utf-8",
    )
    result = trioworker("enqueue", "--from", str(path), dsn=dsn)
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "trioworker: error: line 2: after names items that do not exist: 777"
    )
    assert one(pg, "SELECT count(*) FROM work_items") == 1
    both = trioworker("enqueue", "--from", str(path), "--after", str(parent), dsn=dsn)
    assert both.returncode == 2
    assert both.stderr == (
        "trioworker: error: --from takes each item from its line: not with --after\n"
    )


def test_show_lists_parents_and_children_and_which_parents_it_waits_for(dsn: str, pg: Conn) -> None:
    """`show` of a Waiting item: a parents table and a children table (id, kind,
    status, by id) and a `waiting:` line naming the parents that have not Succeeded
    with their kinds and statuses; `show --json` has "parents", "children" and
    "waiting". A parent's `show` lists its children."""
    busy, later, done = running(pg), queued(pg), succeeded(pg)
    child = enqueued("Publish", "--after", str(later), "--after", str(done),
                     "--after", str(busy), dsn=dsn)  # fmt: skip
    grandchild = enqueued("Zip", "--after", str(child), dsn=dsn)

    shown = trioworker("show", str(child), dsn=dsn, env={"COLUMNS": "120"})
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == f"item {child}  Publish  scope -  Waiting"
    assert table_rows(shown.stdout, "parents") == [
        [str(busy), "Thumb", "Running"],
        [str(later), "Thumb", "Queued"],
        [str(done), "Thumb", "Succeeded"],
    ]
    assert table_rows(shown.stdout, "children") == [[str(grandchild), "Zip", "Waiting"]]
    assert waiting_lines(shown.stdout) == [
        f"waiting: for parent {busy} (Thumb, Running), parent {later} (Thumb, Queued)"
    ]

    details = json.loads(trioworker("show", str(child), "--json", dsn=dsn).stdout)
    assert details["parents"] == [
        {"id": busy, "kind": "Thumb", "status": "Running"},
        {"id": later, "kind": "Thumb", "status": "Queued"},
        {"id": done, "kind": "Thumb", "status": "Succeeded"},
    ]
    assert details["children"] == [{"id": grandchild, "kind": "Zip", "status": "Waiting"}]
    assert details["waiting"] == [
        f"for parent {busy} (Thumb, Running), parent {later} (Thumb, Queued)"
    ]

    parent = json.loads(trioworker("show", str(done), "--json", dsn=dsn).stdout)
    assert parent["parents"] == [] and parent["waiting"] == []
    assert parent["children"] == [{"id": child, "kind": "Publish", "status": "Waiting"}]
    plain = trioworker("show", str(done), dsn=dsn)
    assert table_rows(plain.stdout, "children") == [[str(child), "Publish", "Waiting"]]
    assert "parents" not in plain.stdout.split()


def test_show_after_a_parent_fails_says_why_it_was_cancelled(dsn: str, pg: Conn) -> None:
    """A parent that fails cancels its Waiting child and grandchild: `show` of each
    gives the reason naming the parent, its parents' statuses, and no `waiting:` line."""
    busy, other = running(pg), queued(pg)
    child = enqueued("Publish", "--after", str(busy), "--after", str(other), dsn=dsn)
    grandchild = enqueued("Zip", "--after", str(child), dsn=dsn)
    pg.execute(
        "UPDATE work_items SET status = 'Failed', finished_at = now(), worker_id = NULL,"
        " lease_expires_at = NULL, reason = 'failed 1 of 1 attempts' WHERE id = %s",
        [busy],
    )
    shown = trioworker("show", str(child), dsn=dsn, env={"COLUMNS": "120"})
    assert shown.stdout.splitlines()[0] == (
        f"item {child}  Publish  scope -  Cancelled (parent {busy} failed)"
    )
    assert table_rows(shown.stdout, "parents") == [
        [str(busy), "Thumb", "Failed"],
        [str(other), "Thumb", "Queued"],
    ]
    assert table_rows(shown.stdout, "children") == [[str(grandchild), "Zip", "Cancelled"]]
    assert waiting_lines(shown.stdout) == []
    below = json.loads(trioworker("show", str(grandchild), "--json", dsn=dsn).stdout)
    assert below["item"]["reason"] == f"parent {child} was cancelled"
    assert below["parents"] == [{"id": child, "kind": "Publish", "status": "Cancelled"}]


def test_show_lists_at_most_50_children_and_json_lists_them_all(dsn: str, pg: Conn) -> None:
    """A parent of 60 children: `show` lists the first 50 by id and says how many more
    there are; `show --json` lists all 60."""
    parent = queued(pg)
    insert = "INSERT INTO work_items (kind, after) VALUES ('C', %s) RETURNING id"
    children = [int(one(pg, insert, [[parent]])) for _ in range(60)]
    shown = trioworker("show", str(parent), dsn=dsn, env={"COLUMNS": "120"})
    rows = table_rows(shown.stdout, "children")
    assert rows[:50] == [[str(c), "C", "Waiting"] for c in children[:50]]
    assert rows[50:] == [["...", "10", "more", "(show", "--json", "lists", "them", "all)"]]
    details = json.loads(trioworker("show", str(parent), "--json", dsn=dsn).stdout)
    assert [c["id"] for c in details["children"]] == children


def test_status_counts_waiting_items_before_queued_ones(dsn: str, pg: Conn) -> None:
    """`status --json` counts Waiting items by kind and in the totals; the table has a
    Waiting column before Queued."""
    parent = queued(pg, "Thumb")
    enqueued("Publish", "--after", str(parent), dsn=dsn)
    enqueued("Publish", "--after", str(parent), dsn=dsn)
    status = json.loads(trioworker("status", "--json", dsn=dsn).stdout)
    assert status["counts"]["Publish"]["Waiting"] == 2
    assert status["counts"]["Thumb"] == {
        "Waiting": 0, "Queued": 1, "Running": 0, "Succeeded": 0, "Failed": 0, "Cancelled": 0,
    }  # fmt: skip
    assert list(status["totals"]) == [
        "Waiting", "Queued", "Running", "Succeeded", "Failed", "Cancelled",
    ]  # fmt: skip
    assert status["totals"]["Waiting"] == 2
    table = trioworker("status", dsn=dsn, env={"COLUMNS": "120"}).stdout.splitlines()
    header = next(line.split() for line in table if line.split()[:1] == ["kind"])
    assert header == ["kind", "Waiting", "Queued", "Running", "Succeeded", "Failed", "Cancelled"]
    publish = next(line.split() for line in table if line.split()[:1] == ["Publish"])
    assert publish == ["Publish", "2", "·", "·", "·", "·", "·"]
