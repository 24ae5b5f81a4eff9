"""Seeded interleavings of real transactions, in the manner of PostgreSQL's isolation
tests: several sessions, each holding its transaction open across steps, driven one
step at a time by a random.Random(seed), so a failure reproduces from its seed.

A step sends one statement to one session. A statement that waits on a lock another
session holds stays pending: the driver goes on with other sessions, and the statement
completes when some later step (a commit, say) lets it. A pending statement counts as
blocked only after it has waited longer than any bounded wait in the product (the
settle lock's 100 ms, the requeue's 200 ms), so what blocks, and what a step returns,
depends on the seed alone.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

import attrs
import psycopg

from tests.support.lines import waits_on_a_lock

Conn = psycopg.Connection[Any]
Statement = Callable[[Conn], Any]

#: Longer than any bounded wait in the product, so only a true block is left pending.
BLOCKED_AFTER = 0.4


@attrs.define(eq=False)
class Session:
    """One connection (autocommit; transactions are explicit BEGIN ... COMMIT), driven
    from a thread of its own."""

    name: str
    conn: Conn
    pid: int
    in_transaction: bool = False
    pending: concurrent.futures.Future[Any] | None = None
    pending_what: str = ""
    #: What the open transaction did, for the driver's model once it commits.
    effects: list[Any] = attrs.Factory(list)
    _thread: concurrent.futures.ThreadPoolExecutor = attrs.Factory(
        lambda: concurrent.futures.ThreadPoolExecutor(max_workers=1)
    )

    @classmethod
    def open(cls, name: str, dsn: str) -> Session:
        conn = psycopg.connect(dsn, autocommit=True)
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        return cls(name, conn, int(row[0]))

    def submit(self, what: str, statement: Statement) -> concurrent.futures.Future[Any]:
        assert self.pending is None, f"{self.name} is still running {self.pending_what}"
        self.pending_what = what
        self.pending = self._thread.submit(statement, self.conn)
        return self.pending

    def close(self) -> None:
        """Close the connection, cancelling a statement still waiting (a failed run
        can leave one blocked on another session's lock)."""
        if self.pending is not None and not self.pending.done():
            self.conn.cancel_safe()
        self._thread.shutdown(wait=True)
        self.conn.close()


class Driver:
    """Runs statements on sessions and waits until every pending one is done or
    truly blocked."""

    def __init__(self, observer: Conn, sessions: list[Session]) -> None:
        self.observer = observer
        self.sessions = sessions
        self.log: list[str] = []
        #: Statements that were left pending, blocked by another session.
        self.blocks = 0

    def run(
        self, session: Session, what: str, statement: Statement
    ) -> concurrent.futures.Future[Any]:
        self.log.append(f"{session.name}: {what}")
        future = session.submit(what, statement)
        self.settle()
        if not future.done():
            self.blocks += 1
            self.log[-1] += "  (blocked)"
        return future

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until every pending statement has finished or waited on a lock for
        longer than BLOCKED_AFTER."""
        deadline = time.monotonic() + timeout
        blocked_since: dict[str, float] = {}
        while True:
            waiting = False
            for session in self.sessions:
                future = session.pending
                if future is None:
                    continue
                if future.done():
                    continue
                if waits_on_a_lock(self.observer, session.pid):
                    since = blocked_since.setdefault(session.name, time.monotonic())
                    if time.monotonic() - since < BLOCKED_AFTER:
                        waiting = True
                else:
                    blocked_since.pop(session.name, None)
                    waiting = True
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    "a statement neither finished nor blocked: "
                    + ", ".join(f"{s.name}: {s.pending_what}" for s in self.sessions if s.pending)
                )
            time.sleep(0.01)

    def blocked(self, session: Session) -> bool:
        return session.pending is not None and not session.pending.done()

    def take(self, session: Session) -> tuple[Any, BaseException | None]:
        """The finished pending statement's result (or error); clears it."""
        future = session.pending
        assert future is not None and future.done()
        session.pending = None
        error = future.exception()
        return (None, error) if error is not None else (future.result(), None)

    def end_every_transaction(
        self, harvest: Callable[[], None], end: Callable[[Session], None]
    ) -> None:
        """End each session's open transaction with `end(session)` (a commit or a
        rollback, as the run's seed says) once its pending statement has finished,
        collecting results with `harvest()`, until no transaction is open and nothing
        is pending (a statement an ended transaction released goes on in between)."""
        for _ in range(100):
            harvest()
            open_ = [s for s in self.sessions if s.in_transaction and s.pending is None]
            if not open_ and not any(s.pending for s in self.sessions):
                return
            for session in open_:
                end(session)
                harvest()
            self.settle()
        raise AssertionError("sessions never finished")
