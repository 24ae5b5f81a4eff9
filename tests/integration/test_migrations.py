"""Migrations: they produce exactly docs/schema.sql, and run safely side by side."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import psycopg.conninfo
import pytest
import trio

from examples import media
from tests.support.database import Databases
from tests.support.lines import wait_until_blocked
from tests.support.schema import describe
from trioworker import (
    QUEUE_MIGRATION_HEAD,
    SchemaNotReady,
    check_schema,
    check_schema_async,
    migrate,
    migrate_async,
)
from trioworker._postgres.migrate import MIGRATION_LOCK, migrations_dir, pending_migrations

ROOT = Path(__file__).parents[2]


@pytest.fixture
def empty_dsn(databases: Databases) -> Iterator[str]:
    with databases.database(migrated=False) as dsn:
        yield dsn


def test_migrations_produce_the_schema_snapshot(empty_dsn: str) -> None:
    """Applying every migration to an empty database gives exactly docs/schema.sql."""
    migrate(empty_dsn)
    with psycopg.connect(empty_dsn) as conn:
        actual = describe(conn)
    expected = (ROOT / "docs" / "schema.sql").read_text()
    assert actual == expected, "schema drifted: run scripts/update-schema-snapshot"


def tables(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
        ).fetchall()
    return [r[0] for r in rows]


QUEUE_TABLES = [
    "_yoyo_log", "_yoyo_migration", "_yoyo_version", "work_attempts", "work_claim_locks",
    "work_dependencies", "work_failover_guard", "work_items", "work_limits", "work_pauses",
    "work_rate_slots", "work_schedules", "work_settle_locks", "work_spent_scopes", "work_steps",
    "work_unsettled_scopes", "work_unsettled_waiting", "work_workers", "yoyo_lock",
]  # fmt: skip
MEDIA_TABLES = [
    "media_assets", "media_bursts", "media_proxies", "media_share_tokens",
    "media_storage_configs",
]  # fmt: skip


def test_migrate_creates_only_the_queues_tables_and_an_app_adds_its_own(
    empty_dsn: str,
) -> None:
    """`python -m trioworker migrate` creates the queue's tables and nothing else; the
    media demo's tables come only with `--app examples.media:registry`, and a Worker
    of that app refuses a database without them, naming the command for that app."""
    env = {**os.environ, "TRIOWORKER_DSN": empty_dsn}
    cli = [sys.executable, "-m", "trioworker", "migrate"]
    subprocess.run(cli, env=env, check=True, capture_output=True, timeout=120)
    assert tables(empty_dsn) == QUEUE_TABLES
    check_schema(empty_dsn)
    with pytest.raises(SchemaNotReady, match="migrate --app MODULE:ATTR"):
        check_schema(empty_dsn, media.registry)
    run = [sys.executable, "-m", "trioworker", "run", "--app", "examples.media:registry"]
    refused = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0
    assert "run `python -m trioworker migrate --app examples.media:registry`" in refused.stderr
    app = [*cli, "--app", "examples.media:registry"]
    out = subprocess.run(app, env=env, check=True, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "applied 0001.media-library"
    assert tables(empty_dsn) == sorted(QUEUE_TABLES + MEDIA_TABLES)
    check_schema(empty_dsn, media.registry)


def test_check_schema_names_the_missing_migrations(empty_dsn: str) -> None:
    """An unmigrated database is refused with the command that fixes it."""
    with pytest.raises(SchemaNotReady, match="python -m trioworker migrate"):
        check_schema(empty_dsn)
    migrate(empty_dsn)
    check_schema(empty_dsn)
    assert pending_migrations(empty_dsn) == []


async def test_a_trio_program_migrates_in_a_thread_while_its_other_tasks_go_on(
    empty_dsn: str,
) -> None:
    """`migrate_async` runs `migrate` in a worker thread: while it waits for another
    migrator's lock (held here), this task goes on and sees it waiting; once the lock
    is let go it applies every migration, and `check_schema_async`, which refused the
    empty database, passes. (Were it to block the event loop, its lock_timeout would
    end the wait with an error, not hang the test.)"""
    with pytest.raises(SchemaNotReady, match="python -m trioworker migrate"):
        await check_schema_async(empty_dsn)
    dsn = psycopg.conninfo.make_conninfo(empty_dsn, options="-c lock_timeout=60s")
    applied: list[str] = []

    async def migrating() -> None:
        applied.extend(await migrate_async(dsn))

    with psycopg.connect(empty_dsn, autocommit=True) as holder, trio.fail_after(60):
        holder.execute("SELECT pg_advisory_lock(%s, %s)", MIGRATION_LOCK)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(migrating)
            await wait_until_blocked(holder)  # the migrator, on the lock
            assert applied == []
            holder.execute("SELECT pg_advisory_unlock(%s, %s)", MIGRATION_LOCK)
    assert (applied[0], applied[-1]) == ("0001.queue", QUEUE_MIGRATION_HEAD)
    await check_schema_async(empty_dsn)


def test_migrate_from_several_processes_at_once(empty_dsn: str) -> None:
    """Four `trioworker migrate` processes started together all succeed, once each."""
    env = {**os.environ, "TRIOWORKER_DSN": empty_dsn}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "trioworker", "migrate"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outputs
    applied = [out for out, _ in outputs if out.startswith("applied")]
    assert len(applied) == 1, outputs
    with psycopg.connect(empty_dsn) as conn:
        assert describe(conn) == (ROOT / "docs" / "schema.sql").read_text()


def test_migrate_clears_a_stale_yoyo_lock(empty_dsn: str) -> None:
    """A yoyo_lock row left by a migrator killed mid-way does not block the next one:
    an application's migration is still applied after it."""
    migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO yoyo_lock (locked, ctime, pid) VALUES (1, now(), 424242)")
    assert migrate(empty_dsn, media.registry) == ["0001.media-library"]
    check_schema(empty_dsn, media.registry)


