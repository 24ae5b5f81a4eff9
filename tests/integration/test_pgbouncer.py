"""Through PgBouncer (1.18) in transaction pooling mode: Workers, the CLI and the
clients rely on no session state, LISTEN goes to a direct DSN or falls back to polling
with one warning, and the chaos run keeps the rule with far more Worker tasks than the
pool has server connections."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from tests.browser.support import dashboards, request
from tests.support.clusters import PgBouncer, pgbouncer
from tests.support.failover_chaos import HARNESS, ChaosRun, Load, WorkerSpec
from tests.support.processes import ROOT
from trioworker import open_store
from trioworker._store.api import Transaction

log = logging.getLogger(__name__)

POOL = 10
WORKERS, CONCURRENCY = 8, 8
LISTENER = "trioworker-listen"
POLLING = "notifications do not reach the listener's connection"


def backends_not_listening(dsn: str) -> int:
    """The server's backends for the database, the Workers' direct LISTEN ones and the
    harness's own direct ones (feeding, checking) aside: PgBouncer's."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            " AND application_name <> ALL(%s)",
            [[LISTENER, HARNESS]],
        ).fetchone()
    assert row is not None
    return int(row[0])


class PoolSampler:
    """In a thread, the most server connections (by PgBouncer and by the server) and
    clients seen at once."""

    def __init__(self, bouncer: PgBouncer, dsn: str) -> None:
        self.bouncer, self.dsn = bouncer, dsn
        self.most = {"backends": 0, "servers": 0, "clients": 0}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        most = self.most
        while not self._done.wait(0.05):
            most["backends"] = max(most["backends"], backends_not_listening(self.dsn))
            pools = self.bouncer.pools()
            if not pools:  # no client yet
                continue
            pool = pools[0]
            servers = sum(pool[k] for k in ("sv_active", "sv_idle", "sv_used", "sv_tested",
                                             "sv_login"))  # fmt: skip
            most["servers"] = max(most["servers"], servers)
            most["clients"] = max(most["clients"], pool["cl_active"] + pool["cl_waiting"])

    def stop(self) -> dict[str, int]:
        self._done.set()
        self._thread.join(10)
        return self.most


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trioworker", "--dsn", dsn, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_chaos_through_pgbouncer_keeps_the_rule_within_the_pool(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """8 Workers x concurrency 8 (64 tasks, 160 client connections) over 10 server
    connections, two Workers SIGKILLed and restarted: no two runs of one scope at
    once, every item Succeeded, the server never holds more than the pool's
    connections (its direct LISTEN ones aside). Half the Workers LISTEN on a direct
    DSN; the others warn once that notifications do not reach them, and poll."""
    with pgbouncer(dsn, pool_size=POOL) as bouncer:
        listen_dsn = f"{dsn} application_name={LISTENER}"
        specs = [
            WorkerSpec(f"b{n}", bouncer.dsn(), ("--listen-dsn", listen_dsn) if n % 2 else ())
            for n in range(WORKERS)
        ]
        load = Load(scopes=16, concurrency=CONCURRENCY, seconds=(0.02, 0.2))
        run = ChaosRun(tmp_path, load, specs)
        sampler = PoolSampler(bouncer, dsn)
        try:
            run.wait_ready(dsn)
            for round in range(4):
                run.feed(bouncer.dsn(), 150)
                run.feed(bouncer.dsn(), 10, seconds=(1.0, 3.0))  # caught by the kills
                time.sleep(0.7)
                if round in (1, 2):
                    run.kill(f"b{round}")
                time.sleep(1.5)
            run.drain(dsn, timeout=120)
            # The CLI and the clients through it too.
            enqueued = cli(bouncer.dsn(), "enqueue", "Hold", "--scope", "s0")
            assert enqueued.returncode == 0, enqueued.stderr
            run.fed.append(int(enqueued.stdout.split()[-1]))
            run.drain(dsn, timeout=30)
            status = cli(bouncer.dsn(), "status")
            assert status.returncode == 0 and "Succeeded" in status.stdout, status.stderr
        finally:
            most = sampler.stop()
            exits = run.stop()
            run.close()
        figures = run.judge(dsn, exits)
    killed_runs = [sp for sp in run.spans() if sp.pid in run.died_at]
    with capsys.disabled():
        print(
            "\n" + figures.line("pgbouncer chaos"),
            most,
            "runs of killed Workers:",
            len(killed_runs),
            "cut short:",
            sum(1 for sp in killed_runs if not sp.clean),
        )
    logs = {p.stem: p.read_text() for p in (tmp_path / "logs").glob("*.log")}
    tails = {name: logs[name.split()[0]][-3000:] for name in figures.unexpected_exits}
    assert figures.unexpected_exits == [] and figures.fail_stops == 0, tails
    assert figures.total_overlaps == 0, figures.overlap_examples
    assert figures.lost == 0 and figures.statuses == {"Succeeded": figures.items}
    assert most["servers"] <= POOL and most["backends"] <= POOL
    assert most["clients"] > POOL  # far more clients than server connections
    for name, text in logs.items():
        # No statement met another client's prepared statement (or missed its own).
        assert "prepared statement" not in text.lower(), name
        # One warning per process (b2 ran twice, the first killed, maybe before its
        # probe was over), none where LISTEN had a direct DSN.
        polling = text.count(POLLING)
        if int(name[1:]) % 2 == 1:
            assert polling == 0, name
        else:
            assert polling in ((1, 2) if name == "b2" else (1,)), (name, polling)


def test_the_dashboard_serves_through_pgbouncer(dsn: str, tmp_path: Path) -> None:
    """The dashboard's pages answer through a pool of two server connections, shared
    with a client's transactions: nothing of theirs relies on a session."""
    with (
        psycopg.connect(dsn, autocommit=True) as pg,
        pgbouncer(dsn, pool_size=2) as bouncer,
        dashboards(tmp_path) as start,
    ):
        pg.execute("INSERT INTO work_items (kind, scope) VALUES ('Hold', 's1'), ('Hold', NULL)")
        dashboard = start(bouncer.dsn())
        for _ in range(3):  # later requests meet other server connections
            for page in ("/", "/running", "/failures", "/workers", "/pauses"):
                answer = request(dashboard.url + page)
                assert answer.status == 200, (page, answer.body[-500:])
        assert "Traceback" not in dashboard.output()


