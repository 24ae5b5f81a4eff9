"""What `enqueue` reads before anything connects: a payload (--payload JSON, @FILE or
-) and items (--from FILE.jsonl or -), checked the way the database would take them.
Each refusal is a UsageError naming the field, and the line for --from.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import sys
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any, BinaryIO

from trioworker._core.errors import ConfigurationError, InvalidWorkItem
from trioworker._core.jsontext import MAX_DEPTH
from trioworker._core.model import NewItem
from trioworker._core.text import not_unicode
from trioworker._core.validation import MAX_PAYLOAD_BYTES, MAX_RUN_AFTER_DISTANCE, validate_many

#: The most read from a payload file (or standard input), and from one line of an items
#: file: room for a payload at its limit written out with spaces and escapes, and a
#: bound, so that `--payload @/dev/zero` is refused rather than read until memory ends.
READ_LIMIT = 16 * MAX_PAYLOAD_BYTES

#: The fields a line of `enqueue --from` may have.
ITEM_FIELDS = ("kind", "scope", "payload", "dedup_key", "delay", "priority", "after")


class UsageError(ConfigurationError):
    """The command line itself is wrong: exit 2, before anything connects."""


def parse_json(text: str, source: str) -> Any:
    """`text` decoded as JSON, or a UsageError naming `source`. Control characters
    inside strings are taken as they are (as `json.loads(strict=False)`)."""
    try:
        return json.loads(text, strict=False)
    except RecursionError:
        raise UsageError(
            f"{source} is nested too deeply: a payload nests {MAX_DEPTH} levels at most"
        ) from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source} is not valid JSON: {exc}") from None
    except ValueError as exc:  # int's limit on digits
        raise UsageError(f"{source} cannot be read: {exc}") from None


def check_value(value: Any, field: str) -> None:
    """Refuse, naming `field`, a decoded JSON value the database would not take or
    Python could not read back: deeper than MAX_DEPTH (as `_jsontext.depth` counts), a
    string or key that is not valid Unicode, NaN or an infinity. Iterative."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        current, level = stack.pop()
        if level > MAX_DEPTH:
            raise UsageError(f"{field} nests deeper than {MAX_DEPTH} levels (the most allowed)")
        if isinstance(current, float) and not math.isfinite(current):
            raise UsageError(f"{field} holds {json.dumps(current)}, which JSON does not have")
        texts = [current] if isinstance(current, str) else []
        if isinstance(current, dict):
            texts.extend(current)
            stack.extend((v, level + 1) for v in current.values())
        elif isinstance(current, list):
            stack.extend((v, level + 1) for v in current)
        for text in texts:
            why = not_unicode(text)
            if why is not None:
                raise UsageError(f"{field} holds text that is not valid Unicode: {why}")


def _read_bounded(file: BinaryIO, source: str) -> str:
    data = file.read(READ_LIMIT + 1)
    if len(data) > READ_LIMIT:
        raise UsageError(
            f"{source} is longer than {READ_LIMIT} bytes (a payload is at most"
            f" {MAX_PAYLOAD_BYTES} bytes as JSON)"
        )
    return _decode(data, source)


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{source} is not UTF-8: {exc.reason} at byte {exc.start + 1}") from None


def read_payload(text: str | None) -> Any:
    """--payload JSON, @FILE (its contents) or - (standard input), decoded and checked."""
    if text is None:
        return None
    source = "--payload"
    if text == "-":
        source = "the payload on standard input"
        text = _read_bounded(sys.stdin.buffer, source)
    elif text.startswith("@"):
        source = f"--payload file {text[1:]!r}"
        try:
            with open(text[1:], "rb") as file:
                text = _read_bounded(file, source)
        except OSError as exc:
            raise UsageError(f"cannot read --payload file {text[1:]!r}: {exc.strerror}") from None
    payload = parse_json(text, source)
    check_value(payload, source)
    return payload


def lines_of(file: BinaryIO, source: str) -> Iterator[str]:
    """The lines of an items file, split at newlines only (`\\r\\n` too), so a JSON
    string may hold any other separator (U+2028, NEL, \\x1e); each decoded as UTF-8."""
    number = 0
    while line := file.readline(READ_LIMIT + 1):
        number += 1
        if len(line) > READ_LIMIT:
            raise UsageError(f"line {number} of {source} is longer than {READ_LIMIT} bytes")
        yield _decode(line.removesuffix(b"\n").removesuffix(b"\r"), f"line {number}")


def read_lines(source: str) -> list[str]:
    """`enqueue --from FILE` (or - for standard input): its lines."""
    if source == "-":
        return list(lines_of(sys.stdin.buffer, "standard input"))
    try:
        with open(source, "rb") as file:
            return list(lines_of(file, f"--from file {source!r}"))
    except OSError as exc:
        raise UsageError(f"cannot read --from file {source!r}: {exc.strerror}") from None


def _item(fields: dict[str, Any], where: str) -> NewItem:
    for name in ("kind", "scope", "dedup_key"):
        value = fields.get(name)
        why = not_unicode(value) if isinstance(value, str) else None
        if why is not None:
            raise UsageError(f"{where}: {name} is not valid Unicode: {why}")
    check_value(fields.get("payload"), f"{where}: payload")
    delay = fields.get("delay")
    most = MAX_RUN_AFTER_DISTANCE.total_seconds()
    if delay is not None and (
        isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay <= most
    ):
        raise UsageError(f"{where}: delay must be seconds from 0 to {most:.0f}, not {delay!r}")
    kind: Any = fields.get("kind")  # checked by validate_many, with the rest
    return NewItem(
        kind=kind,
        scope=fields.get("scope"),
        payload=fields.get("payload"),
        dedup_key=fields.get("dedup_key"),
        run_after=dt.timedelta(seconds=delay) if delay else None,
        priority=fields.get("priority", 0),
        after=fields.get("after"),  # checked by validate_many: a list of item ids
    )


def read_items(
    lines: Iterable[str], *, known_kinds: Collection[str] | None
) -> list[tuple[int, NewItem]]:
    """`enqueue --from`: one JSON object per line (blank lines skipped), each checked
    as an enqueue, with its line's number; the first bad one raises UsageError naming
    its line."""
    now = dt.datetime.now(dt.UTC)
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip(" \t\r"):  # JSON's white space
            continue
        where = f"line {number}"
        fields = parse_json(line, where)
        if not isinstance(fields, dict):
            raise UsageError(f"{where}: a JSON object, not {type(fields).__name__}")
        unknown = sorted(set(fields) - set(ITEM_FIELDS))
        if unknown:
            raise UsageError(
                f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(ITEM_FIELDS)})"
            )
        item = _item(fields, where)
        try:
            validate_many([item], now=now, known_kinds=known_kinds)
        except InvalidWorkItem as exc:
            raise UsageError(f"{where}: {str(exc).removeprefix('item 0: ')}") from None
        items.append((number, item))
    return items


def on_its_line(error: InvalidWorkItem, numbers: Sequence[int]) -> InvalidWorkItem:
    """An error of `enqueue_many` about one of its items (one whose parent does not
    exist), naming that item's line instead: `numbers` are the items' lines."""
    if error.index is None or error.index >= len(numbers):
        return error
    return InvalidWorkItem(f"line {numbers[error.index]}: {error.reason}")
