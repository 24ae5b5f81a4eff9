"""The queue's schema name, and its statements qualified by it (docs/design/schema.md)."""

from __future__ import annotations

import re

import pytest

from trioworker import ConfigurationError
from trioworker._postgres.queries import WRITTEN, qualify, queries_in
from trioworker._postgres.schema_name import MAX_SCHEMA_LENGTH, SCHEMA_ENV, resolve_schema


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


def test_qualify_names_each_queue_object_and_nothing_else() -> None:
    """Tables and functions named work_... get the schema; columns of an alias, comments,
    string literals and quoted identifiers are left as written."""
    statement = (
        "-- reads work_items\n"
        "SELECT w.work_note, 'work_items' AS label, \"work_x\"\n"
        "FROM work_items AS w JOIN work_attempts a ON a.item_id = w.id,"
        " work_claim_v1(%(worker)s)"
    )
    assert qualify(statement, "queue") == (
        "-- reads work_items\n"
        "SELECT w.work_note, 'work_items' AS label, \"work_x\"\n"
        'FROM "queue".work_items AS w JOIN "queue".work_attempts a ON a.item_id = w.id,'
        ' "queue".work_claim_v1(%(worker)s)'
    )


def test_every_statement_names_the_queue_only_through_its_schema() -> None:
    """In every statement of queries.sql, outside comments, each work_... name is
    qualified, for public as for any other schema."""
    for schema in ("public", "tenant_a"):
        for name, statement in queries_in(schema).items():
            code = re.sub(r"--[^\n]*", "", statement)
            bare = re.findall(r"(?<![.\w])work_\w+", code)
            assert bare == [], (schema, name, bare)
            assert code.count(f'"{schema}".work_') == len(
                re.findall(r"(?<![.\w])work_\w+", re.sub(r"--[^\n]*", "", WRITTEN[name]))
            )
