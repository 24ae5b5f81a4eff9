"""The error tree. Driver errors become these at one boundary (the store's bridge)."""

from __future__ import annotations


class TrioWorkerError(Exception):
    """Base class of every error trioworker raises on purpose."""


class InvalidWorkItem(TrioWorkerError, ValueError):
    """Input to enqueue that cannot become a work item; nothing was written."""


class StoreError(TrioWorkerError):
    """The database refused or failed a store call."""


class DatabaseUnavailable(StoreError):
    """PostgreSQL could not be reached or did not answer in time. Safe to retry."""


class StoreTimeout(DatabaseUnavailable):
    """A store call did not finish within its time bound."""


class SchemaNotReady(StoreError):
    """The database lacks migrations this version needs (run `trioworker migrate`)."""


class Lost(StoreError):
    """This attempt no longer owns its work item: its lease ran out and the item was
    taken back (or given to another attempt). Nothing the attempt wrote in a fenced
    transaction was kept, and the Worker writes nothing for it either."""


class HandlerTimeout(TrioWorkerError):
    """A handler ran past its kind's timeout (`Registry.handler(kind, timeout=...)`) and
    was cancelled; it counts as a handler failure, retried by the kind's policy."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"timed out after {seconds:g}s")
        self.seconds = seconds


class ConfigurationError(TrioWorkerError):
    """Bad settings given to a Worker or command: a bad --app, DSN or option."""
