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


class ConfigurationError(TrioWorkerError):
    """Bad settings given to a Worker or command: a bad --app, DSN or option."""


class FailStop(TrioWorkerError):
    """A handler did not stop within its grace period; the process must exit."""
