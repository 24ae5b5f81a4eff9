"""PgBouncer (Debian's 1.18) in transaction pooling mode in front of a server."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from ._processes import PGBOUNCER, ClusterError, Workdir, free_port, require


@contextlib.contextmanager
def pgbouncer(
    server_dsn: str,
    *,
    pool_size: int = 10,
    max_client_conn: int = 1000,
    also_listen_on: str | None = None,
) -> Iterator[PgBouncer]:
    """A PgBouncer, started and accepting clients; stopped and removed afterwards,
    however the block ends."""
    bouncer = PgBouncer(
        server_dsn,
        pool_size=pool_size,
        max_client_conn=max_client_conn,
        also_listen_on=also_listen_on,
    )
    try:
        bouncer.start()
        yield bouncer
    finally:
        bouncer.close()


class PgBouncer:
    """PgBouncer on 127.0.0.1:`port`, pooling by transaction: a client holds one of at
    most `pool_size` server connections (per database and user) only for the length
    of a transaction, so it can rely on no session state, prepared statements
    included (1.18 cannot keep them: clients turn them off, e.g. psycopg's
    prepare_threshold=None). Every database of `server_dsn`'s server is reachable
    under its own name, for `server_dsn`'s user (with its password, if it has one);
    clients connect without one. `also_listen_on`: an address of this host it
    listens on besides 127.0.0.1 (a network namespace's link)."""

    def __init__(
        self,
        server_dsn: str,
        *,
        pool_size: int = 10,
        max_client_conn: int = 1000,
        also_listen_on: str | None = None,
    ):
        require(PGBOUNCER)
        params = conninfo_to_dict(server_dsn)
        self.server_dsn = server_dsn
        self.server_host = str(params.get("host") or "127.0.0.1")
        self.server_port = int(str(params.get("port") or 5432))
        self.user = str(params.get("user") or "postgres")
        self.dbname = str(params.get("dbname") or self.user)
        self._password = str(params.get("password") or "")
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.listen_addr = ",".join(["127.0.0.1", *([also_listen_on] if also_listen_on else [])])
        self.workdir = Workdir("pgbouncer")
        self.port = free_port()
        self.log_path = self.workdir.path / "pgbouncer.log"
        self.timings: dict[str, float] = {}
        self._process: subprocess.Popen[bytes] | None = None

    def dsn(self, dbname: str | None = None, *, host: str = "127.0.0.1") -> str:
        """A client's DSN through PgBouncer (the server's database by default)."""
        return make_conninfo(
            host=host,
            port=str(self.port),
            user=self.user,
            dbname=dbname or self.dbname,
            connect_timeout="5",
        )

    def _config(self) -> str:
        return f"""\
[databases]
* = host={self.server_host} port={self.server_port}

[pgbouncer]
listen_addr = {self.listen_addr}
listen_port = {self.port}
unix_socket_dir = {self.workdir.sockets}
pidfile = {self.workdir.path / "pgbouncer.pid"}
auth_type = trust
auth_file = {self.workdir.path / "userlist.txt"}
admin_users = {self.user}
pool_mode = transaction
default_pool_size = {self.pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = {self.max_client_conn}
ignore_startup_parameters = extra_float_digits
log_connections = 0
log_disconnections = 0
"""

    def start(self, timeout: float = 30) -> None:
        began = time.monotonic()
        ini = self.workdir.path / "pgbouncer.ini"
        ini.write_text(self._config())
        # trust still wants the user listed in the auth file; its password there (if
        # the server DSN has one) is what PgBouncer logs in to the server with.
        quoted = [value.replace('"', '""') for value in (self.user, self._password)]
        (self.workdir.path / "userlist.txt").write_text(f'"{quoted[0]}" "{quoted[1]}"\n')
        self._process = self.workdir.spawn(PGBOUNCER, ini, log=self.log_path)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.pools()
                break
            except psycopg.OperationalError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise ClusterError(
                        f"pgbouncer did not start:\n{self.log_path.read_text()}"
                    ) from None
                time.sleep(0.05)
        self.timings["start"] = time.monotonic() - began

    def _show(self, what: str) -> list[dict[str, Any]]:
        # The admin console speaks the simple query protocol only, which psycopg uses
        # for a query without parameters.
        with psycopg.connect(self.dsn("pgbouncer"), autocommit=True, row_factory=dict_row) as c:
            return c.execute(f"SHOW {what}").fetchall()  # a fixed admin command

    def pools(self) -> list[dict[str, Any]]:
        """SHOW POOLS: per database and user, its clients (cl_active, cl_waiting) and
        server connections (sv_active, sv_idle, sv_used, sv_tested, sv_login)."""
        return [p for p in self._show("POOLS") if p["database"] != "pgbouncer"]

    def servers(self) -> list[dict[str, Any]]:
        """SHOW SERVERS: one row per server connection PgBouncer holds."""
        return self._show("SERVERS")

    def server_backends(self, dbname: str | None = None) -> int:
        """Backends on the server itself (pg_stat_activity) connected to `dbname`
        (the server DSN's database by default), our own excepted: in a test, the
        database only PgBouncer connects to."""
        with psycopg.connect(self.server_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                [dbname or self.dbname],
            ).fetchone()
        assert row is not None
        return int(row[0])

    def close(self) -> None:
        """Stop PgBouncer (SIGTERM: at once, closing every connection; SIGKILL if it
        lingers) and remove its directory."""
        began = time.monotonic()
        try:
            if self._process is not None and self._process.poll() is None:
                self._process.send_signal(signal.SIGTERM)
                try:
                    self._process.wait(10)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait(10)
        finally:
            self.workdir.remove()
        self.timings["teardown"] = time.monotonic() - began
