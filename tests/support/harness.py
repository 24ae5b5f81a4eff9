"""One face for both stores, so a contract test runs unchanged against each."""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import psycopg

from tests.support.clients import ThroughClient
from trioworker import ItemState, PostgresStore, Status
from trioworker.testing import MemoryStore

COLUMNS = (
    "id, kind, scope, payload, priority, status, attempt, stalls, failures, worker_id,"
    " requested_at, run_after, started_at, finished_at, heartbeat_at, lease_expires_at, dedup_key,"
    " cancel_requested, reason, error, traceback, completed_at, result"
)


class MemoryHarness:
    name = "memory"

    def __init__(self) -> None:
        self.store = MemoryStore()

    def expire_lease(self, id: int) -> None:
        self.store.expire_lease(id)

    def items(self) -> list[ItemState]:
        return self.store.items()

    def age(self, id: int, seconds: float) -> None:
        """Move a finished item's finished_at `seconds` into the past."""
        row = self.store._rows[id]
        assert row.finished_at is not None
        row.finished_at -= dt.timedelta(seconds=seconds)

    def backdate_schedule(self, name: str, seconds: float) -> None:
        """Move a schedule's next due time `seconds` into the past."""
        state = self.store._schedules[name]
        self.store._schedules[name] = attrs.evolve(
            state, next_due=state.next_due - dt.timedelta(seconds=seconds)
        )


class PostgresHarness:
    """The Trio store (name "postgres"), or its client operations sent through
    `Client` or `AsyncClient` ("client", "async-client": tests/support/clients.py)."""

    def __init__(
        self,
        store: PostgresStore | ThroughClient,
        pg: psycopg.Connection[Any],
        name: str = "postgres",
    ) -> None:
        self.store = store
        self.pg = pg
        self.name = name

    def expire_lease(self, id: int) -> None:
        self.pg.execute(
            "UPDATE work_items SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
            (id,),
        )

    def age(self, id: int, seconds: float) -> None:
        self.pg.execute(
            "UPDATE work_items SET finished_at = finished_at - make_interval(secs => %s)"
            " WHERE id = %s",
            (seconds, id),
        )

    def backdate_schedule(self, name: str, seconds: float) -> None:
        self.pg.execute(
            "UPDATE work_schedules SET next_due = next_due - make_interval(secs => %s)"
            " WHERE name = %s",
            (seconds, name),
        )

    def items(self) -> list[ItemState]:
        with self.pg.cursor(row_factory=psycopg.rows.dict_row) as cur:
            rows = cur.execute(f"SELECT {COLUMNS} FROM work_items ORDER BY id").fetchall()
        return [ItemState(**{**r, "status": Status(r["status"])}) for r in rows]


Harness = MemoryHarness | PostgresHarness
