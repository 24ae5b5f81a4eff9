"""Built-in retention: a periodic unscoped item that deletes old finished items.

`Registry.retention(older_than=...)` (or `run --retain 7d`) registers its handler and
its schedule; whichever Worker claims the hourly item prunes, in bounded batches.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from trioworker._core.model import WorkItem

if TYPE_CHECKING:
    from trioworker._worker.context import Context

#: The kind of the retention item.
RETENTION_KIND = "trioworker.retention"


async def prune_finished(item: WorkItem, ctx: Context) -> None:
    """Delete finished items older than the payload's `older_than` seconds."""
    older_than = dt.timedelta(seconds=float(item.payload["older_than"]))
    longest = 0.0

    def note(rows: int, seconds: float) -> None:
        nonlocal longest
        longest = max(longest, seconds)

    deleted = await ctx.store.delete_finished(older_than, on_batch=note)
    ctx.log.info(
        "retention: deleted %d finished item(s) older than %s (longest batch %.3fs)",
        deleted,
        older_than,
        longest,
    )
