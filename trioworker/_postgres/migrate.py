"""Apply the yoyo migrations, safely from several processes at once.

The queue's own migrations (`migrations/`, shipped in the wheel) create only the queue's
objects. An application adds its own beside them: a directory of yoyo migrations named
by `Registry(migrations=...)`, applied with `python -m trioworker migrate --app
MODULE:ATTR` or `migrate(dsn, registry)`; its first migration depends on the queue's
last. Migration ids (file names) share one namespace, so give them a prefix.

yoyo's own lock is a row in `yoyo_lock`, which a process killed inside it leaves
behind. Migrators here first take a PostgreSQL session advisory lock, which dies with
its connection, so a leftover `yoyo_lock` row is known to be stale and is removed.

The queue lives in one schema (`schema=`, default $TRIOWORKER_SCHEMA; docs/design/
schema.md): `migrate` creates it if need be and runs every migration, and yoyo's own
tables, with the session's search_path set to it. With no schema named, the role's
search_path decides, as it always did (public, or docs/roles.sql's `trioworker`). The
advisory lock is keyed by the schema, so migrators of two schemas in one database do
not wait for each other.

`migrate` and `check_schema` block: they use psycopg's synchronous API and yoyo in the
calling thread, as the command line wants. A Trio program awaits `migrate_async` and
`check_schema_async`, which run the same calls in a worker thread.
"""

from __future__ import annotations

import functools
import logging
import re
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import psycopg
import psycopg.conninfo
import psycopg.errors
import trio
from psycopg import sql
from yoyo import get_backend, read_migrations

from trioworker._core.errors import ConfigurationError, DatabaseUnavailable, SchemaNotReady
from trioworker._postgres.dsn import describe_defaults, redact, redact_dsn
from trioworker._postgres.schema_name import SCHEMA_ENV, resolve_schema
from trioworker._postgres.trio_connection import require_trio

log = logging.getLogger("trioworker.migrate")

#: (namespace, key) of the advisory lock every migrator of the public schema takes;
#: 29815 is 'tw'. Another schema's key is hashtext(schema) (`_LOCK`).
MIGRATION_LOCK = (29815, 0)
#: The schema's CREATE privilege and its advisory lock; %(schema)s NULL: the session's
#: current schema.
_MAY_CREATE = (
    "SELECT current_user, COALESCE(%(schema)s, current_schema()),"
    " has_schema_privilege(COALESCE(%(schema)s, current_schema()), 'CREATE')"
)
_LOCK = (
    "SELECT pg_advisory_lock(%(namespace)s, CASE COALESCE(%(schema)s, current_schema())"
    " WHEN 'public' THEN %(key)s ELSE hashtext(COALESCE(%(schema)s, current_schema())) END)"
)

#: The queue's last migration: an application's first migration depends on it
#: (`-- depends: 0002.results-steps`, written from this constant by `trioworker sql`-minded
#: tools; a test keeps it the last file of migrations/).
QUEUE_MIGRATION_HEAD = "0005.spent-scopes"

#: The ids of the pre-release chain of migrations (before 0.1.0), squashed into
#: 0001.queue (issue 32). A database that has any of them applied was made by a
#: pre-release schema: its functions have other names and versions, and the baseline
#: cannot be applied over it, so it is refused by name (`PreReleaseSchema`), never
#: half-migrated.
PRE_RELEASE_MIGRATIONS = frozenset({
    "0001.baseline", "0002.limits", "0003.failover", "0004.schema", "0005.edges",
    "0006.scope-checks", "0007.completed", "0008.bounds", "0010.own-locks",
    "0011.roles", "0012.server-cost", "0013.free-scopes",
})  # fmt: skip


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


def yoyo_uri(dsn: str, schema: str | None = None) -> str:
    """A yoyo URI for a libpq DSN; every parameter rides in the query string, and
    yoyo's own `schema` (its sessions' search_path), if given, names the queue's."""
    params = {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(dsn).items()}
    if schema is not None:
        params["schema"] = schema
    return "postgresql+psycopg:///?" + urllib.parse.urlencode(params)


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


