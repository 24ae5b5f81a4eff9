"""What `enqueue` reads from the command line, checked before anything connects
(trioworker._cli.input): the depth bound, the line splitting, the bounded reads, the
items' lines."""

from __future__ import annotations

import io
from typing import Any

import pytest

from trioworker._cli.input import (
    READ_LIMIT,
    UsageError,
    check_value,
    lines_of,
    on_its_line,
    parse_json,
    read_items,
)
from trioworker._core.errors import InvalidWorkItem
from trioworker._core.jsontext import MAX_DEPTH, depth


def nested(levels: int, inner: Any = None) -> Any:
    value: Any = [] if inner is None else inner
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value",
    [nested(MAX_DEPTH - 1), nested(MAX_DEPTH - 2, {"a": 1}), nested(MAX_DEPTH - 3, {"k": [1]})],
)
def test_the_deepest_payload_allowed_passes(value: Any) -> None:
    """A payload as deep as `_jsontext.depth` allows (MAX_DEPTH: the table's bound and
    every enqueue path's) is taken."""
    assert depth(value) == MAX_DEPTH
    check_value(value, "--payload")


@pytest.mark.parametrize("value", [nested(MAX_DEPTH), {"k": nested(MAX_DEPTH - 1, 5)}])
def test_one_level_more_is_refused_naming_the_field(value: Any) -> None:
    """One level past MAX_DEPTH is refused, naming the field and the bound."""
    assert depth(value) == MAX_DEPTH + 1
    with pytest.raises(UsageError, match=r"^line 3: payload nests deeper than 64 levels"):
        check_value(value, "line 3: payload")


def test_json_too_deep_for_python_says_how_deep_is_allowed() -> None:
    """Nesting past the interpreter's recursion limit is a UsageError, not a
    RecursionError, and says how deep a payload may nest."""
    with pytest.raises(UsageError, match="nested too deeply: a payload nests 64 levels at most"):
        parse_json("[" * 100_000 + "]" * 100_000, "--payload")


def test_lines_end_at_newlines_only_and_are_bounded() -> None:
    """Lines split at \\n (a \\r before it dropped), not at U+2028, NEL, \\x1e, \\x0c or
    a lone \\r; a line longer than READ_LIMIT is refused without reading on."""
    data = "a\u2028b\u0085c\x1ed\x0ce\rf\r\ng\n\nh".encode()
    assert list(lines_of(io.BytesIO(data), "f")) == ["a\u2028b\u0085c\x1ed\x0ce\rf", "g", "", "h"]
    endless = io.BytesIO(b"x" * (READ_LIMIT + 10))
    with pytest.raises(UsageError, match=f"line 1 of f is longer than {READ_LIMIT} bytes"):
        list(lines_of(endless, "f"))
    assert endless.tell() == READ_LIMIT + 1
    with pytest.raises(UsageError, match="line 2 is not UTF-8: invalid start byte at byte 2"):
        list(lines_of(io.BytesIO(b"ok\nK\xff\n"), "f"))


# -- enqueue --from's items and their lines ----------------------------------------------


def test_items_keep_their_line_numbers_and_their_parents() -> None:
    """Each item of `--from` comes with its line's number (blank lines counted, not
    read), and its "after" as given (checked: a list of item ids)."""
    lines = ['{"kind": "A"}', "", '{"kind": "B", "after": [7, 3]}', " ", '{"kind": "C"}']
    items = read_items(lines, known_kinds=None)
    assert [(number, item.kind, item.after) for number, item in items] == [
        (1, "A", None),
        (3, "B", [7, 3]),
        (5, "C", None),
    ]


def test_an_items_error_by_index_is_said_by_its_line() -> None:
    """enqueue_many's error about one item (an unknown parent) names its line instead;
    any other error is left as it is."""
    unknown = InvalidWorkItem.of_item(2, "after names items that do not exist: 9")
    assert str(unknown) == "item 2: after names items that do not exist: 9"
    assert str(on_its_line(unknown, [1, 3, 8])) == (
        "line 8: after names items that do not exist: 9"
    )
    assert str(on_its_line(InvalidWorkItem.of_item(0, "item 0: x"), [4])) == "line 4: item 0: x"
    other = InvalidWorkItem("item 0: after names items that do not exist: 9")
    assert on_its_line(other, [1]) is other
    beyond = InvalidWorkItem("item 3: x", index=3)
    assert on_its_line(beyond, [1, 2, 3]) is beyond


# -- enqueue's warning of a kind no live Worker serves -----------------------------------


def test_unserved_warnings_name_a_close_kind_a_stopped_one_or_what_is_served() -> None:
    from trioworker._cli.commands import unserved_warnings

    served = {"Crawl": True, "Thumbnail": True, "Transcode": False}
    assert unserved_warnings(["Crawl", "Thumbnail"], served) == []
    assert unserved_warnings(["Crawll", "Crawll"], served) == [
        "warning: no live Worker serves kind 'Crawll': a typo for 'Crawl'?;"
        " its items wait until one does"
    ]
    assert unserved_warnings(["Transcode"], served) == [
        "warning: no live Worker serves kind 'Transcode' now (Workers served it before);"
        " its items wait until one does"
    ]
    assert unserved_warnings(["Zebra", "Crawl"], served) == [
        "warning: no live Worker serves kind 'Zebra' (live Workers serve: Crawl,"
        " Thumbnail); its items wait until one does"
    ]
    assert unserved_warnings(["Zebra"], {}) == [
        "warning: no live Worker serves kind 'Zebra' (live Workers serve: nothing);"
        " its items wait until one does"
    ]
    # A close match among stopped Workers' kinds is still named.
    assert "a typo for 'Transcode'?" in unserved_warnings(["Transcod"], served)[0]


# -- the program's name and version ----------------------------------------------------


def test_the_usage_line_names_the_program_as_it_was_run() -> None:
    from trioworker._cli.main import build_parser, program_name

    assert program_name("/venv/bin/trioworker") == "trioworker"
    assert program_name("/src/trioworker/__main__.py") == "python -m trioworker"
    assert build_parser(prog="trioworker").format_usage().startswith("usage: trioworker [-h]")


def test_version_prints_the_installed_distributions_version(capsys: Any) -> None:
    import importlib.metadata

    from trioworker._cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"trioworker {importlib.metadata.version('trioworker')}\n"
