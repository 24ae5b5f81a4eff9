"""A handler's context outside a Worker: for tests that call a handler's code (or a
helper of it) directly, with the attempt's self-stop deadline where the test puts it."""

from __future__ import annotations

import logging
import math

import trio

from trioworker import Context, WorkItem
from trioworker._core.policy import CancelReason
from trioworker._store.api import Store
from trioworker._worker.attempt import Attempt, Slots
from trioworker._worker.context import Shared
from trioworker._worker.executor import _NoTracer


def a_context(store: Store, item: WorkItem, deadline: float = math.inf) -> tuple[Context, Attempt]:
    """`item`'s context on `store`, its attempt's deadline at `deadline` (Trio's clock)."""
    shared = Shared(
        "w",
        trio.CapacityLimiter(1),
        store,
        store.fenced_transaction,
        logging.getLogger("test"),
        steps=store,
        lost=lambda attempt: attempt.stop(CancelReason.LOST),
    )
    (slot,) = Slots(1, lambda: None).take_free()
    attempt = Attempt(item, deadline, slot, _NoTracer().start(item))
    return Context(shared, attempt), attempt
