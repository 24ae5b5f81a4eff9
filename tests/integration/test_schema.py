"""The queue in a schema of its own (docs/design/schema.md), beside an application.

The application owns `public.work_items`, a table of its own with other columns: the
whole command line, a Worker process and the dashboard run on the queue in the schema
`tenant_a` and never touch it. Two schemas in one database see neither the other's
items nor its notifications.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from tests.browser.support import dashboards, request
from tests.integration.test_cli import trioworker
from tests.support.database import Databases
from tests.support.processes import ROOT, wait_for, workers
from tests.support.schema import describe
from trioworker import check_schema, migrate, open_store

Conn = psycopg.Connection[Any]

APP_TABLE = """
CREATE TABLE public.work_items (sku text PRIMARY KEY, shelf integer NOT NULL);
INSERT INTO public.work_items VALUES ('bolt-m4', 3), ('nut-m4', 7);
"""


def app_table(conn: Conn) -> tuple[list[Any], list[Any]]:
    """The application's table: its columns and its rows."""
    columns = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = 'public' AND table_name = 'work_items' ORDER BY ordinal_position"
    ).fetchall()
    rows = conn.execute("SELECT sku, shelf FROM public.work_items ORDER BY sku").fetchall()
    return columns, rows


def public_objects(conn: Conn) -> list[Any]:
    """Every table and function in public: the application's table, nothing else."""
    return conn.execute(
        "SELECT 'table', tablename FROM pg_tables WHERE schemaname = 'public'"
        " UNION ALL SELECT 'function', p.proname FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'"
        " ORDER BY 1, 2"
    ).fetchall()


@pytest.fixture
def app_dsn(databases: Databases) -> Iterator[str]:
    """An empty database whose application has a `work_items` table of its own."""
    with databases.database(migrated=False) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(APP_TABLE)  # type: ignore[call-overload]
        yield dsn


def cli(dsn: str, *args: str, env: dict[str, str] | None = None) -> Any:
    result = trioworker(*args, dsn=dsn, env=env)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result


def test_the_cli_a_worker_and_the_dashboard_run_in_a_schema_of_their_own(
    app_dsn: str, tmp_path: Path
) -> None:
    """Every command with --schema tenant_a (or $TRIOWORKER_SCHEMA) works on the queue
    there; the application's public.work_items keeps its columns and rows, and public
    gains nothing."""
    with psycopg.connect(app_dsn, autocommit=True) as pg:
        before = app_table(pg)
        migrated = cli(app_dsn, "--schema", "tenant_a", "migrate")
        assert migrated.stdout.splitlines() == [
            "applied 0001.queue",
            "applied 0002.results-steps",
            "applied 0003.dependencies",
            "applied 0004.claim-kind-room",
            "applied 0005.spent-scopes",
        ]
        assert cli(app_dsn, "migrate", "--schema", "tenant_a").stdout == "schema is up to date\n"
        env = {"TRIOWORKER_SCHEMA": "tenant_a"}

        def queue(*args: str) -> Any:
            return cli(app_dsn, *args, env=env)

        def status_of(item: int) -> str:
            row = pg.execute("SELECT status FROM tenant_a.work_items WHERE id = %s", [item])
            return str(row.fetchone()[0])  # type: ignore[index]

        first = int(queue("enqueue", "Record", "--scope", "s1", "--payload", '{"seconds": 0}')
                    .stdout)  # fmt: skip
        doomed = int(cli(app_dsn, "--schema", "tenant_a", "enqueue", "Record", "--delay", "1h")
                     .stdout)  # fmt: skip
        lines = tmp_path / "items.jsonl"
        lines.write_text(
            '{"kind": "Record", "scope": "s2", "payload": {"seconds": 0}}\n'
            '{"kind": "Broken", "payload": {}}\n'
        )
        batch = [int(n) for n in queue("enqueue", "--from", str(lines)).stdout.split()]
        assert queue("cancel", str(doomed)).stdout.startswith(f"item {doomed} cancelled")
        assert status_of(doomed) == "Cancelled"
        queue("pause", "--scope", "s2")
        counts = json.loads(queue("status", "--json").stdout)["counts"]
        assert counts["Record"]["Queued"] == 2 and counts["Record"]["Cancelled"] == 1
        shown = json.loads(queue("show", str(first), "--json").stdout)
        assert shown["item"]["kind"] == "Record" and shown["item"]["scope"] == "s1"

        worker_and_dashboard(app_dsn, pg, tmp_path, first, batch)
        assert queue("prune", "--older-than", "0s").returncode == 0
        finished = pg.execute(
            "SELECT count(*) FROM tenant_a.work_items WHERE finished_at IS NOT NULL"
        ).fetchone()
        assert finished == (0,)

        assert app_table(pg) == before
        assert public_objects(pg) == [("table", "work_items")]
        assert pg.execute("SELECT count(*) FROM tenant_a._yoyo_migration").fetchone() == (
            len(migrated.stdout.splitlines()),  # the queue's, each "applied" above
        )
        assert pg.execute("SELECT to_regclass('public._yoyo_migration')").fetchone() == (None,)


