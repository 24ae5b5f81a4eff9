"""The queue's migrations as one SQL script, for an application whose schema another
tool manages (Alembic, Django migrations, Flyway): `python -m trioworker sql`.

The script is the migration files as they are, in yoyo's order, then yoyo's own
bookkeeping: each migration it holds is recorded in `_yoyo_migration` (and
`_yoyo_log`), in the tables yoyo itself would create. So a Worker's schema check
finds the database current, and a later `python -m trioworker migrate` (or the next
`sql --from ID`) applies only what came after. It connects to nothing: it runs where
the application's migration tool runs it, in that tool's transaction, on that
connection's search_path.
"""

from __future__ import annotations

from yoyo import read_migrations

from trioworker._core.errors import ConfigurationError
from trioworker._postgres.migrate import migrations_dir

#: yoyo's bookkeeping tables (its internal schema version 2), created only if missing.
#: tests/integration/test_sql_script.py holds them to what yoyo itself creates.
BOOKKEEPING = """\
CREATE TABLE IF NOT EXISTS _yoyo_migration (
    migration_hash varchar(64) PRIMARY KEY,
    migration_id varchar(255),
    applied_at_utc timestamp
);
CREATE TABLE IF NOT EXISTS _yoyo_log (
    id varchar(36) PRIMARY KEY,
    migration_hash varchar(64),
    migration_id varchar(255),
    operation varchar(10),
    username varchar(255),
    hostname varchar(255),
    comment varchar(255),
    created_at_utc timestamp
);
CREATE TABLE IF NOT EXISTS _yoyo_version (
    version integer NOT NULL PRIMARY KEY,
    installed_at_utc timestamp
);
INSERT INTO _yoyo_version VALUES (2, now() AT TIME ZONE 'UTC') ON CONFLICT DO NOTHING;
"""

#: A post-apply hook is logged by yoyo, not recorded as applied (it runs every time).
LOGGED = """\
INSERT INTO _yoyo_log VALUES (gen_random_uuid()::text, '{hash}', '{id}', 'apply',
    current_user, 'trioworker sql', 'applied by another tool from trioworker sql',
    now() AT TIME ZONE 'UTC');
"""

RECORD = """\
INSERT INTO _yoyo_migration VALUES ('{hash}', '{id}', now() AT TIME ZONE 'UTC');
INSERT INTO _yoyo_log VALUES (gen_random_uuid()::text, '{hash}', '{id}', 'apply',
    current_user, 'trioworker sql', 'applied by another tool from trioworker sql',
    now() AT TIME ZONE 'UTC');
"""


def queue_script(start: str | None = None) -> str:
    """The queue's migrations from `start` on (all of them by default) as one script,
    with yoyo's record of each. ConfigurationError for an unknown `start`."""
    collection = read_migrations(str(migrations_dir()))
    migrations = list(collection)
    ids = [m.id for m in migrations]
    if start is not None:
        if start not in ids:
            raise ConfigurationError(
                f"no queue migration {start!r}: the queue's migrations are {', '.join(ids)}"
            )
        migrations = migrations[ids.index(start) :]
    out = [
        f"-- trioworker's migrations {migrations[0].id} to {migrations[-1].id}, as one script"
        " (python -m trioworker sql).\n-- Apply it once, in one transaction; it records"
        " each migration in yoyo's tables as `migrate` does.\n"
    ]
    for migration in migrations:
        with open(migration.path, encoding="utf-8") as file:
            text = file.read()
        out.append(f"-- migration {migration.id}\n\n{text.rstrip()}\n")
    for hook in collection.post_apply:  # what `migrate` runs after applying anything
        with open(hook.path, encoding="utf-8") as file:
            out.append(f"-- after the migrations ({hook.id})\n\n{file.read().rstrip()}\n")
    out.append("-- yoyo's record of what this script applied\n\n" + BOOKKEEPING)
    for migration in migrations:
        out.append(RECORD.format(hash=migration.hash, id=migration.id))
    for hook in collection.post_apply:
        out.append(LOGGED.format(hash=hook.hash, id=hook.id))
    return "\n".join(out)
