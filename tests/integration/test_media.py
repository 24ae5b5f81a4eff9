"""The media library's handlers on real PostgreSQL and real files, run by a Worker."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from examples import media
from examples.media import _files
from examples.media._db import MediaDb
from tests.support.contexts import a_context
from trioworker import (
    Context,
    ItemState,
    Lost,
    PostgresStore,
    Settings,
    Status,
    Worker,
    WorkItem,
    open_store,
)

SETTINGS = Settings(lease=8, heartbeat=1, poll=0.5, recovery_every=1)
Conn = psycopg.Connection[Any]


@pytest.fixture
def library(pg: Conn) -> Iterator[media.Library]:
    yield media.Library(pg)


@pytest.fixture
async def worker_store(dsn: str) -> AsyncIterator[PostgresStore]:
    async with open_store(dsn) as store, trio.open_nursery() as nursery:
        worker = Worker(store, media.registry, SETTINGS, worker_id="w", fail_stop=pytest.fail)
        await nursery.start(worker.run)
        yield store
        nursery.cancel_scope.cancel()


async def run(store: PostgresStore, kind: str, scope: str | None, **payload: Any) -> ItemState:
    """Enqueue one item and wait for it to finish."""
    item = await store.enqueue(kind, scope=scope, payload=payload)
    with trio.fail_after(30):
        while True:
            state = await store.get_item(item.id)
            assert state is not None
            if state.status.is_terminal:
                return state
            await trio.sleep(0.05)


def config(library: media.Library, tmp_path: Path, name: str = "c1", files: int = 10) -> Path:
    root, proxies = tmp_path / name / "originals", tmp_path / name / "proxies"
    media.make_originals(root, files=files, seed=7, size=4096, duplicates=2)
    library.add_config(name, "alice", root, proxies)
    return proxies


def active(pg: Conn, config_id: str = "c1") -> dict[str, int]:
    rows = pg.execute(
        "SELECT content_hash, id FROM media_assets WHERE config_id = %s AND status = 'Active'",
        (config_id,),
    ).fetchall()
    return {h: i for h, i in rows}


async def test_crawl_registers_each_content_once_with_its_proxies(
    library: media.Library, worker_store: PostgresStore, pg: Conn, tmp_path: Path
) -> None:
    """A crawl registers every distinct content of the folder once (10 files, 2 of them
    copies) with sound proxies; a second crawl adds nothing."""
    proxies = config(library, tmp_path)
    assert (await run(worker_store, "Crawl", "c1")).status is Status.SUCCEEDED
    assert len(active(pg)) == 8
    assert library.audit(["c1"]) == media.Audit(active=8, missing=())
    assert len(_files.proxy_folders(proxies)) == 8
    assert (await run(worker_store, "Crawl", "c1")).status is Status.SUCCEEDED
    assert pg.execute("SELECT count(*) FROM media_assets").fetchone() == (8,)


async def test_purge_keeps_proxies_an_active_asset_shares(
    library: media.Library, worker_store: PostgresStore, pg: Conn, tmp_path: Path
) -> None:
    """Soft-delete, crawl (the content is still there: new active assets), purge: the
    proxies are the new assets' now, so they stay. Soft-delete, purge: they go."""
    proxies = config(library, tmp_path)
    await run(worker_store, "Crawl", "c1")
    gone = library.soft_delete_some("c1", 3)
    await run(worker_store, "Crawl", "c1")
    assert len(active(pg)) == 8
    await run(worker_store, "Purge", "c1")
    left = pg.execute("SELECT count(*) FROM media_assets WHERE id = ANY(%s)", (gone,))
    assert left.fetchone() == (0,)
    assert library.audit(["c1"]).ok and len(_files.proxy_folders(proxies)) == 8

    library.soft_delete_some("c1", 3)
    assert (await run(worker_store, "Purge", "c1")).status is Status.SUCCEEDED
    assert len(active(pg)) == 5
    assert library.audit(["c1"]).ok and len(_files.proxy_folders(proxies)) == 5


async def test_burst_detection_groups_by_capture_time(
    library: media.Library, worker_store: PostgresStore, pg: Conn, tmp_path: Path
) -> None:
    """Assets captured within two seconds of each other share a burst."""
    root = tmp_path / "b" / "originals"
    root.mkdir(parents=True)
    for n, t in enumerate([0, 1, 1.5, 100, 200, 201]):
        path = root / f"{n}.raw"
        path.write_bytes(os.urandom(512))
        os.utime(path, (1e9 + t, 1e9 + t))
    library.add_config("b", "bob", root, tmp_path / "b" / "proxies")
    await run(worker_store, "Crawl", "b")
    assert (await run(worker_store, "BurstDetection", "b")).status is Status.SUCCEEDED
    sizes = pg.execute("SELECT size FROM media_bursts ORDER BY started_at").fetchall()
    assert sizes == [(3,), (2,)]


async def test_proxy_sweep_deletes_only_old_orphans(
    library: media.Library, worker_store: PostgresStore, pg: Conn, tmp_path: Path
) -> None:
    """Orphans older than the floor go; young orphans and known contents stay, even
    when their folders are old."""
    proxies = config(library, tmp_path)
    await run(worker_store, "Crawl", "c1")
    old = time.time() - 7200
    for folder in [proxies / p for p in os.listdir(proxies)]:
        for sub in folder.rglob("*"):
            os.utime(sub, (old, old))
    orphans = media.make_orphan_proxies(proxies, count=3, seed=1, age=7200)
    young = media.make_orphan_proxies(proxies, count=2, seed=2, age=10)
    assert (await run(worker_store, "ProxySweep", None)).status is Status.SUCCEEDED
    left = set(_files.proxy_folders(proxies))
    assert not left & set(orphans)
    assert set(young) <= left
    assert library.audit(["c1"]).ok


