"""The seeded interleavings of test_lines_concurrently.py, with limits among them
(issue 21, acceptance 2): scopes and kinds at running limits N in {1, 2, 3} that a
limiter session changes (raises, lowers, clears, sets the default) in transactions it
holds open, a kind under a rate limit (and in half the runs a scope under one, which
gives up its heads while its window is spent), an operator who starts items by hand, and two
Workers whose claims race for the last slots. After every step, on committed state:
no scope or kind ever gained a Running item beyond a limit in force while that start
was being made (a lowered limit cancels nothing, so more may still run than the new
limit, but none is added), no window of the rate's period holds more starts than the
rate, nothing lost, no wedge. After the drain nothing due is left unclaimed.

`TRIOWORKER_INTERLEAVE_SEEDS=17` reruns a seed, as for the lines test.
"""

from __future__ import annotations

import collections
import datetime as dt
import time
from typing import Any

import psycopg

from tests.integration import test_lines_concurrently as lines
from tests.support.interleave import Session
from tests.support.lines import wedges
from trioworker._postgres.store import LIMIT_REFUSALS, RUNNING_SLOT_INDEXES

KINDS = lines.KINDS  # K, J, P
RATED = "P"
RATE, PER = 4, 1.0  # P: at most 4 starts in any second
RATED_SCOPE = "s2"  # in half the runs, at most 2 starts a second
UNLIMITED = 10**9

Key = tuple[str, str]  # ("scope", name) or ("kind", name)