BOUNDS = (
    "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
    "tcp_user_timeout", "client_connection_check_interval",
    "idle_in_transaction_session_timeout", "statement_timeout",
)  # fmt: skip
SHOW = "SELECT current_setting(%(name)s) AS value"


async def shown(tx: Transaction) -> dict[str, str]:
    """The bounds (sessions.py) as the transaction's server session has them."""
    return {n: (await tx.rows(SHOW, {"name": n}))[0]["value"] for n in BOUNDS}


async def test_a_transactions_bounds_end_with_it_through_pgbouncer(dsn: str) -> None:
    """Through a pool of one server connection, so every transaction meets the same
    backend: a fenced transaction and a client's own each have their bounds while they
    last (SET LOCAL with their BEGIN), and the next client of that backend finds the
    server's own values again: nothing leaks from one client to the next."""
    with (
        pgbouncer(dsn, pool_size=1) as bouncer,
        psycopg.connect(bouncer.dsn(), autocommit=True, prepare_threshold=None) as other,
    ):

        def server_values() -> dict[str, str]:
            return {n: other.execute(SHOW, {"name": n}).fetchall()[0][0] for n in BOUNDS}

        before = server_values()
        async with open_store(bouncer.dsn(), max_connections=1) as store:
            await store.enqueue("K", scope="s")
            item = await store.claim("w", 60.0, kinds=["K"])
            assert item is not None
            async with store.fenced_transaction(item.id, item.attempt, server_timeout=3.75) as tx:
                fenced = await shown(tx)
            async with store.transaction() as tx:
                own = await shown(tx)
        after = server_values()
    link = {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2",
            "tcp_keepalives_count": "3", "tcp_user_timeout": "10000",
            "client_connection_check_interval": "2s"}  # fmt: skip
    assert fenced == {**link, "idle_in_transaction_session_timeout": "3750ms",
                      "statement_timeout": "3750ms"}  # fmt: skip
    assert own == {**before, **link}
    assert after == before
    assert before["idle_in_transaction_session_timeout"] == "0"
