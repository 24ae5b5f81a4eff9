"""A Worker's store that says when its first lease-recovery pass is over."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from trioworker import PostgresStore


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


@asynccontextmanager
async def recovery_pass_store(dsn: str) -> AsyncIterator[RecoveryPassStore]:
    """An open RecoveryPassStore, closed on the way out."""
    store = RecoveryPassStore(dsn)
    await store.open()
    try:
        yield store
    finally:
        await store.close()
