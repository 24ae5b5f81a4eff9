"""The media library's handlers: real file work on storage-config folders.

Scoped kinds take the storage config's id as their scope, so the queue runs at most one
of them per config at a time: Crawl, BurstDetection, Purge, and ProxyDeletion with a
scope. Purge relies on that. A soft-deleted asset's proxies live in the folder of its
content hash, which a crawl ingesting the same content again writes into; a purge
beside that crawl would delete the new asset's proxies for good.

Unscoped kinds are not serialised against anything: ProxySweep (orphan proxy folders
older than an hour, re-checked before each delete), an unscoped ProxyDeletion (the
proxies of a removed config), TokenCleanup and WorkItemRetention.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from examples.media import _files
from examples.media._db import MediaDb, Statement
from examples.media._observer import observed
from examples.media._plan import chunks, group_bursts
from trioworker import Context, DoNotRetry, Registry, RetryPolicy, WorkItem

#: Media handlers retry through a database restart or a short outage.
RETRY = RetryPolicy(max_attempts=10, initial_delay=0.5, max_delay=10.0)

#: Originals hashed per fenced registration; cancellation is honoured between files.
CRAWL_BATCH = 16

ORPHAN_MIN_AGE = 3600.0
RETENTION = dt.timedelta(days=7)


def _scope(item: WorkItem) -> str:
    if item.scope is None:
        raise DoNotRetry(f"{item.kind} needs a scope: the storage config's id")
    return item.scope


def _payload(item: WorkItem) -> dict[str, Any]:
    return item.payload if isinstance(item.payload, dict) else {}


async def _config(db: MediaDb, config_id: str) -> dict[str, Any]:
    rows = await db.rows("config", config_id=config_id)
    if not rows:
        raise DoNotRetry(f"no storage config {config_id!r}")
    return rows[0]


async def crawl(item: WorkItem, ctx: Context) -> dict[str, int]:
    """Register the config's originals and write the proxies of content that is new,
    one folder at a time, each a durable step: a crawl cut off halfway (a self-stop, a
    stall, a retry) resumes at the first folder it had not finished. Its result: how
    many originals and new assets it found."""
    config_id = _scope(item)
    db = MediaDb(ctx)
    config = await _config(db, config_id)
    if config["removed_at"] is not None:
        ctx.log.info("storage config %s was removed; nothing to crawl", config_id)
        return {"originals": 0, "new": 0}
    root, proxy_root = Path(config["root"]), Path(config["proxy_root"])
    active = frozenset(await db.column("active_hashes", config_id=config_id))
    originals = await ctx.run_in_thread(_files.list_originals, root)

    async def scan_folder(files: Sequence[str]) -> dict[str, int]:
        # Its writes commit batch by batch; run again (its step was not recorded), it
        # registers nothing twice: what it wrote is active now, read back above.
        nonlocal active
        new_assets = 0
        for batch in chunks(files, CRAWL_BATCH):
            scanned = await _scan_batch(ctx, batch, root, proxy_root, active)
            new = [s for s in scanned if s.wrote_proxies]
            await db.write([_registration(config_id, s) for s in new])
            active |= {s.content_hash for s in new}
            new_assets += len(new)
        return {"originals": len(files), "new": new_assets}

    found = {"originals": 0, "new": 0}
    for folder, files in _files.by_folder(originals):
        done = await ctx.step(_files.folder_step(folder), scan_folder, files)
        found = {k: found[k] + done[k] for k in found}
    ctx.log.info(
        "crawled %s: %d originals, %d new assets", config_id, found["originals"], found["new"]
    )
    return found


async def _scan_batch(
    ctx: Context, batch: Sequence[str], root: Path, proxy_root: Path, active: frozenset[str]
) -> list[_files.Scanned]:
    """Scan files in parallel within the Worker's file limiter. A cancel stops files not
    yet started, and waits for those in a thread (each is one small file)."""
    scanned: list[_files.Scanned] = []

    async def scan_one(relpath: str) -> None:
        scanned.append(await ctx.run_in_thread(_files.scan, root, relpath, proxy_root, active))

    async with trio.open_nursery() as nursery:
        for relpath in batch:
            nursery.start_soon(scan_one, relpath)
    return scanned


def _registration(config_id: str, s: _files.Scanned) -> Statement:
    kinds = list(_files.PROXY_KINDS)
    return (
        "register_asset",
        {
            "config_id": config_id,
            "content_hash": s.content_hash,
            "path": s.path,
            "size": s.size,
            "captured_at": s.captured_at,
            "kinds": kinds,
            "paths": [_files.proxy_relpath(s.content_hash, k) for k in kinds],
        },
    )


async def burst_detection(item: WorkItem, ctx: Context) -> None:
    """Group the config's active assets into bursts by capture time."""
    config_id = _scope(item)
    gap = dt.timedelta(seconds=float(_payload(item).get("gap_seconds", 2.0)))
    db = MediaDb(ctx)
    await _config(db, config_id)
    rows = await db.rows("captures", config_id=config_id)
    captures = [(r["id"], r["captured_at"]) for r in rows]
    bursts = group_bursts(captures, gap=gap)
    statements: list[Statement] = [("clear_bursts", {"config_id": config_id})]
    statements += [
        (
            "add_burst",
            {
                "config_id": config_id,
                "started_at": b.started_at,
                "ended_at": b.ended_at,
                "size": len(b.asset_ids),
                "asset_ids": list(b.asset_ids),
            },
        )
        for b in bursts
    ]
    await db.write(statements)
    ctx.log.info("%s: %d assets in %d bursts", config_id, len(captures), len(bursts))


