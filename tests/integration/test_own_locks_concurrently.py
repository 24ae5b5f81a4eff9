"""The seeded interleavings of test_limits_concurrently.py (limit changes held open in a
limiter's transactions, claims and every other transition in Workers' transactions held
open across steps, callers, an operator), with one more session among them: a role
granted nothing, which takes and lets go of the advisory keys the queue's functions used
to take (a scope's settle and claim locks, the limits lock, the migration lock), shared
or exclusive, for its session, and tries to lock the queue's own lock rows (refused).

What must hold after every step, on committed state: as in test_limits_concurrently (no
start beyond a limit in force, no window over the rate, nothing lost, no wedge: the
limit change and the claims take turns on the claim locks, which is what keeps a claim
that read an old limit from leaving a wedge), and no session of the queue's waits, even
through another, on the role's session. After the final drain, with the role still
holding its keys, nothing due is left.

`TRIOWORKER_INTERLEAVE_SEEDS=17` reruns a seed, as for the lines test.
"""

from __future__ import annotations

from typing import Any, LiteralString

import psycopg

from tests.integration import test_lines_concurrently as lines
from tests.integration.test_limits_concurrently import LimitedRun
from tests.support.database import Databases
from tests.support.interleave import Session
from tests.support.stranger import CLAIM, LIMITS, SETTLE, stranger_role

SCOPES = ["s0", "s1", "s2"]
#: The queue's lock rows a role granted nothing tries to take.
ROW_LOCKS = [
    "SELECT FROM work_claim_locks FOR UPDATE",
    "SELECT FROM work_settle_locks FOR SHARE",
    "SELECT FROM work_claim_locks WHERE stripe = work_stripe('s0') FOR UPDATE",
]


HOLD: LiteralString = "SELECT pg_advisory_lock(%s, %s)"
HOLD_SHARED: LiteralString = "SELECT pg_advisory_lock_shared(%s, %s)"


class StrangerRun(LimitedRun):
    def __init__(self, dsn: str, seed: int, stranger_dsn: str) -> None:
        super().__init__(dsn, seed)
        self.stranger = Session.open("stranger", stranger_dsn)
        self.sessions.append(self.stranger)
        self.driver.sessions = self.sessions
        self.observer.execute("SET statement_timeout = '60s'")
        #: The advisory keys the role holds now, as (namespace, key) pairs.
        self.keys: set[tuple[int, int]] = set()
        #: Limit changes and claims that committed while the role held the limits lock.
        self.changes_beside_it = self.claims_beside_it = 0

    def session_step(self, session: Session) -> None:
        """As the limits test's, with the role among the sessions."""
        if session is self.stranger:
            self.stranger_step(session)
        else:
            super().session_step(session)

    def stranger_step(self, session: Session) -> None:
        rng = self.rng
        choice = rng.random()
        if choice < 0.15:
            self.keys.clear()
            self.driver.run(
                session, "let go of every key", lines.just("SELECT pg_advisory_unlock_all()")
            )
            return
        if choice < 0.25:
            query = rng.choice(ROW_LOCKS)
            self.driver.run(session, f"try {query}", lines.just(query))
            return
        namespace, key = rng.choice(
            [(LIMITS, 0), (SETTLE, 0)]
            + [(ns, self.hashtext(s)) for ns in (SETTLE, CLAIM) for s in SCOPES]
        )
        shared = rng.random() < 0.3
        query = HOLD_SHARED if shared else HOLD
        self.keys.add((namespace, key))

        def statement(conn: psycopg.Connection[Any]) -> None:
            conn.execute(query, (namespace, key))

        self.driver.run(session, f"hold ({namespace}, {key}){' shared' * shared}", statement)

    def hashtext(self, scope: str) -> int:
        row = self.observer.execute("SELECT hashtext(%s)", (scope,)).fetchone()
        assert row is not None
        return int(row[0])

    def harvest(self) -> None:
        """As the limits test's; the role's tries at the queue's rows are refused."""
        session = self.stranger
        if session.pending is not None and session.pending.done():
            what = session.pending_what
            _, error = self.driver.take(session)
            if error is not None:
                assert what.startswith("try ") and isinstance(
                    error, psycopg.errors.InsufficientPrivilege
                ), f"stranger: {what} raised {error!r}"
        super().harvest()

    def record(self, session: Session, what: str, result: Any) -> None:
        if what == "COMMIT" and (LIMITS, 0) in self.keys:
            if session is self.limiter:
                self.changes_beside_it += 1
            elif any(effect[0] == "claim" for effect in session.effects):
                self.claims_beside_it += 1
        super().record(session, what, result)

    def check(self) -> None:
        """The limits test's checks, and no session of the queue's waits on the role."""
        super().check()
        stranger = self.stranger.pid
        for session in self.sessions:
            if session is self.stranger or not self.driver.blocked(session):
                continue
            seen, waits_on = {session.pid}, [session.pid]
            while waits_on:
                row = self.observer.execute(
                    "SELECT pg_blocking_pids(%s)", (waits_on.pop(),)
                ).fetchone()
                assert row is not None
                for pid in set(row[0]) - seen:
                    assert pid != stranger, (
                        f"{session.name}: {session.pending_what} waits on the role granted"
                        f" nothing, which holds {sorted(self.keys)}"
                    )
                    seen.add(pid)
                    waits_on.append(pid)


def test_seeded_interleavings_never_wait_on_a_role_without_grants(databases: Databases) -> None:
    """Seeded interleavings of limit changes, claims and every other transition, beside
    a role granted nothing that holds the queue's old advisory keys: every limit holds,
    no wedge, no session of the queue's ever waits on the role; after the drain, with
    the role's keys still held, nothing due is left. Limit changes and claims committed
    while the role held the old limits lock, and claims raced limit changes."""
    beside = claims = lost = 0
    for seed in lines.seeds():
        with (
            databases.database() as dsn,
            stranger_role(databases.admin_dsn, dsn) as stranger_dsn,
        ):
            run = StrangerRun(dsn, seed, stranger_dsn).play()
        beside += run.changes_beside_it
        claims += run.claims_beside_it
        lost += run.lost_races
    assert beside > 0 and claims > 0 and lost > 0
