"""Enqueue input checks: what is refused, with which message, and what passes through."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from trioworker import InvalidWorkItem, NewItem
from trioworker._core.jsontext import MAX_DEPTH
from trioworker._core.validation import (
    MAX_NAME_LENGTH,
    MAX_PARENTS,
    MAX_PAYLOAD_BYTES,
    MAX_RUN_AFTER_DISTANCE,
    EnqueueRequest,
    validate_enqueue,
    validate_many,
)

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
NAMES = ["kind", "scope", "dedup_key"]


def refused(message: str, **kwargs: object) -> None:
    """validate_enqueue(**kwargs) raises InvalidWorkItem with exactly `message`."""
    kwargs.setdefault("kind", "K")
    with pytest.raises(InvalidWorkItem, match=f"^{re.escape(message)}$"):
        validate_enqueue(now=NOW, **kwargs)  # type: ignore[arg-type]


def test_the_request_carries_the_input_through() -> None:
    """A valid request comes back as the store writes it."""
    assert validate_enqueue(
        "Crawl", "cfg-1", {"path": "/m", "n": [1, 2]}, "crawl:cfg-1", priority=5, now=NOW
    ) == EnqueueRequest(
        kind="Crawl",
        scope="cfg-1",
        payload_json='{"path":"/m","n":[1,2]}',
        priority=5,
        dedup_key="crawl:cfg-1",
        run_at=None,
        delay=0.0,
    )


@pytest.mark.parametrize(
    ("payload", "text"), [(None, "{}"), ([], "[]"), (0, "0"), ("", '""'), (False, "false")]
)
def test_no_payload_is_an_empty_object_but_falsy_payloads_are_kept(
    payload: object, text: str
) -> None:
    """Only a missing payload becomes {}; an empty list, 0 or "" is stored as given."""
    assert validate_enqueue("K", payload=payload, now=NOW).payload_json == text


@pytest.mark.parametrize("what", NAMES)
@pytest.mark.parametrize(("value", "type_name"), [(7, "int"), (b"x", "bytes"), (["x"], "list")])
def test_names_must_be_strings(what: str, value: object, type_name: str) -> None:
    """Kind, scope and dedup key must be strings; the error names the field and type."""
    refused(f"{what} must be a string, not {type_name}", **{what: value})


def test_kind_is_required_but_scope_and_dedup_key_are_optional() -> None:
    """A missing kind is refused; a missing scope or dedup key is fine and stays None."""
    refused("kind must be a string, not NoneType", kind=None)
    request = validate_enqueue("K", None, None, None, now=NOW)
    assert (request.scope, request.dedup_key) == (None, None)


@pytest.mark.parametrize("what", NAMES)
@pytest.mark.parametrize("value", ["", " ", "\t\n"])
def test_names_must_not_be_blank(what: str, value: str) -> None:
    """An empty or whitespace-only name is refused."""
    refused(f"{what} must not be empty", **{what: value})


@pytest.mark.parametrize("what", NAMES)
def test_names_may_be_as_long_as_the_limit_and_no_longer(what: str) -> None:
    """A name of exactly MAX_NAME_LENGTH characters passes; one more is refused."""
    request = validate_enqueue(now=NOW, **{"kind": "K", what: "n" * MAX_NAME_LENGTH})  # type: ignore[arg-type]
    assert getattr(request, what) == "n" * MAX_NAME_LENGTH
    refused(
        f"{what} is longer than {MAX_NAME_LENGTH} characters",
        **{what: "n" * (MAX_NAME_LENGTH + 1)},
    )


@pytest.mark.parametrize("what", NAMES)
def test_names_must_not_contain_nul(what: str) -> None:
    """PostgreSQL text cannot hold NUL, so a name with one is refused up front."""
    refused(f"{what} must not contain NUL characters", **{what: "a\x00b"})


def test_a_kind_must_be_known_when_the_known_kinds_are_given() -> None:
    """With known_kinds, an unknown kind is refused, naming the known ones in order."""
    assert validate_enqueue("B", known_kinds={"B", "A"}, now=NOW).kind == "B"
    refused("unknown kind 'C' (known kinds: A, B)", kind="C", known_kinds={"B", "A"})
    refused("unknown kind 'C' (known kinds: none)", kind="C", known_kinds=set())


def test_a_payload_must_be_json() -> None:
    """A payload JSON cannot represent (a set, NaN) is refused, saying why."""
    with pytest.raises(InvalidWorkItem, match=r"^payload is not JSON-serialisable: .*set"):
        validate_enqueue("K", payload={1, 2}, now=NOW)
    with pytest.raises(InvalidWorkItem, match=r"^payload is not JSON-serialisable: Out of range"):
        validate_enqueue("K", payload={"x": float("nan")}, now=NOW)


def test_a_payload_must_not_contain_nul() -> None:
    """jsonb rejects \\u0000, so a payload string with NUL is refused up front."""
    refused("payload must not contain NUL characters (jsonb rejects them)", payload=["a\x00"])


def test_the_payload_limit_counts_the_bytes_of_compact_json() -> None:
    """The limit is on the JSON as stored, without spaces; the error gives both numbers."""
    at_limit = {"a": "x" * (MAX_PAYLOAD_BYTES - 8)}  # {"a":"..."} adds eight characters
    assert len(validate_enqueue("K", payload=at_limit, now=NOW).payload_json) == MAX_PAYLOAD_BYTES
    refused(
        f"payload is {MAX_PAYLOAD_BYTES + 1} bytes as JSON; the limit is {MAX_PAYLOAD_BYTES}",
        payload={"a": at_limit["a"] + "x"},
    )


@pytest.mark.parametrize("sign", [1, -1])
def test_a_delay_may_reach_the_limit_either_way_and_no_further(sign: int) -> None:
    """A timedelta up to MAX_RUN_AFTER_DISTANCE either way passes; beyond it, refused."""
    limit = sign * MAX_RUN_AFTER_DISTANCE
    assert validate_enqueue("K", run_after=limit, now=NOW).delay == limit.total_seconds()
    beyond = limit + sign * dt.timedelta(microseconds=1)
    refused(f"run_after {beyond} is further than 366 days away", run_after=beyond)


@pytest.mark.parametrize("sign", [1, -1])
def test_a_time_may_reach_the_limit_from_now_either_way_and_no_further(sign: int) -> None:
    """A datetime up to MAX_RUN_AFTER_DISTANCE from now passes; beyond it, refused."""
    at = NOW + sign * MAX_RUN_AFTER_DISTANCE
    assert validate_enqueue("K", run_after=at, now=NOW).run_at == at
    beyond = at + sign * dt.timedelta(microseconds=1)
    refused(f"run_after {beyond.isoformat()} is further than 366 days from now", run_after=beyond)


class NoOffset(dt.tzinfo):
    """A time zone that does not know its offset."""

    def utcoffset(self, when: dt.datetime | None) -> dt.timedelta | None:
        return None


@pytest.mark.parametrize("tzinfo", [None, NoOffset()])
def test_a_time_must_be_aware(tzinfo: dt.tzinfo | None) -> None:
    """A naive datetime, or one whose zone gives no offset, is refused."""
    refused("run_after must be timezone-aware", run_after=dt.datetime(2026, 12, 2, tzinfo=tzinfo))


@pytest.mark.parametrize(
    ("value", "type_name"), [(60, "int"), ("1m", "str"), (dt.date.today(), "date")]
)
def test_run_after_is_a_datetime_or_a_timedelta(value: object, type_name: str) -> None:
    """Anything else is refused, naming its type."""
    refused(f"run_after must be a datetime or a timedelta, not {type_name}", run_after=value)


@pytest.mark.parametrize("priority", [-1000, -1, 0, 7, 1000])
def test_priorities_from_minus_1000_to_1000_are_taken(priority: int) -> None:
    """Any integer priority in range reaches the store as given."""
    assert validate_enqueue("K", priority=priority, now=NOW).priority == priority


@pytest.mark.parametrize(
    ("priority", "message"),
    [
        (1001, "priority 1001 is outside -1000..1000 (higher runs sooner)"),
        (-1001, "priority -1001 is outside -1000..1000 (higher runs sooner)"),
        (True, "priority must be an integer, not bool"),
        (1.5, "priority must be an integer, not float"),
        ("3", "priority must be an integer, not str"),
    ],
)
def test_a_priority_out_of_range_or_not_an_integer_is_refused(
    priority: object, message: str
) -> None:
    """Priorities are integers in -1000..1000, checked before anything is written."""
    with pytest.raises(InvalidWorkItem) as raised:
        validate_enqueue("K", priority=priority, now=NOW)
    assert str(raised.value) == message


# -- trace_context (docs/adr/0010-tracing.md) ------------------------------------------

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_trace_context_reaches_the_store_as_compact_json() -> None:
    """A carrier of str to str (any mapping) is written as compact JSON text."""
    import types

    from trioworker._core.validation import MAX_TRACE_CONTEXT_BYTES

    carrier = types.MappingProxyType({"traceparent": TRACEPARENT, "tracestate": "a=1,b=2"})
    request = validate_enqueue("K", now=NOW, trace_context=carrier)
    assert request.trace_context_json == (
        '{"traceparent":"' + TRACEPARENT + '","tracestate":"a=1,b=2"}'
    )
    assert MAX_TRACE_CONTEXT_BYTES == 4096


@pytest.mark.parametrize("carrier", [None, {}])
def test_no_trace_context_or_an_empty_one_stores_none(carrier: object) -> None:
    """None and {} both mean no trace context: nothing is written for it."""
    assert validate_enqueue("K", now=NOW, trace_context=carrier).trace_context_json is None
    assert validate_enqueue("K", now=NOW).trace_context_json is None


def test_a_trace_context_of_exactly_the_limit_is_taken_and_one_byte_more_refused() -> None:
    """The limit counts the compact JSON's UTF-8 bytes: 4096 pass, 4097 do not."""
    from trioworker._core.validation import MAX_TRACE_CONTEXT_BYTES

    overhead = len('{"k":""}')
    fits = {"k": "x" * (MAX_TRACE_CONTEXT_BYTES - overhead)}
    request = validate_enqueue("K", now=NOW, trace_context=fits)
    assert request.trace_context_json is not None
    assert len(request.trace_context_json.encode()) == MAX_TRACE_CONTEXT_BYTES
    refused(
        "trace_context is 4097 bytes as JSON; the limit is 4096",
        trace_context={"k": "x" * (MAX_TRACE_CONTEXT_BYTES - overhead + 1)},
    )


