"""The dashboard's actions (retry, cancel, pause, resume, quiesce): what each reads
from its form, which store call it makes, and what it reports.

They run only on a dashboard started with --allow-actions, for a request that
`_app.Dashboard.authorize` let through (docs/dashboard.md). Each one is logged.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from trioworker._core.errors import InvalidLimit
from trioworker._core.model import CancelOutcome
from trioworker._store.api import Store
from trioworker._store.quiesce import quiesce as quiesce_scope

Form = dict[str, list[str]]
#: The longest a quiesce action waits for a scope's Running item (a request is held
#: that long), and its default.
MAX_QUIESCE_SECONDS = 300.0
DEFAULT_QUIESCE_SECONDS = 30.0
MAX_RETRY_IDS = 1000
MAX_NAME = 200
#: What an HTML form cannot carry back as the page showed it: the HTML parser reads a
#: CR in the page as LF, a form posted without the page's script sends every line break
#: as CRLF, and NUL is never part of a name. A name with one is refused, not changed.
UNSENDABLE = {"\r": "a line break", "\n": "a line break", "\x00": "a NUL"}
#: An id or a count: ASCII digits only (int() takes every script's digits).
ASCII_NUMBER = re.compile(r"[0-9]{1,19}")
_SECONDS = re.compile(r"[0-9]{1,6}(\.[0-9]{1,6})?")


class Refused(Exception):
    """A request the dashboard will not carry out: its HTTP status and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@attrs.frozen
class Outcome:
    """What an action did: its message, HTTP status and details for JSON clients."""

    message: str
    status: int = 200
    details: dict[str, Any] = attrs.field(factory=dict)


def _given(form: Form, field: str) -> str | None:
    """The field's value exactly as sent (an empty one is no value), given once."""
    values = [v for v in form.get(field, []) if v]
    if len(values) > 1:
        raise Refused(400, f"give {field} once")
    return values[0] if values else None


def _name(form: Form, field: str) -> str | None:
    """A kind or scope exactly as sent, never stripped: the one the page showed."""
    name = _given(form, field)
    if name is None:
        return None
    if len(name) > MAX_NAME:
        raise Refused(400, f"a {field} is at most {MAX_NAME} characters")
    for char, what in UNSENDABLE.items():
        if char in name:
            raise Refused(
                400,
                f"the dashboard cannot act on a {field} with {what} in it: a browser's form"
                " does not send it back as shown (use the CLI)",
            )
    return name


def _number(form: Form, field: str) -> str | None:
    """A number's text (surrounding whitespace dropped)."""
    text = _given(form, field)
    return None if text is None else text.strip() or None


def _id(text: str) -> int:
    text = text.strip()
    if not ASCII_NUMBER.fullmatch(text) or not 1 <= int(text) <= 2**63 - 1:
        raise Refused(400, f"not an item id: {text[:40]!r}")
    return int(text)


def _target(form: Form) -> tuple[str | None, str | None]:
    kind, scope = _name(form, "kind"), _name(form, "scope")
    if (kind is None) == (scope is None):
        raise Refused(400, "give exactly one of kind and scope")
    return kind, scope


def shown(name: str) -> str:
    """A name as a message writes it: bare when it reads unambiguously, else quoted
    with its escapes (`' ws '`, `'a\\x1bb'`)."""
    plain = name.isprintable() and name == name.strip() and name[:1] not in "'\""
    return name if plain else repr(name)


def _named(kind: str | None, scope: str | None) -> str:
    return f"kind {shown(kind)}" if kind is not None else f"scope {shown(scope or '')}"


async def cancel(store: Store, form: Form) -> Outcome:
    text = _number(form, "id")
    if text is None:
        raise Refused(400, "give the id of the item to cancel")
    id = _id(text)
    outcome = await store.cancel(id)
    messages = {
        CancelOutcome.CANCELLED: (200, f"item {id} cancelled (it had not started)"),
        CancelOutcome.REQUESTED: (200, f"item {id} is running: asked it to stop"),
        CancelOutcome.ALREADY_FINISHED: (409, f"item {id} had already finished"),
        CancelOutcome.NOT_FOUND: (404, f"no item {id}"),
    }
    status, message = messages[outcome]
    return Outcome(message, status, {"id": id, "outcome": outcome.value})


