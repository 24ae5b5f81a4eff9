"""A role with no grants at all, as every role that can connect is to the queue (PUBLIC
has CONNECT on every database): it can take any advisory lock, since advisory locks are
one key space for the whole database and need no privilege (issue 32). Nothing of the
queue's may wait on what it holds.

An advisory key is written as pg_locks shows it: (classid, objid, objsubid), objsubid 2
for a key of two integers (classid the first, objid the second, both as unsigned oids)
and 1 for a bigint key (its high and low halves).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import psycopg
from psycopg import sql

Conn = psycopg.Connection[Any]
Key = tuple[int, int, int]

#: The namespaces the queue's advisory locks used (migrations 0001-0007): 29815, a
#: scope's settle lock (and, key 0, the migration lock of the public schema); 29816, a
#: scope's claim lock; 29817, key 0, the limits lock.
SETTLE, CLAIM, LIMITS = 29815, 29816, 29817

#: The advisory locks of this database: every session's, granted or waited for.
ADVISORY_LOCKS = """
SELECT l.classid::bigint, l.objid::bigint, l.objsubid::integer, l.pid, l.mode, l.granted
FROM pg_locks AS l
WHERE l.locktype = 'advisory'
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


@contextlib.contextmanager
def stranger_role(admin_dsn: str, dsn: str) -> Iterator[str]:
    """The DSN of a new role that may log in and has been granted nothing (so it has what
    PUBLIC has: CONNECT, TEMPORARY, USAGE on public), for the database of `dsn`; the
    role is dropped afterwards (roles are cluster-wide)."""
    role = f"tw_stranger_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        params["user"] = role
        yield psycopg.conninfo.make_conninfo(**params)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def two_int_key(namespace: int, key: int) -> Key:
    """An advisory key of two integers, as pg_locks shows it."""
    return (namespace % 2**32, key % 2**32, 2)


def families(conn: Conn, scopes: Iterable[str]) -> set[Key]:
    """Every advisory key the queue's functions took for `scopes`, and the limits and
    migration locks: (29815, hashtext(scope)), (29816, hashtext(scope)), (29817, 0),
    (29815, 0)."""
    keys = {two_int_key(LIMITS, 0), two_int_key(SETTLE, 0)}
    for scope in scopes:
        row = conn.execute("SELECT hashtext(%s)", (scope,)).fetchone()
        assert row is not None
        keys |= {two_int_key(SETTLE, row[0]), two_int_key(CLAIM, row[0])}
    return keys


def advisory_keys(conn: Conn, *, except_pid: int | None = None) -> set[Key]:
    """The advisory keys any session of this database holds or waits for now."""
    return {
        (classid, objid, objsubid)
        for classid, objid, objsubid, pid, _, _ in conn.execute(ADVISORY_LOCKS).fetchall()
        if pid != except_pid
    }


def hold(conn: Conn, keys: Iterable[Key]) -> None:
    """Take every key exclusively, for the session (autocommit `conn`): what an
    application's own lock on the same keys, or a hostile role, does."""
    for classid, objid, objsubid in sorted(keys):
        if objsubid == 2:
            conn.execute(
                "SELECT pg_advisory_lock(%s::bigint::bit(32)::integer,"
                " %s::bigint::bit(32)::integer)",
                (classid, objid),
            )
        else:
            key = (classid << 32) | objid
            conn.execute("SELECT pg_advisory_lock(%s::bigint)", (key - 2**64 * (key >= 2**63),))


def held_by(conn: Conn) -> set[Key]:
    """The advisory keys `conn`'s session holds (granted)."""
    pid = conn.info.backend_pid
    return {
        (classid, objid, objsubid)
        for classid, objid, objsubid, holder, _, granted in conn.execute(ADVISORY_LOCKS).fetchall()
        if holder == pid and granted
    }
