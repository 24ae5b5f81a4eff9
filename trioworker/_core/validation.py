"""Checks on enqueue input, before anything is written. Pure functions."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs

from trioworker._core.errors import InvalidWorkItem, UnstorableResult
from trioworker._core.jsontext import MAX_DEPTH, depth
from trioworker._core.model import NewItem

#: Largest payload accepted, as UTF-8 JSON.
MAX_PAYLOAD_BYTES = 64 * 1024
#: Longest kind, scope or dedup key.
MAX_NAME_LENGTH = 200
#: How far from now run_after may lie, either way.
MAX_RUN_AFTER_DISTANCE = dt.timedelta(days=366)
#: Priorities run from MIN_PRIORITY to MAX_PRIORITY; higher is claimed sooner.
MIN_PRIORITY = -1000
MAX_PRIORITY = 1000
#: Largest trace context accepted, as UTF-8 JSON: W3C traceparent and tracestate take
#: well under 1 KiB; the rest is room for what else a propagator carries (baggage).
MAX_TRACE_CONTEXT_BYTES = 4096
#: The largest item id (work_items.id is a bigint).
MAX_ID = 2**63 - 1


@attrs.frozen
class EnqueueRequest:
    """Validated enqueue input, ready for the store."""

    kind: str
    scope: str | None
    payload_json: str
    priority: int
    dedup_key: str | None
    run_at: dt.datetime | None  # absolute, when given as a datetime
    delay: float  # seconds from the database's now(), when given as a timedelta
    trace_context_json: str | None = None  # a propagator's carrier, as JSON text
    after: tuple[int, ...] = ()  # the parents' ids, ascending, each once


def validate_enqueue(
    kind: object,
    scope: object = None,
    payload: Any = None,
    dedup_key: object = None,
    run_after: dt.datetime | dt.timedelta | None = None,
    *,
    priority: object = 0,
    now: dt.datetime,
    known_kinds: Collection[str] | None = None,
    trace_context: object = None,
    after: object = None,
) -> EnqueueRequest:
    """Return the request as the store writes it, or raise InvalidWorkItem."""
    _check_name("kind", kind, optional=False)  # pragma: no mutate
    assert isinstance(kind, str)
    if known_kinds is not None and kind not in known_kinds:
        known = ", ".join(sorted(known_kinds)) or "none"
        raise InvalidWorkItem(f"unknown kind {kind!r} (known kinds: {known})")
    _check_name("scope", scope, optional=True)
    _check_name("dedup_key", dedup_key, optional=True)
    run_at, delay = _check_run_after(run_after, now)
    parents = check_after(after)
    if parents and dedup_key is not None:
        raise InvalidWorkItem(
            "an item enqueued after others takes no dedup_key (a dedup key merges onto a"
            " Queued item, and this one waits)"
        )
    return EnqueueRequest(
        kind=kind,
        scope=scope,  # type: ignore[arg-type]  # checked by _check_name
        payload_json=_payload_json({} if payload is None else payload),
        priority=_check_priority(priority),
        dedup_key=dedup_key,  # type: ignore[arg-type]  # checked by _check_name
        run_at=run_at,
        delay=delay,
        trace_context_json=_trace_context_json(trace_context),
        after=parents,
    )


def validate_many(
    items: Sequence[NewItem], *, now: dt.datetime, known_kinds: Collection[str] | None = None
) -> list[EnqueueRequest]:
    """Each of `items` checked as `validate_enqueue` checks one; the first bad one
    raises InvalidWorkItem naming its index ("item 3: ...")."""
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        raise InvalidWorkItem(
            f"enqueue_many takes a sequence of NewItem, not {type(items).__name__}"
        )
    requests = []
    for index, item in enumerate(items):
        if not isinstance(item, NewItem):
            raise InvalidWorkItem.of_item(index, f"a NewItem, not {type(item).__name__}")
        try:
            requests.append(
                validate_enqueue(
                    item.kind,
                    item.scope,
                    item.payload,
                    item.dedup_key,
                    item.run_after,
                    priority=item.priority,
                    now=now,
                    known_kinds=known_kinds,
                    trace_context=item.trace_context,
                    after=item.after,
                )
            )
        except InvalidWorkItem as exc:
            raise InvalidWorkItem.of_item(index, exc) from None
    return requests


def pause_target(kind: object, scope: object) -> tuple[str | None, str | None]:
    """What to pause or resume: a kind or a scope, exactly one (else InvalidWorkItem)."""
    if (kind is None) == (scope is None):
        raise InvalidWorkItem("pause or resume a kind or a scope: give exactly one")
    _check_name("kind", kind, optional=True)
    _check_name("scope", scope, optional=True)
    return kind, scope  # type: ignore[return-value]  # checked by _check_name


def validate_scope(scope: object) -> str:
    """A scope as a Worker may serve it (the same rules as an item's), or InvalidWorkItem."""
    _check_name("scope", scope, optional=False)  # pragma: no mutate
    assert isinstance(scope, str)
    return scope


def _check_name(what: str, value: object, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise InvalidWorkItem(f"{what} must be a string, not {type(value).__name__}")
    if not value.strip():
        raise InvalidWorkItem(f"{what} must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidWorkItem(f"{what} is longer than {MAX_NAME_LENGTH} characters")
    if "\x00" in value:
        raise InvalidWorkItem(f"{what} must not contain NUL characters")
    _check_unicode(what, value)


def _check_unicode(what: str, text: str) -> None:
    """Refuse a lone surrogate (what `os.fsdecode` or `surrogateescape` makes of bytes
    that are not UTF-8): PostgreSQL's text and jsonb cannot hold one."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        char = text[exc.start]
        raise InvalidWorkItem(
            f"{what} is not valid Unicode: it holds a lone surrogate (U+{ord(char):04X},"
            " from bytes that are not UTF-8)"
        ) from None


#: The most parents an item may have (the table's work_items_after_bounded).
MAX_PARENTS = 1000


def check_after(after: object) -> tuple[int, ...]:
    """The parents' ids, ascending and each once, or InvalidWorkItem."""
    if after is None:
        return ()
    if isinstance(after, str | bytes | int) or not isinstance(after, Iterable):
        raise InvalidWorkItem(f"after must be a list of item ids, not {type(after).__name__}")
    ids = list(after)
    for id in ids:
        if isinstance(id, bool) or not isinstance(id, int):
            raise InvalidWorkItem(f"after takes item ids (integers), not {type(id).__name__}")
        if not 1 <= id <= MAX_ID:
            raise InvalidWorkItem(f"after: {id} is not an item id")
    parents = tuple(sorted(set(ids)))
    if len(parents) > MAX_PARENTS:
        raise InvalidWorkItem(f"after names {len(parents)} items; at most {MAX_PARENTS}")
    return parents


def _check_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidWorkItem(f"priority must be an integer, not {type(priority).__name__}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidWorkItem(
            f"priority {priority} is outside {MIN_PRIORITY}..{MAX_PRIORITY} (higher runs sooner)"
        )
    return priority


def _payload_json(payload: Any, what: str = "payload") -> str:
    too_deep = f"{what} nests deeper than {MAX_DEPTH} levels (the table's limit)"
    try:
        text = json.dumps(
            payload, allow_nan=False, ensure_ascii=False, separators=(",", ":")
        )  # pragma: no mutate
    except RecursionError:
        raise InvalidWorkItem(too_deep) from None
    except (TypeError, ValueError) as exc:
        raise InvalidWorkItem(f"{what} is not JSON-serialisable: {exc}") from exc
    if "\\u0000" in text:
        raise InvalidWorkItem(f"{what} must not contain NUL characters (jsonb rejects them)")
    # Each level of nesting is a bracket in the text, so fewer brackets than the limit
    # cannot nest too deeply; only a payload with more is measured.
    if text.count("[") + text.count("{") >= MAX_DEPTH and depth(payload) > MAX_DEPTH:
        raise InvalidWorkItem(too_deep)
    _check_unicode(what, text)
    size = len(text.encode())
    if size > MAX_PAYLOAD_BYTES:
        raise InvalidWorkItem(f"{what} is {size} bytes as JSON; the limit is {MAX_PAYLOAD_BYTES}")
    return text


def result_json(value: Any, what: str = "result") -> str | None:
    """A handler's result (or a step's value, `what` naming it) as the JSON text to
    store, under a payload's bounds; None for None (no result). UnstorableResult says
    why it cannot be stored: nothing of it is."""
    if value is None:
        return None
    try:
        return _payload_json(value, what)
    except InvalidWorkItem as exc:
        raise UnstorableResult(str(exc)) from None


def _trace_context_json(trace_context: object) -> str | None:
    """A propagator's carrier (str to str) as JSON text; None for none or an empty one."""
    if trace_context is None:
        return None
    if not isinstance(trace_context, Mapping):
        raise InvalidWorkItem(
            f"trace_context must be a mapping of str to str, not {type(trace_context).__name__}"
        )
    for key, value in trace_context.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidWorkItem(
                f"trace_context maps str to str, not {type(key).__name__} to {type(value).__name__}"
            )
    if not trace_context:
        return None
    for text in (*trace_context.keys(), *trace_context.values()):
        _check_unicode("trace_context", text)
    text = json.dumps(dict(trace_context), separators=(",", ":"))
    if "\\u0000" in text:
        raise InvalidWorkItem("trace_context must not contain NUL characters")
    size = len(text.encode())
    if size > MAX_TRACE_CONTEXT_BYTES:
        raise InvalidWorkItem(
            f"trace_context is {size} bytes as JSON; the limit is {MAX_TRACE_CONTEXT_BYTES}"
        )
    return text


def _check_run_after(run_after: object, now: dt.datetime) -> tuple[dt.datetime | None, float]:
    if run_after is None:
        return None, 0.0
    if isinstance(run_after, dt.timedelta):
        if abs(run_after) > MAX_RUN_AFTER_DISTANCE:
            raise InvalidWorkItem(
                f"run_after {run_after} is further than {MAX_RUN_AFTER_DISTANCE.days} days away"
            )
        return None, run_after.total_seconds()
    if isinstance(run_after, dt.datetime):
        if run_after.tzinfo is None or run_after.utcoffset() is None:
            raise InvalidWorkItem("run_after must be timezone-aware")
        if abs(run_after - now) > MAX_RUN_AFTER_DISTANCE:
            raise InvalidWorkItem(
                f"run_after {run_after.isoformat()} is further than"
                f" {MAX_RUN_AFTER_DISTANCE.days} days from now"
            )
        return run_after, 0.0
    raise InvalidWorkItem(
        f"run_after must be a datetime or a timedelta, not {type(run_after).__name__}"
    )