def worker_and_dashboard(
    app_dsn: str, pg: Conn, tmp_path: Path, first: int, batch: list[int]
) -> None:
    """A Worker runs the items (a paused scope waits for its resume; a retried item
    runs again); quiesce and status see it; the dashboard shows it all."""
    env = {"TRIOWORKER_SCHEMA": "tenant_a"}

    def queue(*args: str) -> Any:
        return cli(app_dsn, *args, env=env)

    def status_of(item: int) -> str:
        row = pg.execute("SELECT status FROM tenant_a.work_items WHERE id = %s", [item])
        return str(row.fetchone()[0])  # type: ignore[index]

    with workers(tmp_path) as start:
        worker = start(app_dsn, "--poll", "1", name="tenant-a", env=env)
        wait_for(lambda: status_of(first) == "Succeeded", 60, "the Worker to run item 1")
        wait_for(lambda: status_of(batch[1]) == "Failed", 60, "Broken to fail twice")
        assert status_of(batch[0]) == "Queued", "its scope is paused"
        queue("resume", "--scope", "s2")
        wait_for(lambda: status_of(batch[0]) == "Succeeded", 60, "the resumed scope")
        assert queue("retry", str(batch[1])).returncode == 0
        wait_for(lambda: status_of(batch[1]) == "Failed", 60, "the retried item to fail")
        attempts = pg.execute(
            "SELECT attempt FROM tenant_a.work_items WHERE id = %s", [batch[1]]
        ).fetchone()
        assert attempts == (5,)  # 1-2, the operator's retry (3), 4-5
        assert queue("quiesce", "--scope", "s1", "--timeout", "30").returncode == 0
        status = json.loads(queue("status", "--json").stdout)
        assert [w["id"] for w in status["workers"] if w["alive"]] == ["tenant-a"]

        with dashboards(tmp_path) as start_dashboard:
            board = start_dashboard(app_dsn, "--schema", "tenant_a")
            for page in ["/", "/running", "/scopes", "/failures", "/workers", "/pauses",
                         "/schedules", f"/items/{first}"]:  # fmt: skip
                answer = request(board.url + page)
                assert answer.status == 200, (page, answer.body)
            item_page = request(board.url + f"/items/{batch[1]}").body
            assert "Broken" in item_page and "KeyError" in item_page
            overview = request(board.url + "/").body
            assert 'data-kind="Record"' in overview
        worker.signal(15)
        assert worker.wait(30) == 0, worker.output()


def test_without_the_schema_the_commands_say_where_they_looked(app_dsn: str) -> None:
    """A queue migrated into tenant_a is not found without its name: the command says
    which migrations are missing and how to name the schema; a bad name is a usage
    error before anything connects."""
    cli(app_dsn, "--schema", "tenant_a", "migrate")
    missing = trioworker("status", "--schema", "tenant_b", dsn=app_dsn)
    assert missing.returncode == 1
    assert "(in schema tenant_b)" in missing.stderr
    assert "--schema tenant_b migrate" in missing.stderr
    bad = trioworker("status", "--schema", "Tenant-A", dsn=app_dsn)
    assert bad.returncode == 2 and "bad schema name 'Tenant-A'" in bad.stderr
    bad_env = trioworker("status", dsn=app_dsn, env={"TRIOWORKER_SCHEMA": "pg_queue"})
    assert bad_env.returncode == 2 and "TRIOWORKER_SCHEMA" in bad_env.stderr