@pytest.mark.parametrize(
    ("carrier", "message"),
    [
        ([("traceparent", TRACEPARENT)], "trace_context must be a mapping of str to str, not list"),
        (TRACEPARENT, "trace_context must be a mapping of str to str, not str"),
        ({"traceparent": 1}, "trace_context maps str to str, not str to int"),
        ({1: "x"}, "trace_context maps str to str, not int to str"),
        ({"a": "b", "c": None}, "trace_context maps str to str, not str to NoneType"),
        ({"traceparent": "a\x00b"}, "trace_context must not contain NUL characters"),
    ],
)
def test_a_trace_context_not_of_str_to_str_is_refused(carrier: object, message: str) -> None:
    """Only a mapping of str to str without NULs is a carrier."""
    refused(message, trace_context=carrier)


def test_enqueue_many_checks_each_items_trace_context() -> None:
    """A NewItem's trace context is checked as enqueue's, and named by index."""
    good = NewItem("K", trace_context={"traceparent": TRACEPARENT})
    requests = validate_many([good, NewItem("K")], now=NOW)
    assert [r.trace_context_json for r in requests] == [
        '{"traceparent":"' + TRACEPARENT + '"}',
        None,
    ]
    with pytest.raises(
        InvalidWorkItem, match=r"^item 1: trace_context maps str to str, not str to int$"
    ):
        validate_many([good, NewItem("K", trace_context={"a": 1})], now=NOW)  # type: ignore[dict-item]


