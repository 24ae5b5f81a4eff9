"""trioworker: a PostgreSQL-backed work queue with Trio Workers.

At most one Running item per scope, across every Worker; an attempt cut off from
PostgreSQL cancels its own handler half a lease after its last good heartbeat.

This module is what applications write against; everything it names reports
`trioworker` as its module. The layers behind it are subpackages
(docs/design/architecture.md): `_core` (pure values and decisions), `_store` (the
client and Worker interfaces, the reads), `_postgres` (the store on PostgreSQL),
`_worker` (the Worker, its executor and the handler's context), `_cli` (the command
line); `trioworker.testing`, `trioworker.dashboard` and `trioworker.otel` are public
subpackages of their own.
"""

# trio_asyncio must be imported before psycopg, or psycopg's async calls fail with
# "no running event loop".
import trio_asyncio  # noqa: F401  isort: skip

from trioworker._core.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    HandlerTimeout,
    InvalidLimit,
    InvalidWorkItem,
    Lost,
    SchemaNotReady,
    StoreError,
    StoreTimeout,
    TrioWorkerError,
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
    StoreStatistics,
    WorkItem,
)
from trioworker._core.policy import DoNotRetry, RetryPolicy
from trioworker._core.public import public_names as _public_names
from trioworker._core.registry import Registry
from trioworker._core.schedule import Schedule
from trioworker._core.settings import Settings
from trioworker._postgres.dsn import DSN_ENV, resolve_dsn
from trioworker._postgres.migrate import QUEUE_MIGRATION_HEAD, check_schema, migrate
from trioworker._postgres.store import PostgresStore, open_store
from trioworker._store.api import Client, FencedTransaction, Store, Transaction
from trioworker._store.reads import ItemDetails, QueueCounts, QueueStatus
from trioworker._worker.context import Context
from trioworker._worker.worker import Worker, WorkerStatistics

__all__ = [
    "DSN_ENV",
    "QUEUE_MIGRATION_HEAD",
    "AttemptRecord",
    "CancelOutcome",
    "Client",
    "ConfigurationError",
    "Context",
    "DatabaseUnavailable",
    "DoNotRetry",
    "Enqueued",
    "FencedTransaction",
    "HandlerTimeout",
    "InvalidLimit",
    "InvalidWorkItem",
    "ItemDetails",
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
    "RetryPolicy",
    "Schedule",
    "ScheduleState",
    "SchemaNotReady",
    "Settings",
    "Status",
    "Store",
    "StoreError",
    "StoreStatistics",
    "StoreTimeout",
    "Transaction",
    "TrioWorkerError",
    "WorkItem",
    "Worker",
    "WorkerStatistics",
    "check_schema",
    "migrate",
    "open_store",
    "parse_rate",
    "resolve_dsn",
]


_public_names(__name__, globals(), __all__)