def test_migrations_make_the_same_schema_in_any_schema(app_dsn: str) -> None:
    """The queue migrated into tenant_a is docs/schema.sql, but for the schema's name."""
    migrate(app_dsn, schema="tenant_a")
    with psycopg.connect(app_dsn) as conn:
        conn.execute("SET search_path = tenant_a")
        described = describe(conn, "tenant_a")
        unpinned = conn.execute(
            "SELECT p.proname FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'tenant_a' AND p.provolatile <> 'i'"
            " AND NOT 'search_path=tenant_a, pg_catalog, pg_temp'"
            " = ANY(COALESCE(p.proconfig, '{}'))"
        ).fetchall()
    # Outside public every function but the IMMUTABLE ones is pinned to the schema; in
    # public only the transitions are (the snapshot): with that one line apart, the two
    # are the same.
    assert unpinned == []
    pin = " SET search_path TO 'tenant_a', 'pg_catalog', 'pg_temp'\n"
    assert pin in described
    expected = (ROOT / "docs" / "schema.sql").read_text()
    expected = expected.replace(" SET search_path TO 'public', 'pg_temp'\n", "")
    expected = expected.replace(" public.", " tenant_a.")  # CREATE FUNCTION, ON (indexes)
    assert described.replace(pin, "") == expected


def test_in_public_only_the_transitions_are_pinned(dsn: str) -> None:
    """The default schema pays nothing for schemas of their own: no function of the
    queue in public carries a search_path (each would save and restore it per call),
    but the transitions, which run as the owner (SECURITY DEFINER) and must not find
    their tables by the caller's search_path (migrations/0011.roles.sql): pinned to
    `public, pg_temp`, pg_catalog first as in the default path, so the plans a helper
    caches under one are good under the other."""
    with psycopg.connect(dsn) as conn:
        pinned = conn.execute(
            "SELECT p.prosecdef, p.proconfig FROM pg_proc AS p"
            " JOIN pg_namespace AS n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'public' AND (p.prosecdef"
            "  OR array_to_string(p.proconfig, ',') LIKE '%search_path%')"
        ).fetchall()
    assert len(pinned) > 10
    assert all(sd and "search_path=public, pg_temp" in conf for sd, conf in pinned)


async def test_two_schemas_in_one_database_see_neither_the_others_items_nor_its_notifications(
    app_dsn: str,
) -> None:
    """Items, claims, reads, cancels and NOTIFY stay within their schema."""
    for schema in ("tenant_a", "tenant_b"):
        migrate(app_dsn, schema=schema)
        check_schema(app_dsn, schema=schema)
    with trio.fail_after(60):  # a listener that never starts fails the test, not hangs it
        await both_queues(app_dsn)


async def both_queues(app_dsn: str) -> None:
    async with (
        open_store(app_dsn, schema="tenant_a") as a,
        open_store(app_dsn, schema="tenant_b") as b,
    ):
        heard: dict[str, list[str | None]] = {"a": [], "b": []}
        a_heard = trio.Event()

        def on_a(payload: str | None) -> None:
            heard["a"].append(payload)
            a_heard.set()

        async with trio.open_nursery() as nursery:
            await nursery.start(a.listen, on_a)
            await nursery.start(b.listen, heard["b"].append)
            in_a = await a.enqueue("Crawl", scope="shared-scope")
            with trio.fail_after(10):
                await a_heard.wait()
            await trio.sleep(0.5)  # time enough for a notification that leaked
            assert heard == {"a": ["shared-scope"], "b": []}
            assert (await b.status()).counts.by_kind == {}
            assert await b.claim("w-b", 30, kinds=["Crawl"]) is None
            assert await b.get_item(in_a.id) is None
            assert (await b.cancel(in_a.id)).value == "not-found"
            in_b = await b.enqueue("Crawl", scope="shared-scope")
            claimed = await b.claim("w-b", 30, kinds=["Crawl"])
            # The same scope is busy in b and free in a: the scope rule is per queue.
            assert claimed is not None and claimed.id == in_b.id
            other = await a.claim("w-a", 30, kinds=["Crawl"])
            assert other is not None and other.id == in_a.id
            nursery.cancel_scope.cancel()
