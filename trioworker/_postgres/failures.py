"""Driver errors as trioworker errors: the one translation every way of reaching
PostgreSQL shares (the Trio store, `Client`, `AsyncClient`), so a caller sees the same
public classes whichever it uses."""

from __future__ import annotations

import psycopg
import psycopg.errors

from trioworker._core.errors import DatabaseUnavailable, SchemaNotReady, StoreError
from trioworker._postgres.dsn import redact

#: The queue's own writes on its own connections retry these (none is expected by
#: design; each is counted). In a caller's transaction they are the caller's to retry.
CONFLICTS = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
#: The answers of a server that cannot take writes now: a standby, or a primary being
#: demoted in a failover (SQLSTATE 25006). Like a lost link they mean "reconnect": the
#: connection is discarded, so the pool's next one follows a multi-host DSN's
#: target_session_attrs=read-write to the new primary, and the attempt's self-stop timer
#: (not the handler or the item) pays for the time it takes.
NOT_WRITABLE = (psycopg.errors.ReadOnlySqlTransaction,)
#: The server ended the session of a transaction that sat idle, or lasted, longer than
#: its bounds (sessions.py): as for a lost link, the work is left to lease recovery.
ENDED_BY_SERVER = (
    psycopg.errors.IdleInTransactionSessionTimeout,
    psycopg.errors.TransactionTimeout,
)
#: Errors after which a connection is discarded rather than handed out again.
CUT_OFF = (psycopg.OperationalError, psycopg.InterfaceError, *NOT_WRITABLE, *ENDED_BY_SERVER)


def translate(
    name: str, exc: psycopg.Error, dsn: str, schema: str | None = None
) -> StoreError | SchemaNotReady:
    """`exc`, raised by call `name`, as the trioworker error it means (the DSN's
    password never in its text); `schema` is the queue's, None: the search_path's."""
    message = redact(f"{name}: {type(exc).__name__}: {exc}".strip(), dsn)
    if isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedFunction):
        option = "" if schema is None else f" --schema {schema}"
        return SchemaNotReady(f"{message} (run `python -m trioworker{option} migrate`)")
    if isinstance(exc, NOT_WRITABLE):
        return DatabaseUnavailable(
            f"{message} (the server is read-only: a standby or a demoted primary; reconnecting)"
        )
    if isinstance(exc, CUT_OFF):
        return DatabaseUnavailable(message)
    return StoreError(message)


def not_unicode(name: str, exc: UnicodeEncodeError) -> StoreError:
    """psycopg's own error for a lone surrogate in a parameter: nothing was sent."""
    return StoreError(f"{name}: a value is not valid Unicode ({exc.reason}); nothing sent")


def violates(exc: BaseException, index: str) -> bool:  # pragma: no mutate block
    """Whether `exc` is a unique violation of the named index (and no other)."""
    return isinstance(exc, psycopg.errors.UniqueViolation) and exc.diag.constraint_name == index