async def test_unscoped_proxy_deletion_clears_only_a_removed_config(
    library: media.Library, worker_store: PostgresStore, tmp_path: Path
) -> None:
    """An unscoped ProxyDeletion of a live config fails with its reason; of a removed
    config it deletes the config's proxies."""
    proxies = config(library, tmp_path)
    await run(worker_store, "Crawl", "c1")
    refused = await run(worker_store, "ProxyDeletion", None, config_id="c1")
    assert refused.status is Status.FAILED and refused.reason == "handler said not to retry"
    assert "is live" in (refused.error or "")
    library.remove_config("c1")
    assert (await run(worker_store, "ProxyDeletion", None, config_id="c1")).status is (
        Status.SUCCEEDED
    )
    assert not proxies.exists()


async def test_token_cleanup_and_retention(
    library: media.Library, worker_store: PostgresStore, pg: Conn, tmp_path: Path
) -> None:
    """Expired share tokens are deleted, live ones kept; retention deletes finished
    items older than its cut-off."""
    config(library, tmp_path)
    live = library.add_token("c1", 3600)
    library.add_token("c1", -60)
    await run(worker_store, "TokenCleanup", None)
    assert pg.execute("SELECT token FROM media_share_tokens").fetchall() == [(live,)]
    pg.execute("UPDATE work_items SET finished_at = now() - interval '2 days'")
    await run(worker_store, "WorkItemRetention", None, older_than_seconds=86400)
    kinds = pg.execute("SELECT kind FROM work_items").fetchall()
    assert kinds == [("WorkItemRetention",)]


async def test_a_write_of_an_attempt_that_lost_its_item_writes_nothing(
    library: media.Library, store: PostgresStore, pg: Conn, tmp_path: Path
) -> None:
    """The fence: a write under an old attempt number raises Lost and commits nothing;
    under the current attempt it commits."""
    config(library, tmp_path)
    await store.enqueue("TokenCleanup")
    claimed = await store.claim("w", 30, kinds=["TokenCleanup"])
    assert claimed is not None
    library.add_token("c1", -60)

    def context(item: WorkItem) -> Context:
        return a_context(store, item)[0]

    stale = WorkItem(claimed.id, claimed.kind, None, {}, attempt=claimed.attempt - 1)
    with pytest.raises(Lost):
        await MediaDb(context(stale)).write([("delete_expired_tokens", {})])
    assert pg.execute("SELECT count(*) FROM media_share_tokens").fetchone() == (1,)
    await MediaDb(context(claimed)).write([("delete_expired_tokens", {})])
    assert pg.execute("SELECT count(*) FROM media_share_tokens").fetchone() == (0,)


def test_group_bursts() -> None:
    """Gaps within the limit chain into one burst; singletons are not bursts."""
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    at = [t0 + dt.timedelta(seconds=s) for s in (0, 1, 3, 10, 30, 31)]
    bursts = media.group_bursts(enumerate(at), gap=dt.timedelta(seconds=2))
    assert [b.asset_ids for b in bursts] == [(0, 1, 2), (4, 5)]
    assert bursts[0].started_at == at[0] and bursts[0].ended_at == at[2]


async def test_a_crawl_cut_off_halfway_resumes_at_the_folder_it_had_not_finished(
    library: media.Library, worker_store: PostgresStore, pg: Conn, tmp_path: Path
) -> None:
    """Each folder a crawl scanned is a durable step. Folder c holds a file that cannot
    be read yet (a dangling link), so the first attempt fails after recording a and b;
    once the file is there, a retry records c alone, a and b coming back recorded, and
    the crawl's result counts every folder."""
    root, proxies = tmp_path / "c1" / "originals", tmp_path / "c1" / "proxies"
    for folder in ("a", "b", "c"):
        (root / folder).mkdir(parents=True)
        for n in range(3):
            (root / folder / f"{n}.raw").write_bytes(f"{folder}{n}".encode() * 512)
    late = tmp_path / "late.raw"
    (root / "c" / "3.raw").symlink_to(late)
    library.add_config("c1", "alice", root, proxies)
    item = await worker_store.enqueue("Crawl", scope="c1")

    def steps() -> list[tuple[str, int]]:
        rows = pg.execute(
            "SELECT name, attempt FROM work_steps WHERE item_id = %s ORDER BY name", [item.id]
        )
        return [(name, attempt) for name, attempt in rows.fetchall()]

    attempts = "SELECT count(*) FROM work_attempts WHERE item_id = %s"
    with trio.fail_after(30):
        while True:  # the first attempt failed, a and b recorded
            if pg.execute(attempts, [item.id]).fetchone() == (1,):
                break
            await trio.sleep(0.05)
    assert steps() == [("scan folder a", 1), ("scan folder b", 1)]
    late.write_bytes(b"late" * 512)
    assert await worker_store.result(item.id, timeout=30) == {"originals": 10, "new": 10}
    state = await worker_store.get_item(item.id)
    assert state is not None and state.attempt >= 2
    assert steps() == [
        ("scan folder a", 1), ("scan folder b", 1), ("scan folder c", state.attempt),
    ]  # fmt: skip
    assert len(active(pg)) == 10