def test_enqueue_many_checks_every_field_as_enqueue_does() -> None:
    """Each NewItem becomes the request enqueue would make of the same arguments (the
    default priority is 0), and kinds are checked against the known ones."""
    run_at = NOW + dt.timedelta(hours=1)
    item = NewItem("K", scope="s", payload={"n": 1}, dedup_key="d", run_after=run_at, priority=4)
    assert validate_many([item, NewItem("K")], now=NOW, known_kinds={"K"}) == [
        validate_enqueue("K", "s", {"n": 1}, "d", run_at, priority=4, now=NOW),
        EnqueueRequest("K", None, "{}", 0, None, None, 0.0),
    ]
    assert validate_enqueue("K", now=NOW).priority == 0
    with pytest.raises(InvalidWorkItem, match=r"^item 0: run_after .* days from now$"):
        validate_many([NewItem("K", run_after=NOW + dt.timedelta(days=400))], now=NOW)
    with pytest.raises(InvalidWorkItem, match=r"^item 0: unknown kind 'J' \(known kinds: K\)$"):
        validate_many([NewItem("J")], now=NOW, known_kinds={"K"})


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ("str", "enqueue_many takes a sequence of NewItem, not str"),
        ("set", "enqueue_many takes a sequence of NewItem, not set"),
        ("dict", "item 1: a NewItem, not dict"),
    ],
)
def test_enqueue_many_takes_only_a_sequence_of_new_items(shape: str, message: str) -> None:
    """A string, a set, or anything but NewItem in the batch is refused, naming it."""
    items = {"str": "KK", "set": {NewItem("K")}, "dict": [NewItem("K"), {"kind": "K"}]}[shape]
    with pytest.raises(InvalidWorkItem) as raised:
        validate_many(items, now=NOW)  # type: ignore[arg-type]
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("kind", "scope", "error"),
    [
        (None, None, "pause or resume a kind or a scope: give exactly one"),
        ("K", "7", "pause or resume a kind or a scope: give exactly one"),
        ("", None, "kind must not be empty"),
        (3, None, "kind must be a string, not int"),
        (None, "", "scope must not be empty"),
        (None, 3, "scope must be a string, not int"),
    ],
)
def test_a_pause_names_one_kind_or_one_scope(kind: object, scope: object, error: str) -> None:
    """Exactly one of the two, each checked like an item's."""
    from trioworker._core.validation import pause_target

    with pytest.raises(InvalidWorkItem) as raised:
        pause_target(kind, scope)
    assert str(raised.value) == error


