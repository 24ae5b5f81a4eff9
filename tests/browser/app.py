"""The browser tests' app: handlers whose items run briefly, run long, or fail.

Its Workers run as real `python -m trioworker run --app tests.browser.app:registry`
processes beside the dashboard under test.
"""

from __future__ import annotations

import trio

from trioworker import Context, Registry, RetryPolicy, WorkItem

registry = Registry()


@registry.handler("Thumbnail")
async def thumbnail(item: WorkItem, ctx: Context) -> None:
    """Sleeps payload["seconds"] (0.2 by default): an item that finishes soon."""
    await trio.sleep(float(item.payload.get("seconds", 0.2)))


@registry.handler("Crawl", limit=4)  # declared: the dashboard shows it (docs/guide/limits.md)
async def crawl(item: WorkItem, ctx: Context) -> None:
    """Sleeps payload["seconds"] (10 minutes by default): an item that keeps running."""
    await trio.sleep(float(item.payload.get("seconds", 600)))


@registry.handler("Transcode", retry=RetryPolicy(max_attempts=2, initial_delay=0.1, jitter=0.0))
async def transcode(item: WorkItem, ctx: Context) -> None:
    """Fails both its attempts as a handler with a bug does, with a traceback."""
    _probe(item.payload)


def _probe(payload: dict[str, str]) -> str:
    return payload["codec"]


@registry.handler("Digest")
async def digest(item: WorkItem, ctx: Context) -> None:
    """The nightly digest (a schedule the Workers write)."""


registry.periodic("Digest", cron="0 3 * * *", name="nightly-digest")
