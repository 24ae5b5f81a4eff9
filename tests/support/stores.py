"""Stores the integration tests open themselves: `opened` for any of them, and a
Worker's store that says when its first lease-recovery pass is over."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

import trio

from trioworker import PostgresStore

S = TypeVar("S", bound=PostgresStore)


@asynccontextmanager
async def opened(store: S) -> AsyncIterator[S]:
    """`store` (a PostgresStore of a test's own class), open, and closed on the way out."""
    await store.open()
    try:
        yield store
    finally:
        await store.close()


class RecoveryPassStore(PostgresStore):
    """Says when its Worker's first recovery pass is over, so that a test's own recovery
    cannot race it (the Worker's first pass runs alongside its first claim). The pass
    ends with repair_heads: before it, held_leases locks each overdue row for an instant
    (FOR NO KEY UPDATE SKIP LOCKED), and a recovery meanwhile passes over that row."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.first_pass = trio.Event()

    async def repair_heads(self, *, batch: int = 1000) -> list[str]:
        try:
            return await super().repair_heads(batch=batch)
        finally:
            self.first_pass.set()
