"""A Worker across a real failover (tests/support/clusters): a demoted primary's
read-only answer is a cut-off link, not a failure, and a multi-host DSN finds the new
primary."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import trio

from tests.integration.test_fenced import until
from tests.support.clusters import streaming_pair
from tests.support.processes import wait_for
from trioworker import (
    Context,
    DatabaseUnavailable,
    Registry,
    Settings,
    Worker,
    WorkItem,
    migrate,
    open_store,
)

log = logging.getLogger(__name__)

Conn = psycopg.Connection[Any]
THUMBNAILS = "CREATE TABLE thumbnails (item_id bigint, attempt int)"
#: Short leases, so lease recovery comes within seconds; still the rule's proportions.
SETTINGS = Settings(lease=4, heartbeat=1, poll=0.5, stop_grace=0.9)


def demote(primary: Conn, dsn: str) -> None:
    """What a failover does to the old primary before it becomes a standby: it takes
    no more writes (pg_auto_failover sets default_transaction_read_only too). Its
    sessions answer their next write with SQLSTATE 25006.

    pg_reload_conf() only signals the postmaster, which re-reads the file and signals
    every session in its own time: a transaction begun meanwhile may still write. So
    this returns once both this session and a new one read the setting as on."""
    primary.execute("ALTER SYSTEM SET default_transaction_read_only = on")
    primary.execute("SELECT pg_reload_conf()")

    def read_only() -> bool:
        with psycopg.connect(dsn, autocommit=True) as fresh:
            seen = {one(conn, "SHOW default_transaction_read_only") for conn in (primary, fresh)}
        return seen == {"on"}

    wait_for(read_only, 10, "the old primary's sessions to read it as read-only")


def one(conn: Conn, query: Any, params: list[Any] | None = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


async def test_a_read_only_answer_leaves_the_item_to_lease_recovery_on_the_new_primary() -> None:
    """The handler's fenced write reaches the old primary as it is demoted and is
    answered 25006: the handler sees DatabaseUnavailable, the Worker writes nothing
    (nothing Failed, no retry), its connections follow the multi-host DSN to the
    promoted standby, and lease recovery there requeues the item, which the same
    Worker then runs to Succeeded on the new primary."""
    with streaming_pair() as pair:
        migrate(pair.primary.dsn())
        with pair.primary.connect() as conn:
            conn.execute(THUMBNAILS)
        started, demoted = trio.Event(), trio.Event()
        refusals: list[DatabaseUnavailable] = []
        registry = Registry()

        @registry.handler("Thumbnail")
        async def thumbnail(item: WorkItem, ctx: Context) -> None:
            if item.attempt == 1:
                started.set()
                await demoted.wait()
            try:
                async with ctx.transaction() as tx:
                    await tx.execute(
                        "INSERT INTO thumbnails VALUES (%s, %s)", [item.id, item.attempt]
                    )
                    tx.complete()
            except DatabaseUnavailable as exc:
                refusals.append(exc)
                raise

        async with open_store(pair.multi_host_dsn(), call_timeout=3.0) as store:
            item = await store.enqueue("Thumbnail")
            worker = Worker(store, registry, SETTINGS, worker_id="w", fail_stop=log.error)
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                with trio.fail_after(20):
                    await started.wait()
                await trio.to_thread.run_sync(pair.wait_replayed)  # the claim is on both
                with pair.primary.connect() as old:
                    demote(old, pair.primary.dsn())
                demoted.set()
                await trio.to_thread.run_sync(pair.promote_standby)
                with pair.standby.connect() as new:
                    await until(
                        lambda: one(new, "SELECT status FROM work_items") == "Succeeded",
                        "the item to succeed on the new primary",
                        seconds=40,
                    )
                    history = await store.attempts(item.id)
                    row = new.execute("SELECT attempt, stalls, failures FROM work_items").fetchone()
                    written = new.execute("SELECT * FROM thumbnails").fetchall()
                nursery.cancel_scope.cancel()
    assert refusals and all("read-only" in str(exc) for exc in refusals)
    assert "25006" in repr(refusals) or "ReadOnlySqlTransaction" in str(refusals[0])
    assert row == (2, 1, 0)  # one stall, no failure
    assert [(a.attempt, a.outcome) for a in history] == [(1, "stalled"), (2, "succeeded")]
    assert written == [(item.id, 2)]
    events = worker.statistics().events
    assert events.get("claimed") == 2 and "retry" not in events and "fail" not in events
    assert events.get("database_lost") == 1
    log.info("failover timings: %s; Worker events: %s", pair.timings, events)
