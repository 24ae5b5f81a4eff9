"""Structured logs: item fields on records, both formats, and the password mask."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterator

import pytest

from trioworker._core.model import WorkItem
from trioworker._worker.logging import (
    JsonFormatter,
    RedactingFilter,
    TextFormatter,
    configure,
    item_logger,
)

ITEM = WorkItem(id=7, kind="Crawl", scope="cfg-1", payload={}, attempt=2)
FIELDS = {"item_id": 7, "attempt": 2, "kind": "Crawl", "scope": "cfg-1", "worker_id": "w1"}


class Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def kept() -> Iterator[tuple[logging.Logger, Keep]]:
    logger = logging.getLogger("tests.unit.test_logging")
    handler = Keep()
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def record(
    msg: str = "hello %s", args: tuple[object, ...] = ("there",), **fields: object
) -> logging.LogRecord:
    r = logging.LogRecord("trioworker.x", logging.WARNING, __file__, 1, msg, args, None)
    r.created = 0.0
    r.__dict__.update(fields)
    return r


def test_an_item_logger_puts_the_items_fields_on_every_record(
    kept: tuple[logging.Logger, Keep],
) -> None:
    """Every record from an item's logger carries id, attempt, kind, scope, worker id;
    fields passed at the call are added too, and win."""
    logger, handler = kept
    ilog = item_logger(logger, ITEM, "w1")
    ilog.warning("one")
    ilog.warning("two", extra={"attempt": 3, "extra_field": "x"})
    first, second = handler.records
    assert {f: getattr(first, f) for f in FIELDS} == FIELDS
    assert (second.attempt, second.extra_field, second.item_id) == (3, "x", 7)  # type: ignore[attr-defined]


def test_text_lines_end_with_the_item_fields() -> None:
    """Text lines about an item end in [item_id=.. attempt=.. kind=.. scope=.. worker_id=..];
    other lines have no brackets."""
    formatter = TextFormatter("%(levelname)s %(message)s")
    assert formatter.format(record(**FIELDS)) == (
        "WARNING hello there [item_id=7 attempt=2 kind=Crawl scope=cfg-1 worker_id=w1]"
    )
    assert formatter.format(record(kind="Crawl")) == "WARNING hello there [kind=Crawl]"
    assert formatter.format(record()) == "WARNING hello there"


def test_the_item_fields_come_before_a_traceback() -> None:
    """A line with a traceback: the fields end its first line, not the traceback."""
    try:
        raise KeyError("path")
    except KeyError:
        exc_info = sys.exc_info()
    failed = record(**FIELDS)
    failed.exc_info = exc_info
    lines = TextFormatter("%(levelname)s %(message)s").format(failed).splitlines()
    assert lines[0] == (
        "WARNING hello there [item_id=7 attempt=2 kind=Crawl scope=cfg-1 worker_id=w1]"
    )
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "KeyError: 'path'"


def test_json_lines_are_one_object_with_the_item_fields() -> None:
    """A JSON line holds the time (UTC, ISO), level, logger, message and item fields."""
    line = json.loads(JsonFormatter().format(record(**FIELDS)))
    assert line == {
        "ts": "1970-01-01T00:00:00+00:00",
        "level": "WARNING",
        "logger": "trioworker.x",
        "message": "hello there",
        **FIELDS,
    }
    assert json.loads(JsonFormatter().format(record(scope=None)))["scope"] is None
    assert "item_id" not in json.loads(JsonFormatter().format(record()))


def test_json_lines_carry_the_exception_and_stringify_odd_values() -> None:
    """An exception's traceback goes in `exception`; values JSON lacks become strings."""
    try:
        raise ValueError("boom")
    except ValueError:
        r = record(kind={1, 2})
        r.exc_info = sys.exc_info()
    line = json.loads(JsonFormatter().format(r))
    assert line["exception"].startswith("Traceback") and "ValueError: boom" in line["exception"]
    assert line["kind"] == "{1, 2}"
    assert "exception" not in json.loads(JsonFormatter().format(record()))


def test_the_filter_masks_the_secret_in_the_formatted_message() -> None:
    """The secret is masked wherever it lands in the message, arguments included; other
    records pass untouched (arguments kept)."""
    masking = RedactingFilter("s3cr3t")
    leaked = record("connecting with %s", ("password=s3cr3t dbname=x",))
    assert masking.filter(leaked) is True
    assert (leaked.getMessage(), leaked.args) == ("connecting with password=*** dbname=x", None)
    clean = record()
    assert masking.filter(clean) is True and clean.args == ("there",)
    unmasked = record("connecting with %s", ("password=s3cr3t",))
    assert RedactingFilter(None).filter(unmasked) is True
    assert unmasked.getMessage() == "connecting with password=s3cr3t"
    assert RedactingFilter("").filter(unmasked) and unmasked.args == ("password=s3cr3t",)


def test_the_filter_masks_every_form_of_the_secret_longest_first() -> None:
    """Given a password's forms (raw, and as libpq unescapes it), each is masked, the
    longer first, so no piece of the longer is left beside the mask."""
    masking = RedactingFilter("s3cr3t%41PW", "s3cr3tAPW", None)
    leaked = record("token %s, then %s", ('"s3cr3t%41PW"', "s3cr3tAPW"))
    assert masking.filter(leaked) is True
    assert leaked.getMessage() == 'token "***", then ***'


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_configure_sends_every_log_to_stderr_in_the_format_masked(
    root_logger: logging.Logger, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    """configure() leaves one stderr handler on the root logger, at the level asked, in
    the format asked, masking the secret."""
    configure("warning", fmt, secrets=["s3cr3t"])
    assert root_logger.level == logging.WARNING and len(root_logger.handlers) == 1
    logging.getLogger("psycopg.pool").info("not shown")
    logging.getLogger("psycopg.pool").warning("failed: password=%s", "s3cr3t")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "password=***" in err and "s3cr3t" not in err
    if fmt == "json":
        assert json.loads(err)["logger"] == "psycopg.pool"
    else:
        assert re.fullmatch(
            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING psycopg.pool: failed: password=\*\*\*\n",
            err,
        )


def test_configure_defaults_to_info_in_text(
    root_logger: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without arguments: INFO and above, as text, nothing masked."""
    configure()
    assert root_logger.level == logging.INFO
    logging.getLogger("trioworker").debug("not shown")
    logging.getLogger("trioworker").info("shown")
    assert capsys.readouterr().err.endswith(" INFO trioworker: shown\n")