#: Every released migration file and the SHA-256 of its bytes. A released migration is
#: never edited (databases have applied it): a change is a new file, recorded here when
#: it is released (docs/adr/0009-migrations-queue-and-applications.md). 0001.queue is the
#: first release's baseline (the pre-release chain squashed, issue 32): until 0.1.0 is
#: on an index, changes are folded into it and its digest recorded again.
RELEASED = {
    "0001.queue.sql": "10b08b2e214dd50ec5e1eea6e55945152b3199aa713e59ecc15a999b56aa1951",
    "0002.results-steps.sql": "fbbcdbd20eb3bb3838999427a3f219086f21830917b9e95442b4793478048ebc",
    "0003.dependencies.sql": "b20003c2b0f88e690a868c24cafdb7183a779fff69ca9d8e1c149d3691800ac5",
    "0004.claim-kind-room.sql": "4e33ab027d753ff2c831cfe738cc6783d044943c0ce0e696417d7bd1c8d8eb2b",
    "0005.spent-scopes.sql": "b72c53c85495e1294bd9ddfd405cc2ef685fb4163c344c554780ff37d4fb3d7f",
}


def test_released_migrations_are_never_edited_and_every_file_is_recorded() -> None:
    """A later edit of a released migration fails here, as does a new file that was not
    recorded; the queue's last migration is QUEUE_MIGRATION_HEAD."""
    # post-apply.*.sql: yoyo's hooks, run after every migrate and never recorded.
    files = {p.name: p for p in migrations_dir().glob("[0-9]*.sql")}
    assert sorted(files) == sorted(RELEASED), "record each new migration in RELEASED"
    for name, digest in RELEASED.items():
        actual = hashlib.sha256(files[name].read_bytes()).hexdigest()
        assert actual == digest, f"{name} was released and must not change: add a migration"
    assert max(files).removesuffix(".sql") == QUEUE_MIGRATION_HEAD


def test_the_guides_migrations_depend_on_the_queues_last() -> None:
    """Every `-- depends:` the guide shows names QUEUE_MIGRATION_HEAD or an app's own."""
    for page in (ROOT / "docs" / "guide").glob("*.md"):
        for line in page.read_text().splitlines():
            if line.startswith("-- depends:"):
                named = line.removeprefix("-- depends:").split()
                assert all(n == QUEUE_MIGRATION_HEAD or "myapp" in n for n in named), (page, line)
