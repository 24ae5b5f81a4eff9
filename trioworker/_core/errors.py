"""The error tree, by meaning (driver errors become these at one boundary, the
PostgreSQL store's `_translate`):

    TrioWorkerError
    ├── InvalidWorkItem        bad enqueue input; nothing was written (a ValueError too)
    ├── InvalidLimit           a bad concurrency or rate limit; nothing was written
    ├── ConfigurationError     fix the setup: a bad --app, DSN, option or registration
    │                          (a ValueError too)
    ├── SchemaNotReady         the database lacks migrations (run `trioworker migrate`)
    ├── StoreError             the database refused or failed a call
    │   └── DatabaseUnavailable    it could not be reached or did not answer: retry
    │       └── StoreTimeout       no answer within the call's time bound
    ├── Lost                   this attempt no longer owns its item (not retryable)
    │   └── SelfStopped        its self-stop deadline has passed: nothing it writes is kept
    ├── HandlerTimeout         a handler ran past its kind's timeout
    ├── UnstorableResult       a result or a step's value is not storable JSON (a ValueError too)
    ├── ItemNotSucceeded       waited for a result: the item ended Failed or Cancelled
    └── UnknownItem            no item has that id (a LookupError too)

So `except StoreError` (retry a write) never swallows `Lost` or a missing schema, and
`except ValueError` (the caller passed a bad value) catches only what the caller passed:
a bad item, limit, setting or result, never a database that was not migrated.
"""

from __future__ import annotations


class TrioWorkerError(Exception):
    """Base class of every error trioworker raises on purpose."""


class InvalidWorkItem(TrioWorkerError, ValueError):
    """Input to enqueue that cannot become a work item; nothing was written. `index`:
    the item's place in an `enqueue_many` batch, when the error is one item's."""

    def __init__(
        self, message: str, *, index: int | None = None, reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.index = index
        #: What is wrong, without the item's place (which `str(error)` names).
        self.reason = message if reason is None else reason

    @classmethod
    def of_item(cls, index: int, reason: object) -> InvalidWorkItem:
        """Item `index` of a batch is refused: "item 3: <reason>", the parts kept."""
        return cls(f"item {index}: {reason}", index=index, reason=str(reason))


class InvalidLimit(TrioWorkerError, ValueError):
    """A concurrency or rate limit that cannot be set (not a positive whole number, a
    rate without a period); nothing was written."""


class ConfigurationError(TrioWorkerError, ValueError):
    """Bad settings given to a Worker, a registry or a command: a bad --app, DSN,
    option, handler or schedule."""


class SchemaNotReady(TrioWorkerError):
    """The database lacks migrations this version needs (run `trioworker migrate`), or
    was made by a schema this version cannot upgrade.

    Nothing the caller passed is wrong (the same call succeeds once the schema is
    migrated), so it is neither a ValueError nor a ConfigurationError; nor a StoreError,
    since retrying does not help until someone migrates."""


class IdTakenOver(TrioWorkerError):
    """Another Worker took this Worker's id while this one seemed gone (stopped, cut off
    for longer than its liveness window): it stopped claiming, let its running attempts
    end by their fence and the shutdown grace, and stopped. Raised by `Worker.run`."""


class StoreError(TrioWorkerError):
    """The database refused or failed a store call."""


class DatabaseUnavailable(StoreError):
    """PostgreSQL could not be reached or did not answer in time. Safe to retry."""


class StoreTimeout(DatabaseUnavailable):
    """A store call did not finish within its time bound."""


class Lost(TrioWorkerError):
    """This attempt no longer owns its work item: its lease ran out and the item was
    taken back (or given to another attempt). Nothing the attempt wrote in a fenced
    transaction was kept, and the Worker writes nothing for it either."""


class SelfStopped(Lost):
    """The attempt's self-stop deadline has passed (no heartbeat succeeded for half a
    lease): nothing it writes is kept, so its fenced transaction neither opens nor
    commits (it rolls back). The item belongs to lease recovery now."""


class HandlerTimeout(TrioWorkerError):
    """A handler ran past its kind's timeout (`Registry.handler(kind, timeout=...)`) and
    was cancelled; it counts as a handler failure, retried by the kind's policy."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"timed out after {seconds:g}s")
        self.seconds = seconds


class UnstorableResult(TrioWorkerError, ValueError):
    """A handler's result, or a step's value, that cannot be stored: not JSON, larger
    or nested deeper than a payload may be. The attempt fails with this error (its
    retry policy applies) and nothing of the value is stored."""


class ItemNotSucceeded(TrioWorkerError):
    """The item whose result was asked for ended Failed or Cancelled: `status` names
    which, `error` and `reason` say why (either may be None)."""

    def __init__(self, id: int, status: str, error: str | None, reason: str | None) -> None:
        why = "; ".join(part for part in (reason, error) if part) or "no error recorded"
        super().__init__(f"item {id} ended {status}: {why}")
        self.id = id
        self.status = status
        self.error = error
        self.reason = reason


class UnknownItem(TrioWorkerError, LookupError):
    """No work item has the id asked for (never enqueued, or deleted by retention)."""