async def retry(store: Store, form: Form) -> Outcome:
    texts = [v for v in form.get("id", []) if v.strip()]
    if not texts:
        raise Refused(400, "give the ids of the items to retry")
    if len(texts) > MAX_RETRY_IDS:
        raise Refused(400, f"retry at most {MAX_RETRY_IDS} items at once")
    ids = sorted({_id(t) for t in texts})
    retried = await store.retry(ids)
    if len(ids) == 1:
        message = (
            f"item {ids[0]} queued again"
            if retried
            else f"item {ids[0]} was not retried (not Failed or Cancelled, or a Queued item"
            " holds its dedup key)"
        )
    else:
        message = f"{len(retried)} of {len(ids)} items queued again"
    return Outcome(message, 200 if retried else 409, {"asked": ids, "retried": list(retried)})


async def pause(store: Store, form: Form) -> Outcome:
    kind, scope = _target(form)
    added = await store.pause(kind=kind, scope=scope)
    named = _named(kind, scope)
    message = f"{named} paused" if added else f"{named} was already paused"
    return Outcome(message, 200, {"kind": kind, "scope": scope, "changed": added})


async def resume(store: Store, form: Form) -> Outcome:
    kind, scope = _target(form)
    removed = await store.resume(kind=kind, scope=scope)
    named = _named(kind, scope)
    message = f"{named} resumed" if removed else f"{named} was not paused"
    return Outcome(message, 200, {"kind": kind, "scope": scope, "changed": removed})


async def quiesce(store: Store, form: Form) -> Outcome:
    scope = _name(form, "scope")
    if scope is None:
        raise Refused(400, "give the scope to quiesce")
    text = _number(form, "timeout")
    if text is not None and not _SECONDS.fullmatch(text):
        raise Refused(400, f"timeout must be a number of seconds, not {text[:40]!r}")
    timeout = float(text) if text is not None else DEFAULT_QUIESCE_SECONDS
    if not 0 < timeout <= MAX_QUIESCE_SECONDS:
        raise Refused(400, f"timeout must be above 0 and at most {MAX_QUIESCE_SECONDS:g} s")
    result = await quiesce_scope(store, scope, timeout=timeout)
    done, waited, holder = result.done, result.waited, result.holder
    named = _named(None, scope)
    if done:
        message = f"{named} is quiet (waited {waited:.1f} s)"
    else:
        message = f"{named} is still busy after {waited:.1f} s" + (f" ({holder})" if holder else "")
    details = {"scope": scope, "done": done, "waited": waited, "holder": holder}
    return Outcome(message, 200 if done else 202, details)  # 202: paused, not yet quiet


async def limit(store: Store, form: Form) -> Outcome:
    """Set a scope's or a kind's running limit and/or rate (docs/design/limits.md)."""
    kind, scope = _target(form)
    running_text, rate = _number(form, "running"), _number(form, "rate")
    if running_text is not None and not ASCII_NUMBER.fullmatch(running_text):
        raise Refused(400, f"a running limit is a whole number, not {running_text[:40]!r}")
    running = None if running_text is None else int(running_text)
    try:
        set_to = await store.set_limit(kind=kind, scope=scope, running=running, rate=rate)
    except InvalidLimit as exc:
        raise Refused(400, str(exc)) from None
    held = [f"at most {set_to.running} Running"] if set_to.running is not None else []
    held += [f"at most {set_to.rate} starts"] if set_to.rate is not None else []
    message = f"{_named(kind, scope)}: {', '.join(held)}"
    details = {"kind": kind, "scope": scope, "running": set_to.running,
               "rate": None if set_to.rate is None else str(set_to.rate)}  # fmt: skip
    return Outcome(message, 200, details)


ACTIONS: dict[str, Callable[[Store, Form], Awaitable[Outcome]]] = {
    "cancel": cancel,
    "retry": retry,
    "pause": pause,
    "resume": resume,
    "quiesce": quiesce,
    "limit": limit,
}
