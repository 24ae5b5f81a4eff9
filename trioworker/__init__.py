"""trioworker: a PostgreSQL-backed work queue with Trio Workers.

At most one Running item per scope, across every Worker; an attempt cut off from
PostgreSQL cancels its own handler half a lease after its last good heartbeat.

This module is what applications write against; everything it names reports
`trioworker` as its module. The layers behind it are subpackages
(docs/design/architecture.md): `_core` (pure values and decisions), `_store` (the
client and Worker interfaces, the reads), `_postgres` (the Trio store on PostgreSQL, and
`Client` and `AsyncClient` for synchronous and asyncio programs),
`_worker` (the Worker, its executor and the handler's context), `_cli` (the command
line); `trioworker.testing`, `trioworker.dashboard`, `trioworker.otel` and
`trioworker.config` (the environment variables of the DSN and the schema) are public
modules of their own.

The pure values and decisions are imported here at once; the names that need Trio
and psycopg (about half a second of CPU to import) are imported on first
use, so that `python -m trioworker --help` and a command's usage error cost almost
nothing.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from trioworker._core.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    HandlerTimeout,
    IdTakenOver,
    InvalidLimit,
    InvalidWorkItem,
    ItemNotSucceeded,
    Lost,
    SchemaNotReady,
    SelfStopped,
    StoreError,
    StoreTimeout,
    TrioWorkerError,
    UnknownItem,
    UnstorableResult,
)
from trioworker._core.limits import Limit, Rate, parse_rate
from trioworker._core.model import (
    AttemptRecord,
    CancelOutcome,
    Enqueued,
    ItemState,
    NewItem,
    Pause,
    ScheduleState,
    Status,
    StepRecord,
    StoreStatistics,
    WorkItem,
)
from trioworker._core.policy import DoNotRetry, RetryPolicy
from trioworker._core.public import public_names as _public_names
from trioworker._core.registry import Registry
from trioworker._core.schedule import Schedule
from trioworker._core.settings import Settings

if _typing.TYPE_CHECKING:  # imported on first use, by __getattr__ below
    from trioworker._postgres.async_client import AsyncClient
    from trioworker._postgres.migrate import (
        QUEUE_MIGRATION_HEAD,
        check_schema,
        check_schema_async,
        migrate,
        migrate_async,
    )
    from trioworker._postgres.store import PostgresStore, open_store
    from trioworker._postgres.sync_client import Client
    from trioworker._store.api import FencedTransaction, HandlerStore, Store, Transaction
    from trioworker._store.reads import ItemDetails, QueueCounts, QueueStatus, Relative
    from trioworker._worker.context import Context
    from trioworker._worker.worker import Worker, WorkerStatistics

#: The names imported on first use, and the module each comes from.
_LAZY = {
    "AsyncClient": "trioworker._postgres.async_client",
    "Client": "trioworker._postgres.sync_client",
    "QUEUE_MIGRATION_HEAD": "trioworker._postgres.migrate",
    "check_schema": "trioworker._postgres.migrate",
    "check_schema_async": "trioworker._postgres.migrate",
    "migrate": "trioworker._postgres.migrate",
    "migrate_async": "trioworker._postgres.migrate",
    "PostgresStore": "trioworker._postgres.store",
    "open_store": "trioworker._postgres.store",
    "FencedTransaction": "trioworker._store.api",
    "HandlerStore": "trioworker._store.api",
    "Store": "trioworker._store.api",
    "Transaction": "trioworker._store.api",
    "ItemDetails": "trioworker._store.reads",
    "QueueCounts": "trioworker._store.reads",
    "QueueStatus": "trioworker._store.reads",
    "Relative": "trioworker._store.reads",
    "Context": "trioworker._worker.context",
    "Worker": "trioworker._worker.worker",
    "WorkerStatistics": "trioworker._worker.worker",
}


def __getattr__(name: str) -> object:
    """A lazily imported public name, imported (and named `trioworker.NAME`) once."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trioworker' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    _public_names(__name__, globals(), [name])
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "QUEUE_MIGRATION_HEAD",
    "AsyncClient",
    "AttemptRecord",
    "CancelOutcome",
    "Client",
    "ConfigurationError",
    "Context",
    "DatabaseUnavailable",
    "DoNotRetry",
    "Enqueued",
    "FencedTransaction",
    "HandlerStore",
    "HandlerTimeout",
    "IdTakenOver",
    "InvalidLimit",
    "InvalidWorkItem",
    "ItemDetails",
    "ItemNotSucceeded",
    "ItemState",
    "Limit",
    "Lost",
    "NewItem",
    "Pause",
    "PostgresStore",
    "QueueCounts",
    "QueueStatus",
    "Rate",
    "Registry",
    "Relative",
    "RetryPolicy",
    "Schedule",
    "ScheduleState",
    "SchemaNotReady",
    "SelfStopped",
    "Settings",
    "Status",
    "StepRecord",
    "Store",
    "StoreError",
    "StoreStatistics",
    "StoreTimeout",
    "Transaction",
    "TrioWorkerError",
    "UnknownItem",
    "UnstorableResult",
    "WorkItem",
    "Worker",
    "WorkerStatistics",
    "check_schema",
    "check_schema_async",
    "migrate",
    "migrate_async",
    "open_store",
    "parse_rate",
]


_public_names(__name__, globals(), [n for n in __all__ if n not in _LAZY])
