"""The cluster harnesses (tests/support/clusters) do what they say, on real processes:
a streaming pair that replicates, can be cut off, crashed and failed over by hand; a
pg_auto_failover formation that switches over and fails over; PgBouncer in transaction
pooling mode that keeps the server's connections within its pool."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg
import pytest

from tests.support.clusters import auto_failover, multi_host_dsn, pgbouncer, streaming_pair

log = logging.getLogger(__name__)

Conn = psycopg.Connection[Any]

#: How long a commit is given to (not) reach a cut-off standby. A streaming standby
#: replays a commit in milliseconds here; the walreceiver retries every second.
ABSENCE_WAIT = 2.5


def rows(conn: Conn) -> list[str]:
    return [row[0] for row in conn.execute("SELECT label FROM t ORDER BY label")]


def insert(conn: Conn, label: str) -> None:
    conn.execute("INSERT INTO t (label) VALUES (%s)", [label])


def test_standby_replays_commits_and_refuses_writes() -> None:
    """A commit on the primary is visible on the standby, and a write on the standby
    is refused with SQLSTATE 25006 (read-only transaction)."""
    with streaming_pair() as pair:
        with pair.primary.connect() as primary:
            primary.execute("CREATE TABLE t (label text)")
            insert(primary, "one")
        pair.wait_replayed()
        with pair.standby.connect() as standby:
            assert rows(standby) == ["one"]
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as refused:
                insert(standby, "two")
            assert refused.value.sqlstate == "25006"
    log.info("streaming pair timings: %s", pair.timings)


def test_cut_replication_keeps_later_commits_off_the_standby() -> None:
    """After cut_replication() the primary still commits, but the commit does not reach
    the standby (its received WAL stops short of it); once restored, it does."""
    with streaming_pair() as pair:
        with pair.primary.connect() as primary:
            primary.execute("CREATE TABLE t (label text)")
            insert(primary, "before")
            pair.wait_replayed()
            pair.cut_replication()
            insert(primary, "after")
            after = primary.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            assert after is not None
            # Absence can only be shown by waiting: long enough for a streaming standby
            # to replay it many times over and for the walreceiver to retry twice.
            time.sleep(ABSENCE_WAIT)
            assert primary.execute("SELECT count(*) FROM pg_stat_replication").fetchone() == (0,)
        with pair.standby.connect() as standby:
            assert rows(standby) == ["before"]
            received = standby.execute(
                "SELECT pg_last_wal_receive_lsn() < %s::pg_lsn", [after[0]]
            ).fetchone()
            assert received == (True,)
        # The control: the same commit does reach the standby once it may.
        pair.restore_replication()
        pair.wait_replayed()
        with pair.standby.connect() as standby:
            assert rows(standby) == ["after", "before"]
    log.info("streaming pair timings: %s", pair.timings)


def test_kill_and_promote_loses_the_cut_commit_and_the_multi_host_dsn_follows() -> None:
    """The multi-host DSN picks the writable node in either order; after the primary
    is cut off, crashed and the standby promoted, it reaches the promoted standby, which
    takes writes and lacks the commit it never received; the old primary, rewound and
    rejoined as a standby, refuses writes with 25006."""
    with streaming_pair() as pair:
        reversed_dsn = multi_host_dsn([pair.standby, pair.primary])
        for dsn in (pair.multi_host_dsn(), reversed_dsn):
            with psycopg.connect(dsn, autocommit=True) as conn:
                assert conn.info.port == pair.primary.port
        with pair.primary.connect() as primary:
            primary.execute("CREATE TABLE t (label text)")
            insert(primary, "kept")
            pair.wait_replayed()
            pair.cut_replication()
            insert(primary, "lost")  # acknowledged by the primary alone
        pair.kill_primary()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(pair.primary.dsn()).close()
        pair.promote_standby()
        for dsn in (pair.multi_host_dsn(), reversed_dsn):
            with psycopg.connect(dsn, autocommit=True) as conn:
                assert conn.info.port == pair.standby.port
                assert rows(conn) == ["kept"]
        with psycopg.connect(pair.multi_host_dsn(), autocommit=True) as conn:
            insert(conn, "new primary")
        pair.rejoin_old_primary()
        with pair.primary.connect() as old:
            assert old.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as refused:
                insert(old, "refused")
            assert refused.value.sqlstate == "25006"
        pair.wait_streaming(pair.standby, pair.primary)
        with psycopg.connect(pair.multi_host_dsn(), autocommit=True) as conn:
            assert conn.info.port == pair.standby.port
            insert(conn, "replicated back")
        deadline = time.monotonic() + 10
        with pair.primary.connect() as old:
            while "replicated back" not in rows(old) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert rows(old) == ["kept", "new primary", "replicated back"]
    log.info("streaming pair timings: %s", pair.timings)


def test_auto_failover_switchover_moves_the_multi_host_dsn_and_demotes_the_old_primary() -> None:
    """A planned switchover (pg_autoctl perform failover) makes the secondary primary
    with every commit (the secondary is synchronous); the multi-host DSN follows it and
    the old primary, now its secondary, refuses writes with 25006."""
    with auto_failover() as formation:
        old = formation.wait_ready()
        assert old is formation.nodes[0]
        with psycopg.connect(formation.multi_host_dsn(), autocommit=True) as conn:
            assert conn.info.port == old.port
            conn.execute("CREATE TABLE t (label text)")
            insert(conn, "before")
        new = formation.perform_switchover()
        assert new is formation.nodes[1]
        assert formation.states() == {
            old.name: ("secondary", "secondary"),
            new.name: ("primary", "primary"),
        }
        with psycopg.connect(formation.multi_host_dsn(), autocommit=True) as conn:
            assert conn.info.port == new.port
            assert rows(conn) == ["before"]
            insert(conn, "after")
        with old.connect() as demoted:
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as refused:
                insert(demoted, "refused")
            assert refused.value.sqlstate == "25006"
    log.info("pg_auto_failover timings: %s", formation.timings)


def test_auto_failover_survives_a_postmaster_kill_and_fails_over_a_crashed_node() -> None:
    """A SIGKILLed postmaster is restarted by its keeper and takes writes again; a
    crashed primary node (keeper and PostgreSQL) is failed over by the monitor to the
    secondary, with every commit, and the multi-host DSN follows; restarted, the
    crashed node rejoins as a secondary that refuses writes with 25006."""
    with auto_failover() as formation:
        first = formation.wait_ready()
        with psycopg.connect(formation.multi_host_dsn(), autocommit=True) as conn:
            conn.execute("CREATE TABLE t (label text)")
            insert(conn, "before kill")
        killed = first.postmaster_pid()
        back = formation.kill_primary_postmaster()
        log.info("postmaster of %s killed: %s took writes again", first.name, back.name)
        assert back.postmaster_pid() not in (None, killed)
        with psycopg.connect(formation.multi_host_dsn(), autocommit=True) as conn:
            assert conn.info.port == back.port
            assert rows(conn) == ["before kill"]
            insert(conn, "before crash")
        formation.wait_ready()
        crashed, new = formation.crash_primary_node()
        assert new is not crashed
        assert crashed.postmaster_pid() is None
        with psycopg.connect(formation.multi_host_dsn(), autocommit=True) as conn:
            assert conn.info.port == new.port
            assert rows(conn) == ["before crash", "before kill"]
            insert(conn, "after crash")
        formation.restart_node(crashed)
        assert formation.primary() is new
        with crashed.connect() as rejoined:
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as refused:
                insert(rejoined, "refused")
            assert refused.value.sqlstate == "25006"
            # Synchronous again: what the primary commits is on the secondary.
            with psycopg.connect(formation.multi_host_dsn(), autocommit=True) as conn:
                insert(conn, "rejoined")
            deadline = time.monotonic() + 10
            while "rejoined" not in rows(rejoined) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert rows(rejoined) == ["after crash", "before crash", "before kill", "rejoined"]
    log.info("pg_auto_failover timings: %s", formation.timings)


CLIENTS = 40
TRANSACTIONS = 5


def test_pgbouncer_serves_many_clients_on_at_most_its_pool_of_server_connections(
    dsn: str,
) -> None:
    """Forty clients connected at once through PgBouncer in transaction mode all get
    their transactions done, sharing server connections between transactions, while
    the server never sees more than the pool's 10 backends (counted both on the server
    and by PgBouncer)."""
    with pgbouncer(dsn) as bouncer:
        assert bouncer.pool_size == 10
        connected = threading.Barrier(CLIENTS + 1)
        backends: dict[int, set[int]] = {}
        done: list[int] = []

        def client(number: int) -> None:
            # No prepared statements: a later transaction may run on another server.
            with psycopg.connect(bouncer.dsn(), prepare_threshold=None) as conn:
                connected.wait(timeout=30)
                for _ in range(TRANSACTIONS):
                    with conn.transaction():
                        row = conn.execute("SELECT pg_backend_pid(), pg_sleep(0.05)").fetchone()
                        assert row is not None
                        backends.setdefault(number, set()).add(row[0])
                done.append(number)

        threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        connected.wait(timeout=30)
        most_backends = most_servers = most_clients = 0
        while any(thread.is_alive() for thread in threads):
            most_backends = max(most_backends, bouncer.server_backends())
            pool = bouncer.pools()[0]
            servers = sum(
                pool[k] for k in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login")
            )
            most_servers = max(most_servers, servers)
            most_clients = max(most_clients, pool["cl_active"] + pool["cl_waiting"])
            time.sleep(0.01)
        for thread in threads:
            thread.join()
        assert sorted(done) == list(range(CLIENTS))
        assert most_clients == CLIENTS
        assert most_backends == most_servers == 10
        seen = set().union(*backends.values())
        assert len(seen) == 10
        assert any(len(pids) > 1 for pids in backends.values())  # pooled by transaction
        # At rest, the server and PgBouncer count the same connections.
        assert bouncer.server_backends() == len(bouncer.servers()) == 10
    log.info("pgbouncer timings: %s", bouncer.timings)


def test_pgbouncer_shares_one_server_connection_so_prepared_statements_collide(
    dsn: str,
) -> None:
    """Through a pool of one server connection, two clients run on the same backend,
    so the statement one prepares is already there when the other prepares its own
    under the same name: why clients of PgBouncer 1.18 must not prepare."""
    with (
        pgbouncer(dsn, pool_size=1) as bouncer,
        psycopg.connect(bouncer.dsn(), autocommit=True, prepare_threshold=None) as first,
        psycopg.connect(bouncer.dsn(), autocommit=True, prepare_threshold=None) as second,
    ):
        pid = "SELECT pg_backend_pid()"
        assert first.execute(pid).fetchone() == second.execute(pid).fetchone()
        first.prepare_threshold = second.prepare_threshold = 0  # prepare every query
        first.execute("SELECT 1")  # prepared as psycopg's first statement, _pg3_0
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
            second.execute("SELECT 2")  # its own first statement: _pg3_0 again