async def purge(item: WorkItem, ctx: Context) -> None:
    """Delete the config's soft-deleted assets and their proxy files.

    The proxies stay when an active asset has the same content (it came back and was
    crawled again): they are its proxies now. Safe only because no crawl of this config
    runs meanwhile, which the scope rule guarantees.
    """
    config_id = _scope(item)
    db = MediaDb(ctx)
    proxy_root = Path((await _config(db, config_id))["proxy_root"])
    doomed = await db.rows("soft_deleted", config_id=config_id)
    kept = 0
    for asset in doomed:
        digest = asset["content_hash"]
        if await db.value("content_is_active", config_id=config_id, content_hash=digest):
            kept += 1
        else:
            await ctx.run_in_thread(_files.delete_proxies, proxy_root, digest)
        await db.write([("purge_asset", {"asset_id": asset["id"]})])
    ctx.log.info(
        "purged %d assets of %s (%d kept proxies an active asset shares)",
        len(doomed),
        config_id,
        kept,
    )


async def proxy_deletion(item: WorkItem, ctx: Context) -> None:
    """Scoped: delete the proxy folders of payload["hashes"] that no asset of the
    config has. Unscoped: delete every proxy of payload["config_id"], a removed config."""
    payload = _payload(item)
    db = MediaDb(ctx)
    if item.scope is None:
        config_id = str(payload.get("config_id", ""))
        config = await _config(db, config_id)
        if config["removed_at"] is None:
            raise DoNotRetry(
                f"storage config {config_id!r} is live: an unscoped ProxyDeletion only"
                " clears a removed config (enqueue it with the config as its scope)"
            )
        deleted = await ctx.run_in_thread(_files.delete_tree, Path(config["proxy_root"]))
        ctx.log.info("removed config %s: proxies deleted: %s", config_id, deleted)
        return
    config_id = item.scope
    proxy_root = Path((await _config(db, config_id))["proxy_root"])
    count = 0
    for digest in payload.get("hashes", []):
        if not await db.value("content_is_known", config_id=config_id, content_hash=digest):
            count += await ctx.run_in_thread(_files.delete_proxies, proxy_root, digest)
    ctx.log.info("%s: deleted %d proxy folders", config_id, count)


async def proxy_sweep(item: WorkItem, ctx: Context) -> None:
    """Delete proxy folders no asset has, untouched for payload["min_age_seconds"]
    (default an hour); each is checked again, in the database and on disk, right
    before it is deleted. Safe beside a crawl: a crawl's fresh writes are young."""
    min_age = float(_payload(item).get("min_age_seconds", ORPHAN_MIN_AGE))
    db = MediaDb(ctx)
    deleted = 0
    for config in await db.rows("live_configs"):
        proxy_root = Path(config["proxy_root"])
        for digest in await ctx.run_in_thread(_files.proxy_folders, proxy_root):
            if not await ctx.run_in_thread(_files.older_than, proxy_root, digest, min_age):
                continue
            if await db.value("content_is_known", config_id=config["id"], content_hash=digest):
                continue
            deleted += await ctx.run_in_thread(
                _files.delete_if_still_old, proxy_root, digest, min_age
            )
    ctx.log.info("proxy sweep: deleted %d orphan proxy folders", deleted)


async def token_cleanup(item: WorkItem, ctx: Context) -> None:
    """Delete expired share tokens."""
    db = MediaDb(ctx)
    await db.write([("delete_expired_tokens", {})])


async def work_item_retention(item: WorkItem, ctx: Context) -> None:
    """Delete work items finished longer than payload["older_than_seconds"] ago (7 days)."""
    seconds = _payload(item).get("older_than_seconds")
    older_than = dt.timedelta(seconds=float(seconds)) if seconds is not None else RETENTION
    deleted = await ctx.store.delete_finished(older_than)
    ctx.log.info("retention: deleted %d finished work items", deleted)


HANDLERS = {
    "Crawl": crawl,
    "BurstDetection": burst_detection,
    "Purge": purge,
    "ProxyDeletion": proxy_deletion,
    "ProxySweep": proxy_sweep,
    "TokenCleanup": token_cleanup,
    "WorkItemRetention": work_item_retention,
}


def register(registry: Registry, *, retry: RetryPolicy = RETRY) -> None:
    """Add the media handlers to `registry`, each logging its attempts to the observer
    log when $TRIOWORKER_MEDIA_OBSERVER_LOG is set."""
    for kind, handler in HANDLERS.items():
        registry.handler(kind, retry=retry)(observed(handler))