class LimitedRun(lines.Run):
    def __init__(self, dsn: str, seed: int) -> None:
        super().__init__(dsn, seed)
        self.limiter = Session.open("limiter", dsn)
        self.sessions.append(self.limiter)
        self.driver.sessions = self.sessions
        self.step_no = 0
        #: The committed limits after each step: step -> key -> limit.
        self.history: list[dict[Key, int]] = []
        #: The step each session's open transaction began at.
        self.began: dict[str, int] = {}
        #: Sessions whose COMMIT finished in this step, with the step they began at.
        self.committed: list[int] = []
        self.running_before: dict[Key, int] = {}
        #: Committed starts of the rated kind (the claims' own now()).
        self.rated_starts: list[dt.datetime] = []
        self.lost_races = 0
        self.limit_changes = 0
        self.hand_starts = 0
        self.deadlocks = 0
        o = self.observer
        rng = self.rng
        for scope in ("s0", "s1", "s2"):
            if rng.random() < 0.8:
                o.execute("SELECT work_set_limit_v1(NULL, %s, %s)", (scope, rng.randint(1, 3)))
        for kind in ("K", "J"):
            if rng.random() < 0.6:
                o.execute("SELECT work_set_limit_v1(%s, NULL, %s)", (kind, rng.randint(1, 3)))
        o.execute("SELECT work_set_limit_v1(%s, NULL, NULL, %s, %s)", (RATED, RATE, PER))
        if rng.random() < 0.5:  # a scope under a rate: spent, it gives up its heads
            o.execute("SELECT work_set_limit_v1(NULL, %s, NULL, %s, %s)", (RATED_SCOPE, 2, PER))
        self.history.append(self.limits())

    # -- what the committed state says --------------------------------------------

    def limits(self) -> dict[Key, int]:
        rows = self.observer.execute(
            "SELECT kind, scope, running FROM work_limits WHERE running IS NOT NULL"
        ).fetchall()
        default = next((r[2] for r in rows if r[0] is None and r[1] is None), 1)
        out: dict[Key, int] = {("scope", s): default for s in ("s0", "s1", "s2")}
        for kind, scope, running in rows:
            if kind is not None:
                out[("kind", kind)] = running
            elif scope is not None:
                out[("scope", scope)] = running
        return out

    def running(self) -> dict[Key, int]:
        rows = self.observer.execute(
            "SELECT kind, scope FROM work_items WHERE status = 'Running'"
        ).fetchall()
        counts: collections.Counter[Key] = collections.Counter()
        for kind, scope in rows:
            counts[("kind", kind)] += 1
            if scope is not None:
                counts[("scope", scope)] += 1
        return dict(counts)

    # -- steps ----------------------------------------------------------------------

    def step(self) -> None:
        self.step_no += 1
        self.committed = []
        super().step()

    def session_step(self, session: Session) -> None:
        """As the lines test's, with the limiter among the sessions."""
        if session is self.limiter:
            self.limiter_step(session)
        else:
            super().session_step(session)

    def begin(self, session: Session, isolation: str = "read committed") -> None:
        self.began[session.name] = self.step_no
        super().begin(session, isolation)

    def worker_step(self, session: Session) -> None:
        if not session.in_transaction:
            self.began[session.name] = self.step_no
        super().worker_step(session)

    def limiter_step(self, session: Session) -> None:
        rng = self.rng
        if not session.in_transaction:
            self.begin(session)
            return
        if rng.random() < 0.4:
            self.end(session, commit=rng.random() < 0.85)
            return
        target = rng.choice([("scope", "s0"), ("scope", "s1"), ("scope", "s2"),
                             ("kind", "K"), ("kind", "J"), ("default", "")])  # fmt: skip
        kind = target[1] if target[0] == "kind" else None
        scope = target[1] if target[0] == "scope" else None
        running = rng.choice([1, 2, 3, 0])  # 0 clears the running limit
        what = f"limit {target[0]} {target[1]} running {running}"
        self.limit_changes += 1

        def statement(conn: psycopg.Connection[Any]) -> None:
            conn.execute("SELECT work_set_limit_v1(%s, %s, %s)", (kind, scope, running))

        self.driver.run(session, what, statement)

    def operator_step(self, session: Session) -> None:
        if session.in_transaction and self.rng.random() < 0.15:
            target = self.queued_item()
            query = (
                "UPDATE work_items SET status = 'Running', attempt = attempt + 1,"
                " lease_expires_at = now() + interval '1 hour', started_at = now()"
                " WHERE id = %s AND status = 'Queued' RETURNING kind, now()"
            )

            def statement(conn: psycopg.Connection[Any]) -> list[Any]:
                rows = conn.execute(query, (target,)).fetchall()
                return [("start", kind, at) for kind, at in rows]

            self.hand_starts += 1
            self.driver.run(session, f"start by hand {target}", statement)
            return
        super().operator_step(session)

    def queued_item(self) -> int:
        rows = self.observer.execute(
            "SELECT id FROM work_items WHERE status = 'Queued' ORDER BY id"
        )
        ids = [r[0] for r in rows.fetchall()]
        return self.rng.choice(ids) if ids else 0

    def harvest(self) -> None:
        """As the lines test's, and a start refused by a slot index or a limit (a
        claim that lost a race, or a start by hand over a limit) ends its transaction."""
        for session in self.sessions:
            if session.pending is None or not session.pending.done():
                continue
            error = session.pending.exception()
            name = getattr(getattr(error, "diag", None), "constraint_name", None)
            if error is not None and name in RUNNING_SLOT_INDEXES | LIMIT_REFUSALS:
                assert session.pending_what == "claim" or session.pending_what.startswith(
                    "start by hand"
                ), f"{session.name}: {session.pending_what} refused by {name}"
                self.driver.take(session)
                self.lost_races += 1
                self.end(session, commit=False, run=False)
            elif isinstance(error, psycopg.errors.DeadlockDetected):
                # The operator's starts by hand hold slots as a claim does, and then
                # edit rows a waiting claim has locked: PostgreSQL ends one of the two
                # (the store retries its own, conflict_retries). Only with them.
                assert self.hand_starts > 0, f"{session.name}: {session.pending_what}: {error}"
                self.driver.take(session)
                self.deadlocks += 1
                self.end(session, commit=False, run=False)
        super().harvest()

    def record(self, session: Session, what: str, result: Any) -> None:
        if what == "COMMIT":
            self.committed.append(self.began.get(session.name, self.step_no))
            for effect in session.effects:
                if effect[0] == "claim" and len(effect) > 3 and effect[3] == RATED:
                    self.rated_starts.append(effect[4])
                if effect[0] == "start" and effect[1] == RATED:
                    self.rated_starts.append(effect[2])
            session.effects[:] = [e if e[0] != "claim" else e[:3] for e in session.effects]
            session.effects[:] = [e for e in session.effects if e[0] != "start"]
        super().record(session, what, result)

    # -- checks ---------------------------------------------------------------------

    def check(self) -> None:
        """The limits (as the module docstring says), nothing lost, no wedge."""
        limits = self.limits()
        self.history.append(limits)
        running = self.running()
        since = min(self.committed, default=self.step_no)
        window = self.history[max(0, since - 1) :]
        for key, now in running.items():
            if now <= self.running_before.get(key, 0):
                continue  # nothing was added
            bound = max(h.get(key, UNLIMITED) for h in window)
            assert now <= bound, (
                f"{key[0]} {key[1]}: {now} Running, beyond every limit in force since"
                f" step {since} ({[h.get(key) for h in window]})"
            )
        self.running_before = running
        starts = sorted(self.rated_starts)
        for first, last in zip(starts, starts[RATE:], strict=False):
            assert (last - first).total_seconds() >= PER, (
                f"{RATE + 1} starts of {RATED} within {PER}s: {first} .. {last}"
            )
        ids = {r[0] for r in self.observer.execute("SELECT id FROM work_items").fetchall()}
        lost, unexpected = self.model.present - ids, ids - self.model.present
        assert not lost and not unexpected, f"lost {sorted(lost)}, unexpected {sorted(unexpected)}"
        wedged = wedges(self.observer)
        assert wedged == [], f"wedged {wedged}: " + repr(
            self.observer.execute(
                "SELECT id, kind, scope, status, is_head, priority, run_after <= now()"
                " FROM work_items WHERE scope = ANY(%s) AND status IN ('Queued', 'Running')"
                " ORDER BY scope, kind, priority, run_after, id",
                (wedged,),
            ).fetchall()
        )

    def drain(self) -> None:
        """Every Worker gone: leases run out and are recovered, and a Worker serving
        every kind claims and completes until nothing is left, sleeping while only a
        rate window holds work back. Then nothing due may be left Queued."""
        o = self.observer
        idle = 0
        for _ in range(2000):
            o.execute("UPDATE work_items SET lease_expires_at = now() - interval '1s'"
                      " WHERE status = 'Running'")  # fmt: skip
            o.execute("SELECT * FROM work_recover_v1(1000000, 1000)")
            o.execute("SELECT work_settle_noted_v1(1000)")
            claimed = o.execute(
                "SELECT id, attempt, kind, started_at FROM work_claim_v3('drain', 60, 50, %s)",
                (KINDS,),
            ).fetchall()
            self.rated_starts += [r[3] for r in claimed if r[2] == RATED]
            if claimed:
                idle = 0
                o.execute(
                    "SELECT work_finish_v1(%s, %s, 'Succeeded') AS f",
                    ([r[0] for r in claimed], [r[1] for r in claimed]),
                )
                continue
            row = o.execute("SELECT work_seconds_until_due_v2(%s)", (KINDS,)).fetchone()
            wait = row[0] if row else None
            if wait is None or wait > PER:
                # Only work rescheduled for later is left, or a rate window opened
                # between the claim and this answer (which counts only windows still
                # closed): claim again, and stop at the second such answer in a row.
                idle += 1
                if idle > 1:
                    break
                continue
            idle = 0
            time.sleep(max(wait, 0.01))
        self.check()
        stuck = o.execute(
            "SELECT id, kind, scope, priority, is_head FROM work_items"
            " WHERE status IN ('Queued', 'Running') AND run_after <= now() ORDER BY id"
        ).fetchall()
        assert stuck == [], f"due work never claimed after the drain: {stuck}\n{self.why(stuck)}"

    def why(self, stuck: list[Any]) -> str:
        """What a claim of the stuck items would have seen: their rows, the limits and
        rate slots, and what the claim and the due-time answer now."""
        o = self.observer
        ids = [row[0] for row in stuck]
        return "\n".join(
            f"{what}: {o.execute(query, params).fetchall()}"
            for what, query, params in [
                ("items", "SELECT id, kind, scope, status, attempt, is_head, run_after,"
                 " lease_expires_at, scope_slot, kind_slot FROM work_items"
                 " WHERE id = ANY(%s) ORDER BY id", (ids,)),
                ("limits", "SELECT * FROM work_limits ORDER BY id", ()),
                ("rate slots", "SELECT *, now() FROM work_rate_slots ORDER BY 1, 2", ()),
                ("pauses", "SELECT * FROM work_pauses", ()),
                ("locks", "SELECT locktype, objid, mode, granted, pid FROM pg_locks"
                 " WHERE locktype = 'advisory'", ()),
                ("due", "SELECT work_seconds_until_due_v2(%s)", (KINDS,)),
                ("claim", "SELECT id FROM work_claim_v3('why', 60, 50, %s)", (KINDS,)),
            ]
        )  # fmt: skip


def test_seeded_interleavings_hold_every_limit_and_leave_nothing_due(databases: Any) -> None:
    """Seeded interleavings with running limits 1..3 on scopes and kinds that change
    as work runs, a rate-limited kind and starts by hand: no start beyond a limit, no
    window over the rate, nothing lost, no wedge; after the drain nothing due is left.
    The runs raced: claims and starts by hand lost to the slot indexes and refusals."""
    lost = changes = 0
    for seed in lines.seeds():
        with databases.database() as dsn:
            run = LimitedRun(dsn, seed).play()
        lost += run.lost_races
        changes += run.limit_changes
        assert run.rated_starts, f"seed {seed}: the rated kind never started"
    assert lost > 0 and changes > 0
