"""Dependencies in the in-memory store (issue 34), as migrations/0003.dependencies.sql
holds them: which items each item was enqueued after, and the decisions that settle a
Waiting item. MemoryStore applies the decisions to its rows; nothing here touches one."""

from __future__ import annotations

import collections
from collections.abc import Iterable

import attrs

from trioworker._core.model import Status

#: Not ended yet. A parent in one of these keeps its Waiting children waiting; a child
#: in one still needs its parents, which are neither deleted nor moved from Succeeded
#: meanwhile (work_items_keep_needed_parents).
PENDING = (Status.WAITING, Status.QUEUED, Status.RUNNING)

#: A parent's status as a Waiting child reads it: None for one that no longer exists
#: (deleted by retention, so it had ended, and nothing says how).
ParentStatus = Status | None


@attrs.frozen
class Verdict:
    """What a Waiting item becomes: Queued, Cancelled (with its reason), or Waiting."""

    status: Status
    reason: str | None = None


def verdict(
    parents: Iterable[tuple[int, ParentStatus]], *, ended: tuple[int, Status] | None = None
) -> Verdict:
    """What a Waiting item with these parents (id, status) becomes (work_settle_waiting):
    Queued when every one has Succeeded; Cancelled, naming the parent, when one has
    Failed, was Cancelled or no longer exists (the lowest such id, before any still
    pending); else it waits. Settled by a parent's last transition (`ended`, its id and
    status), only that parent's outcome decides a cancel: a child left Waiting beside
    another Failed parent is that parent's to cancel."""
    undone = [(id, status) for id, status in parents if status is not Status.SUCCEEDED]
    if ended is not None:
        if ended[1] is not Status.SUCCEEDED:
            return _cancelled(*ended)
        return Verdict(Status.WAITING if undone else Status.QUEUED)
    if not undone:
        return Verdict(Status.QUEUED)
    id, status = min(undone, key=lambda p: (p[1] in PENDING, p[0]))
    if status in PENDING:
        return Verdict(Status.WAITING)
    return _cancelled(id, status)


def _cancelled(parent: int, status: ParentStatus) -> Verdict:
    if status is Status.FAILED:
        how = "failed"
    elif status is Status.CANCELLED:
        how = "was cancelled"
    else:
        how = "no longer exists"
    return Verdict(Status.CANCELLED, f"parent {parent} {how}")


def cascade_reason(cancelled_parents: Iterable[int]) -> str:
    """The reason of a Waiting descendant cancelled with its parents: the lowest id of
    those cancelled at the level above it."""
    return f"parent {min(cancelled_parents)} was cancelled"


class Dependencies:
    """Each item's parents as it was enqueued after them (`after`, kept as written: one
    deleted since still counts), and each parent's children, as the table
    work_dependencies indexes them (a pair goes with either item)."""

    def __init__(self) -> None:
        self._after: dict[int, tuple[int, ...]] = {}
        self._children: collections.defaultdict[int, set[int]] = collections.defaultdict(set)

    def add(self, child: int, after: Iterable[int]) -> None:
        self._after[child] = tuple(sorted(set(after)))
        for parent in self._after[child]:
            self._children[parent].add(child)

    def after(self, id: int) -> tuple[int, ...]:
        """The ids item `id` was enqueued after, ascending (none without `after`)."""
        return self._after.get(id, ())

    def children(self, id: int) -> list[int]:
        """The items enqueued after item `id`, ascending, while it exists."""
        return sorted(self._children.get(id, ()))

    def forget(self, id: int) -> None:
        """Item `id` is deleted: its pairs go, as a child and as a parent (its children
        keep it in their `after`)."""
        for parent in self._after.pop(id, ()):
            self._children[parent].discard(id)
        self._children.pop(id, None)
