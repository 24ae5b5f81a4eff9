"""The chaos test's app: the recording test handler, a handler that fails on purpose,
and the media library's handlers, all logging attempts to one observer file.

Record and Doomed write to $TW_OBSERVER_LOG; the media handlers to
$TRIOWORKER_MEDIA_OBSERVER_LOG. The harness points both at the same file.
"""

from __future__ import annotations

from examples import media
from tests.apps.recording import record, record_attempt
from trioworker import Context, DoNotRetry, Registry, WorkItem

registry = Registry()
registry.handler("Record")(record_attempt)
media.register(registry)


@registry.handler("Doomed")
async def doomed(item: WorkItem, ctx: Context) -> None:
    """Fails for good, with the reason the queue states for it."""
    record("start", item, ctx)
    record("end", item, ctx)
    raise DoNotRetry("doomed on purpose")