def _create_schema(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> None:
    """Create the queue's schema unless it exists (a DBA may have made it: then the
    migration role needs no CREATE on the database)."""
    exists = conn.execute("SELECT to_regnamespace(%s) IS NOT NULL", [schema]).fetchone()
    if exists and exists[0]:
        return
    try:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    except psycopg.errors.InsufficientPrivilege:
        raise ConfigurationError(
            f"the schema {schema!r} does not exist and this role may not create it:"
            " create it (docs/roles.sql) or run migrate with a role that may"
        ) from None


def migrate(dsn: str, *apps: HasMigrations, schema: str | None = None) -> list[str]:
    """Apply the queue's pending migrations, and those of `apps`, in `schema` (default
    $TRIOWORKER_SCHEMA, else the search_path's: public; created if need be); the ids
    applied (empty when the schema was already current).

    Blocking: it connects with psycopg's synchronous API and runs yoyo in the calling
    thread, waiting for other migrators' lock meanwhile. Call it from synchronous code
    (a deployment script, a pytest fixture); from a Trio task, `await migrate_async(...)`.
    """
    schema = resolve_schema(schema)
    sources = _sources(apps)
    if not pending_migrations(dsn, *apps, schema=schema):
        return []
    with _connect(dsn) as lock_conn:
        if schema is not None:
            _create_schema(lock_conn, schema)
        row = lock_conn.execute(_MAY_CREATE, {"schema": schema}).fetchone()
        if row is None or row[1] is None:
            raise ConfigurationError(
                "no schema of the role's search_path exists: name one with --schema"
                f" or ${SCHEMA_ENV}"
            )
        if not row[2]:
            raise ConfigurationError(
                f"role {row[0]!r} may not change the schema {row[1]!r}: run migrate with"
                " the migration role (docs/roles.md)"
            )
        namespace, key = MIGRATION_LOCK
        lock_conn.execute(_LOCK, {"namespace": namespace, "key": key, "schema": schema})
        backend = get_backend(yoyo_uri(dsn, schema))
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


def pending_migrations(dsn: str, *apps: HasMigrations, schema: str | None = None) -> list[str]:
    """Migrations of the queue (and of `apps`) that the database has not applied yet
    in `schema`; SchemaNotReady if a pre-release schema is there (`PRE_RELEASE_MIGRATIONS`).

    Reads yoyo's bookkeeping table directly: a Worker's role may not create the
    tables yoyo would create on connecting.
    """
    schema = resolve_schema(schema)
    wanted = [m.id for m in read_migrations(*_sources(apps))]
    names = ("_yoyo_migration",) if schema is None else (schema, "_yoyo_migration")
    bookkeeping = sql.Identifier(*names)
    with _connect(dsn) as conn:
        exists = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", [bookkeeping.as_string(conn)]
        ).fetchone()
        applied: set[str] = set()
        if exists and exists[0]:
            rows = conn.execute(sql.SQL("SELECT migration_id FROM {}").format(bookkeeping))
            applied = {str(r[0]) for r in rows}
    if stale := sorted(applied & PRE_RELEASE_MIGRATIONS):
        raise pre_release_schema(stale, schema)
    return [m for m in wanted if m not in applied]


def pre_release_schema(applied: list[str], schema: str | None) -> SchemaNotReady:
    """The refusal of a database made by the pre-release chain of migrations."""
    where = "the database" if schema is None else f"the schema {schema!r}"
    drop = "the database" if schema is None else f"the schema (DROP SCHEMA {schema} CASCADE)"
    return SchemaNotReady(
        f"{where} was made by a pre-release trioworker schema (migrations"
        f" {', '.join(applied)}), which this version cannot upgrade: its migrations were"
        f" squashed into {QUEUE_MIGRATION_HEAD} for the first release. Drop and re-create"
        f" {drop}, then run `python -m trioworker"
        + ("" if schema is None else f" --schema {schema}")
        + " migrate` (docs/guide/operating.md, 'Upgrading from a pre-release schema')"
    )


def check_schema(
    dsn: str, *apps: HasMigrations, schema: str | None = None, app_name: str | None = None
) -> None:
    """Raise SchemaNotReady unless every migration (the queue's, and those of `apps`)
    has been applied in `schema` (default $TRIOWORKER_SCHEMA, else the search_path's).
    `app_name`: how the command line named the app (`--app app_name` in the message).

    Blocking: it connects with psycopg's synchronous API in the calling thread. Call it
    from synchronous code; from a Trio task, `await check_schema_async(...)`.
    """
    schema = resolve_schema(schema)
    pending = pending_migrations(dsn, *apps, schema=schema)
    if pending:
        app = f" --app {app_name or 'MODULE:ATTR'}" if any(a.migrations for a in apps) else ""
        option = "" if schema is None else f" --schema {schema}"
        where = "" if schema is None else f" (in schema {schema})"
        raise SchemaNotReady(
            f"the database lacks migrations {', '.join(pending)}{where}:"
            f" run `python -m trioworker{option} migrate{app}` (with a role allowed to"
            " change the schema)"
        )


async def migrate_async(dsn: str, *apps: HasMigrations, schema: str | None = None) -> list[str]:
    """`migrate`, for a Trio program: the same migrations, lock and result, run in a
    worker thread (`trio.to_thread.run_sync`), so the program's other tasks go on
    meanwhile. A cancel takes effect once the migration has returned: a migration is
    not abandoned half-way. Trio only (ConfigurationError under asyncio)."""
    require_trio("migrate_async")
    call = functools.partial(migrate, dsn, *apps, schema=schema)
    return await trio.to_thread.run_sync(call)


async def check_schema_async(
    dsn: str, *apps: HasMigrations, schema: str | None = None, app_name: str | None = None
) -> None:
    """`check_schema`, for a Trio program: the same check (SchemaNotReady naming what
    is missing), run in a worker thread (`trio.to_thread.run_sync`), so the program's
    other tasks go on meanwhile. Trio only (ConfigurationError under asyncio)."""
    require_trio("check_schema_async")
    call = functools.partial(check_schema, dsn, *apps, schema=schema, app_name=app_name)
    await trio.to_thread.run_sync(call)
