"""trioworker: a PostgreSQL-backed work queue with Trio Workers.

At most one Running item per scope, across every Worker; an attempt cut off from
PostgreSQL cancels its own handler half a lease after its last good heartbeat.
"""

# trio_asyncio must be imported before psycopg, or psycopg's async calls fail with
# "no running event loop".
import trio_asyncio  # noqa: F401  isort: skip

from ._context import Context
from ._dsn import DSN_ENV, resolve_dsn
from ._errors import (
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
from ._migrate import check_schema, migrate
from ._model import (
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
from ._policy import DoNotRetry, RetryPolicy
from ._postgres import FencedTransaction, PostgresStore, Transaction, open_store
from ._registry import Registry
from ._schedule import Schedule
from ._settings import Settings
from ._store import Store
from ._worker import Worker, WorkerStatistics

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