def test_a_pause_target_is_returned_as_given() -> None:
    """(kind, None) or (None, scope)."""
    from trioworker._core.validation import pause_target

    assert pause_target("K", None) == ("K", None)
    assert pause_target(None, "7") == (None, "7")


def test_a_served_scope_follows_the_rules_of_an_items_scope() -> None:
    """A Worker's or quiesce's scope: a non-empty string (None is not a scope)."""
    from trioworker._core.validation import validate_scope

    assert validate_scope("7") == "7"
    for bad, error in [
        (None, "scope must be a string, not NoneType"),
        (" ", "scope must not be empty"),
    ]:
        with pytest.raises(InvalidWorkItem) as raised:
            validate_scope(bad)
        assert str(raised.value) == error


# -- what other programs pass: lone surrogates, deep nesting (issue 18) -----------------


def nested(levels: int, inner: object = None) -> object:
    """`levels` lists one inside the other, the innermost holding `inner` (empty when
    None): depth `levels`, or `levels + 1` with a scalar inside."""
    value: list[object] = [] if inner is None else [inner]
    for _ in range(levels - 1):
        value = [value]
    return value


def nested_objects(levels: int) -> object:
    value: dict[str, object] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


SURROGATE_MESSAGE = (
    "is not valid Unicode: it holds a lone surrogate (U+{:04X}, from bytes that are not UTF-8)"
)


@pytest.mark.parametrize("what", NAMES)
def test_names_must_be_valid_unicode(what: str) -> None:
    """What os.fsdecode makes of bytes that are not UTF-8: PostgreSQL cannot store it."""
    refused(f"{what} {SURROGATE_MESSAGE.format(0xDCE9)}", **{what: "caf\udce9"})


@pytest.mark.parametrize(
    "payload",
    [{"path": "/m/caf\udce9"}, {"caf\udce9": 1}, ["\ud800"], "\udfff"],
)
def test_a_payload_must_be_valid_unicode_in_its_keys_and_values(payload: object) -> None:
    with pytest.raises(InvalidWorkItem, match=r"^payload is not valid Unicode: it holds a"):
        validate_enqueue("K", payload=payload, now=NOW)


def test_a_payload_names_the_surrogate_it_holds() -> None:
    refused(f"payload {SURROGATE_MESSAGE.format(0xD800)}", payload={"a": "\ud800"})


