"""The queue's schema name, and its statements qualified by it (docs/design/schema.md)."""

from __future__ import annotations

import re

import pytest

from trioworker import ConfigurationError
from trioworker._postgres.queries import SCHEMA_MARKER, TEMPLATES, WRITTEN, qualify, queries_in
from trioworker._postgres.schema_name import MAX_SCHEMA_LENGTH, SCHEMA_ENV, resolve_schema
from trioworker.dashboard._reader import TEMPLATES as DASHBOARD_TEMPLATES
from trioworker.dashboard._reader import queries_in as dashboard_queries_in


def test_the_schema_is_the_given_one_else_the_environments_else_the_search_paths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """schema=/--schema wins over $TRIOWORKER_SCHEMA; with neither (or it empty), None:
    the objects are named unqualified, as before, for the search_path to find."""
    monkeypatch.delenv(SCHEMA_ENV, raising=False)
    assert resolve_schema(None) is None
    assert queries_in(None) is WRITTEN
    monkeypatch.setenv(SCHEMA_ENV, "queue_env")
    assert resolve_schema(None) == "queue_env"
    assert resolve_schema("queue_given") == "queue_given"
    monkeypatch.setenv(SCHEMA_ENV, "")
    assert resolve_schema(None) is None


@pytest.mark.parametrize(
    "name",
    ["", "Queue", "my-queue", "1queue", "q;drop", 'q"', "pg_queue", "é", "a" * 41, "a b"],
)
def test_a_schema_name_that_would_need_quoting_or_is_reserved_is_refused(name: str) -> None:
    """Only plain lower-case identifiers of at most 40 characters, not pg_..., are taken."""
    with pytest.raises(ConfigurationError, match="bad schema name"):
        resolve_schema(name)


def test_the_longest_schema_name_is_taken() -> None:
    """40 characters: its longest NOTIFY channel still fits PostgreSQL's 63 bytes."""
    name = "q" * MAX_SCHEMA_LENGTH
    assert resolve_schema(name) == name
    assert len(f"trioworker_settle.{name}") <= 63


def test_qualify_fills_each_marker_and_touches_nothing_else() -> None:
    """Each schema marker becomes the quoted schema and a dot (None: nothing); names
    without one, comments, string literals and quoted identifiers stay as written."""
    statement = (
        "-- reads work_items\n"
        "SELECT w.work_note, 'work_items' AS label, \"work_x\"\n"
        f"FROM {SCHEMA_MARKER}work_items AS w JOIN {SCHEMA_MARKER}work_attempts a"
        f" ON a.item_id = w.id, {SCHEMA_MARKER}work_claim_v1(%(worker)s)"
    )
    assert qualify(statement, "queue") == (
        "-- reads work_items\n"
        "SELECT w.work_note, 'work_items' AS label, \"work_x\"\n"
        'FROM "queue".work_items AS w JOIN "queue".work_attempts a ON a.item_id = w.id,'
        ' "queue".work_claim_v1(%(worker)s)'
    )
    assert qualify(statement, None) == (
        "-- reads work_items\n"
        "SELECT w.work_note, 'work_items' AS label, \"work_x\"\n"
        "FROM work_items AS w JOIN work_attempts a ON a.item_id = w.id, work_claim_v1(%(worker)s)"
    )


#: The rule that qualified statements before the markers: every name beginning `work_`
#: outside comments, string literals and quoted identifiers, and not already qualified
#: (`w.work_x`), is a queue object. All the queue's tables and functions are named so,
#: and nothing else is: so it says where each marker belongs.
_KEEP_OR_NAME = re.compile(
    r"(?P<keep>--[^\n]*|'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\")|(?<![.\w])(?P<name>work_\w+)"
)


def by_the_name_rule(statement: str, schema: str) -> str:
    """`statement` (as written, no markers) qualified by the rule above."""
    return _KEEP_OR_NAME.sub(lambda m: m["keep"] or f'"{schema}".{m["name"]}', statement)


def misplaced_markers(template: str) -> list[str]:
    """Why `template`'s markers are not where the name rule puts them: each queue object
    named without a marker, each marker before anything else (empty: all in place)."""
    written = template.replace(SCHEMA_MARKER, "")
    if template.replace(SCHEMA_MARKER, '"q".') == by_the_name_rule(written, "q"):
        return []
    marked = re.findall(re.escape(SCHEMA_MARKER) + r"(\w+)", template)
    named = [m["name"] for m in _KEEP_OR_NAME.finditer(written) if m["name"]]
    return [f"{n} without a marker" for n in named if n not in marked] + [
        f"a marker before {n}" for n in marked if n not in named
    ] or ["the markers are not where the queue's names are"]


ALL_TEMPLATES = {
    **{f"queries.sql {n}": t for n, t in TEMPLATES.items()},
    **{f"dashboard {n}": t for n, t in DASHBOARD_TEMPLATES.items()},
}


@pytest.mark.parametrize("name", sorted(ALL_TEMPLATES))
def test_every_queue_object_a_statement_names_is_marked_and_nothing_else(name: str) -> None:
    """In queries.sql and the dashboard's, each statement marks exactly the names the
    rule of the queue's objects picks, so it is qualified as it was before the markers,
    whatever the schema."""
    template = ALL_TEMPLATES[name]
    assert misplaced_markers(template) == []
    for schema in ("public", "tenant_a"):
        written = template.replace(SCHEMA_MARKER, "")
        assert qualify(template, schema) == by_the_name_rule(written, schema)


def test_a_statement_without_its_marker_is_caught() -> None:
    """A queue object named without a marker (it would go to the search_path's schema,
    not the queue's), or a marker before a column, is named by the check above."""
    good = TEMPLATES["queued_with_dedup_key"]
    assert misplaced_markers(good) == []
    forgotten = good.replace(f"{SCHEMA_MARKER}work_items", "work_items")
    assert misplaced_markers(forgotten) == ["work_items without a marker"]
    stray = good.replace("status", f"{SCHEMA_MARKER}status")
    assert misplaced_markers(stray) == ["a marker before status"]


def test_every_statement_names_the_queue_only_through_its_schema() -> None:
    """In every statement of queries.sql and the dashboard's, outside comments, each
    work_... name is qualified, for public as for any other schema, and no marker is
    left."""
    for schema in ("public", "tenant_a"):
        for queries in (queries_in(schema), dashboard_queries_in(schema)):
            for name, statement in queries.items():
                code = re.sub(r"--[^\n]*", "", statement)
                bare = re.findall(r"(?<![.\w])work_\w+", code)
                assert bare == [], (schema, name, bare)
                assert SCHEMA_MARKER not in statement
                assert code.count(f'"{schema}".work_') == code.count("work_"), (schema, name)
    assert not [n for n, s in WRITTEN.items() if SCHEMA_MARKER in s]
