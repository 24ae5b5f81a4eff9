"""Dependencies in the in-memory store (issue 34), as migrations/0003.dependencies.sql
holds them: which items each item was enqueued after, and the decisions that settle a
Waiting item. MemoryStore applies the decisions to its rows; nothing here touches one."""

from __future__ import annotations

import collections
from collections.abc import Iterable

import attrs

from trioworker._core.model import Status

#: The statuses of a child that still needs its parents: a parent it has is neither
#: deleted nor moved from Succeeded while it is in one (work_items_keep_needed_parents).
NEEDS_PARENTS = (Status.WAITING, Status.QUEUED, Status.RUNNING)
#: The statuses of a parent that cancel its Waiting children.
CANCEL_CHILDREN = (Status.FAILED, Status.CANCELLED)


@attrs.frozen
class Verdict:
    """What a Waiting item becomes: Queued, Cancelled (with its reason), or Waiting."""

    status: Status
    reason: str | None = None


def verdict(
    parents: Iterable[tuple[int, Status]], *, ended: tuple[int, Status] | None = None
) -> Verdict:
    """What a Waiting item with these parents (id, status) becomes (work_settle_waiting):
    Queued when every one has Succeeded; Cancelled, naming the parent, when one has
    Failed or was Cancelled (the lowest such id, before any still pending); else it
    waits. Settled by a parent's last transition (`ended`, its id and status), only that
    parent's outcome decides a cancel: a child left Waiting beside another Failed parent
    is that parent's to cancel."""
    undone = [(id, status) for id, status in parents if status is not Status.SUCCEEDED]
    if ended is not None:
        if ended[1] in CANCEL_CHILDREN:
            return _cancelled(*ended)
        return Verdict(Status.WAITING if undone else Status.QUEUED)
    if not undone:
        return Verdict(Status.QUEUED)
    id, status = min(undone, key=lambda p: (p[1] not in CANCEL_CHILDREN, p[0]))
    if status not in CANCEL_CHILDREN:
        return Verdict(Status.WAITING)
    return _cancelled(id, status)


def _cancelled(parent: int, status: Status) -> Verdict:
    how = "failed" if status is Status.FAILED else "was cancelled"
    return Verdict(Status.CANCELLED, f"parent {parent} {how}")


def cascade_reason(cancelled_parents: Iterable[int]) -> str:
    """The reason of a Waiting descendant cancelled with its parents: the lowest id of
    those cancelled at the level above it."""
    return f"parent {min(cancelled_parents)} was cancelled"


class Dependencies:
    """Each item's parents and children, as the table work_dependencies holds them: a
    pair goes with either of its items (ON DELETE CASCADE)."""

    def __init__(self) -> None:
        self._parents: dict[int, tuple[int, ...]] = {}
        self._children: collections.defaultdict[int, set[int]] = collections.defaultdict(set)

    def add(self, child: int, parents: Iterable[int]) -> None:
        self._parents[child] = tuple(sorted(set(parents)))
        for parent in self._parents[child]:
            self._children[parent].add(child)

    def parents(self, id: int) -> tuple[int, ...]:
        """Item `id`'s parents, ascending (none for an item enqueued without `after`)."""
        return self._parents.get(id, ())

    def children(self, id: int) -> list[int]:
        """The items enqueued after item `id`, ascending."""
        return sorted(self._children.get(id, ()))

    def forget(self, id: int) -> None:
        """Item `id` is deleted: its pairs go with it."""
        for parent in self._parents.pop(id, ()):
            self._children[parent].discard(id)
        for child in self._children.pop(id, set()):
            self._parents[child] = tuple(p for p in self._parents[child] if p != id)