def test_a_payload_keeps_its_unicode_and_is_measured_as_utf8() -> None:
    """Stored as UTF-8 (not \\u escapes): an astral character is one character, four
    bytes, and counts four against the limit."""
    request = validate_enqueue("K", payload={"e": "é😀"}, now=NOW)
    assert request.payload_json == '{"e":"é😀"}'
    fits = "😀" * ((MAX_PAYLOAD_BYTES - len('""')) // 4)
    assert validate_enqueue("K", payload=fits, now=NOW).payload_json == f'"{fits}"'
    refused(
        f"payload is {MAX_PAYLOAD_BYTES + 2} bytes as JSON; the limit is {MAX_PAYLOAD_BYTES}",
        payload=fits + "😀",
    )


@pytest.mark.parametrize(
    "payload",
    [
        nested(MAX_DEPTH),  # 64 empty lists: 64 levels, 64 brackets
        nested(MAX_DEPTH - 1, 1),  # 63 lists around a number: 64 levels
        nested_objects(MAX_DEPTH),
        {"text": "[" * 500, "more": "{" * 500},  # brackets in strings do not nest
    ],
)
def test_a_payload_may_nest_as_deeply_as_the_limit(payload: object) -> None:
    assert validate_enqueue("K", payload=payload, now=NOW).payload_json


@pytest.mark.parametrize(
    "payload",
    [
        nested(MAX_DEPTH + 1),
        nested(MAX_DEPTH, 1),  # 64 lists around a number: 65 levels, 64 brackets
        nested_objects(MAX_DEPTH + 1),
        nested(5000),  # past the recursion limit of json.dumps itself
    ],
)
def test_a_payload_nested_past_the_limit_is_refused(payload: object) -> None:
    refused("payload nests deeper than 64 levels (the table's limit)", payload=payload)


def test_a_trace_context_must_be_valid_unicode() -> None:
    refused(
        f"trace_context {SURROGATE_MESSAGE.format(0xDCE9)}",
        trace_context={"traceparent": "caf\udce9"},
    )
    refused(
        f"trace_context {SURROGATE_MESSAGE.format(0xD800)}",
        trace_context={"\ud800": "x"},
    )


def test_after_comes_back_ascending_and_each_id_once() -> None:
    """Any iterable of ids: sorted and de-duplicated; none or an empty list: ()."""
    assert validate_enqueue("K", after=[9, 3, 9, 5], now=NOW).after == (3, 5, 9)
    assert validate_enqueue("K", after=(i for i in (2, 1)), now=NOW).after == (1, 2)
    assert validate_enqueue("K", after=[], now=NOW).after == ()
    assert validate_enqueue("K", now=NOW).after == ()
    most = list(range(1, MAX_PARENTS + 1))
    assert validate_enqueue("K", after=most, now=NOW).after == tuple(most)
    assert validate_enqueue("K", after=[2**63 - 1], now=NOW).after == (2**63 - 1,)


@pytest.mark.parametrize(
    ("after", "message"),
    [
        (5, "after must be a list of item ids, not int"),
        (1.5, "after must be a list of item ids, not float"),
        ("12", "after must be a list of item ids, not str"),
        (b"12", "after must be a list of item ids, not bytes"),
        ([1, "2"], "after takes item ids (integers), not str"),
        ([True], "after takes item ids (integers), not bool"),
        ([1.0], "after takes item ids (integers), not float"),
        ([0], "after: 0 is not an item id"),
        ([-3], "after: -3 is not an item id"),
        ([2**63], f"after: {2**63} is not an item id"),
        (range(1, MAX_PARENTS + 2), f"after names {MAX_PARENTS + 1} items; at most {MAX_PARENTS}"),
    ],
)
def test_after_that_is_not_a_list_of_ids_is_refused(after: object, message: str) -> None:
    refused(message, after=after)


def test_an_item_after_others_takes_no_dedup_key() -> None:
    refused(
        "an item enqueued after others takes no dedup_key (a dedup key merges onto a"
        " Queued item, and this one waits)",
        after=[1],
        dedup_key="k",
    )
    assert validate_enqueue("K", dedup_key="k", after=[], now=NOW).dedup_key == "k"


def test_enqueue_many_names_the_bad_items_index() -> None:
    """validate_many's error carries the index of the item it is about."""
    with pytest.raises(InvalidWorkItem, match=r"^item 1: after: 0 is not an item id$") as bad:
        validate_many([NewItem("K"), NewItem("K", after=[0])], now=NOW)
    assert (bad.value.index, bad.value.reason) == (1, "after: 0 is not an item id")
    with pytest.raises(InvalidWorkItem, match=r"^item 1: a NewItem, not str$") as bad:
        validate_many([NewItem("K"), "K"], now=NOW)  # type: ignore[list-item]
    assert (bad.value.index, bad.value.reason) == (1, "a NewItem, not str")
