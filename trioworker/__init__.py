"""trioworker: a PostgreSQL-backed work queue with Trio Workers.

At most one Running item per scope, across every Worker; an attempt cut off from
PostgreSQL cancels its own handler half a lease after its last good heartbeat.
"""

# trio_asyncio must be imported before psycopg, or psycopg's async calls fail with
# "no running event loop".
import trio_asyncio  # noqa: F401  isort: skip

from trioworker._core.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    HandlerTimeout,
    InvalidWorkItem,
    Lost,
    SchemaNotReady,
    StoreError,
    StoreTimeout,
    TrioWorkerError,
)
from trioworker._core.model import (
    CancelOutcome,
    Enqueued,
    Fired,
    Heartbeat,
    ItemState,
    NewItem,
    Pause,
    Recovered,
    ScheduleState,
    ScopeHolder,
    Status,
    StoreStatistics,
    WorkerInfo,
    WorkItem,
)
from trioworker._core.policy import DoNotRetry, RetryPolicy
from trioworker._core.registry import Registry
from trioworker._core.schedule import Schedule
from trioworker._core.settings import Settings
from trioworker._postgres.dsn import DSN_ENV, resolve_dsn
from trioworker._postgres.migrate import check_schema, migrate
from trioworker._postgres.store import FencedTransaction, PostgresStore, Transaction, open_store
from trioworker._store.api import Store
from trioworker._worker.context import Context
from trioworker._worker.worker import Worker, WorkerStatistics

__all__ = [
    "DSN_ENV",
    "CancelOutcome",
    "ConfigurationError",
    "Context",
    "DatabaseUnavailable",
    "DoNotRetry",
    "Enqueued",
    "FencedTransaction",
    "Fired",
    "HandlerTimeout",
    "Heartbeat",
    "InvalidWorkItem",
    "ItemState",
    "Lost",
    "NewItem",
    "Pause",
    "PostgresStore",
    "Recovered",
    "Registry",
    "RetryPolicy",
    "Schedule",
    "ScheduleState",
    "SchemaNotReady",
    "ScopeHolder",
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
    "WorkerInfo",
    "WorkerStatistics",
    "check_schema",
    "migrate",
    "open_store",
    "resolve_dsn",
]
