"""Apply the yoyo migrations, safely from several processes at once.

The queue's own migrations (`migrations/`, shipped in the wheel) create only the queue's
objects. An application adds its own beside them: a directory of yoyo migrations named
by `Registry(migrations=...)`, applied with `python -m trioworker migrate --app
MODULE:ATTR` or `migrate(dsn, registry)`; its first migration depends on the queue's
last. Migration ids (file names) share one namespace, so give them a prefix.

yoyo's own lock is a row in `yoyo_lock`, which a process killed inside it leaves
behind. Migrators here first take a PostgreSQL session advisory lock, which dies with
its connection, so a leftover `yoyo_lock` row is known to be stale and is removed.
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import psycopg
import psycopg.conninfo
from yoyo import get_backend, read_migrations

from trioworker._core.errors import ConfigurationError, DatabaseUnavailable, SchemaNotReady
from trioworker._postgres.dsn import describe_defaults, redact, redact_dsn

log = logging.getLogger("trioworker.migrate")

#: (namespace, key) of the advisory lock every migrator takes; 29815 is 'tw'.
MIGRATION_LOCK = (29815, 0)

#: The queue's last migration: an application's first migration depends on it
#: (`-- depends: 0002.limits`, written from this constant by `trioworker sql`-minded
#: tools; a test keeps it the last file of migrations/).
QUEUE_MIGRATION_HEAD = "0002.limits"


class HasMigrations(Protocol):
    """An application's migrations: a trioworker.Registry made with `migrations=`."""

    @property
    def migrations(self) -> Path | None: ...


def migrations_dir() -> Path:
    """The queue's own migrations: shipped in the wheel, or the checkout's `migrations/`."""
    package = Path(__file__).parents[1]
    packaged = package / "_migrations"
    return packaged if packaged.is_dir() else package.parent / "migrations"


def _sources(apps: Iterable[HasMigrations]) -> list[str]:
    sources = [str(migrations_dir())]
    for app in apps:
        if app.migrations is not None:
            if not Path(app.migrations).is_dir():
                raise ConfigurationError(f"no migrations directory {app.migrations}")
            sources.append(str(app.migrations))
    return sources


def yoyo_uri(dsn: str) -> str:
    """A yoyo URI for a libpq DSN; every parameter rides in the query string."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    return "postgresql+psycopg:///?" + urllib.parse.urlencode(
        {k: str(v) for k, v in params.items()}
    )


# Connection failures no retry can fix: bad password, unknown role or database, no
# such host. libpq reports them as text only (no SQLSTATE before the session starts).
_PERMANENT = re.compile(
    r"password authentication failed|no pg_hba\.conf entry|role \"[^\"]*\" does not exist"
    r"|database \"[^\"]*\" does not exist|could not translate host name|permission denied"
)


def connection_error(exc: psycopg.OperationalError, dsn: str) -> Exception:
    """A connect failure as ConfigurationError (permanent) or DatabaseUnavailable."""
    detail = " ".join(str(exc).split())  # libpq's hints span lines; keep it to one
    where = redact_dsn(dsn) if dsn else f"no DSN given, so {describe_defaults()}"
    message = redact(f"cannot connect to PostgreSQL ({where}): {detail}", dsn)
    if _PERMANENT.search(detail):
        return ConfigurationError(message)
    return DatabaseUnavailable(message)


def _connect(dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise connection_error(exc, dsn) from None


def migrate(dsn: str, *apps: HasMigrations) -> list[str]:
    """Apply the queue's pending migrations, and those of `apps`; the ids applied
    (empty when the schema was already current)."""
    sources = _sources(apps)
    if not pending_migrations(dsn, *apps):
        return []
    with _connect(dsn) as lock_conn:
        row = lock_conn.execute(
            "SELECT current_user, has_schema_privilege(current_schema(), 'CREATE')"
        ).fetchone()
        if row is None or not row[1]:
            raise ConfigurationError(
                f"role {row[0] if row else '?'!r} may not change the schema: run migrate"
                " with the migration role (docs/roles.md)"
            )
        lock_conn.execute("SELECT pg_advisory_lock(%s, %s)", MIGRATION_LOCK)
        backend = get_backend(yoyo_uri(dsn))
        try:
            if "yoyo_lock" in backend.list_tables():
                backend.execute("DELETE FROM yoyo_lock")  # stale: we hold the real lock
                backend.commit()
            pending = backend.to_apply(read_migrations(*sources))
            with backend.lock():
                backend.apply_migrations(pending)
            applied = [m.id for m in pending]
        finally:
            backend.connection.close()
    for migration_id in applied:
        log.debug("applied migration %s", migration_id)
    return applied


def pending_migrations(dsn: str, *apps: HasMigrations) -> list[str]:
    """Migrations of the queue (and of `apps`) that the database has not applied yet.

    Reads yoyo's bookkeeping table directly: a Worker's role may not create the
    tables yoyo would create on connecting.
    """
    wanted = [m.id for m in read_migrations(*_sources(apps))]
    with _connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass('_yoyo_migration') IS NOT NULL").fetchone()
        applied: set[str] = set()
        if exists and exists[0]:
            rows = conn.execute("SELECT migration_id FROM _yoyo_migration")
            applied = {str(r[0]) for r in rows}
    return [m for m in wanted if m not in applied]


def check_schema(dsn: str, *apps: HasMigrations) -> None:
    """Raise SchemaNotReady unless every migration (the queue's, and those of `apps`)
    has been applied."""
    pending = pending_migrations(dsn, *apps)
    if pending:
        app = " --app MODULE:ATTR" if any(a.migrations for a in apps) else ""
        raise SchemaNotReady(
            f"the database lacks migrations {', '.join(pending)}:"
            f" run `python -m trioworker migrate{app}` (with a role allowed to change the"
            " schema)"
        )
