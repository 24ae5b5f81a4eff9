"""The seeded interleavings of tests/integration/test_lines_concurrently.py, with
dependencies: callers enqueue random DAGs (each item after 0 to 3 items enqueued
before it: committed ones, whatever their status, or the caller's own earlier ones),
two Workers claim, finish (Succeeded, Failed, Cancelled), retry and release, ask for
cancels, run settle passes and retention, and an operator cancels, retries, deletes,
locks, and tries to make Waiting items Queued or Running by hand. Every session holds
its transaction open across steps; the driver picks each step from a seed.

After every step, on committed state: the rule (tests/support/dependencies.py), every
claim the model says a Worker holds still Running, no scope with two Running, no
wedge. At the end, once every transaction has ended and one settle pass has run:
nothing Waiting whose parents have all ended; and after draining the queue with claims
and finishes, every item has ended.

Deadlocks: the commit of a child locks its parents (in id order for each child, but a
transaction's children lock theirs one child after another), so a caller that enqueued
children of parents in a falling order, or a transaction that locked two parents in
another order than a child's commit does, can deadlock with another (test_dependencies_
concurrently.py, test_children_of_shared_parents_enqueued_in_two_transactions_never_
deadlock). These callers
choose parents so that each transaction locks its committed parents in rising order,
and every other session's transaction runs one statement: a deadlock here is another.
"""

from __future__ import annotations

import collections
import random
from typing import Any, LiteralString

import psycopg

from tests.support import dependencies as deps
from tests.support.interleave import Driver, Session
from tests.support.lines import running_per_scope, wedges

Conn = psycopg.Connection[Any]

KINDS = ["K", "J"]
SCOPES = ["s0", "s1", None, None]
ISOLATIONS = ["read committed"] * 3 + ["repeatable read"]
#: Errors a step may meet, by SQLSTATE, and who may meet them.
SERIALIZATION = "40001"  # a caller at REPEATABLE READ: a parent changed since its snapshot
FOREIGN_KEY = "23503"  # a caller naming a parent that retention deleted meanwhile
CHECK = "23514"  # the operator making a Waiting item Queued, or deleting a needed parent

INSERT: LiteralString = """
INSERT INTO work_items (kind, scope, after)
SELECT r.kind, r.scope, r.after::bigint[]
FROM unnest(%s::text[], %s::text[], %s::text[]) WITH ORDINALITY AS r (kind, scope, after, n)
ORDER BY r.n
RETURNING id
"""


class DagRun:
    def __init__(self, dsn: str, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.observer = psycopg.connect(dsn, autocommit=True)
        self.callers = [Session.open(f"caller{i}", dsn) for i in range(2)]
        self.workers = [Session.open(f"worker{i}", dsn) for i in range(2)]
        self.operator = Session.open("operator", dsn)
        self.sessions = [*self.callers, *self.workers, self.operator]
        self.driver = Driver(self.observer, self.sessions)
        #: Committed claims: worker -> id -> attempt.
        self.owned: dict[str, dict[int, int]] = {w.name: {} for w in self.workers}
        #: The committed parents each caller's open transaction named, highest.
        self.highest_parent: dict[str, int] = {}
        self.ever_succeeded: set[int] = set()
        self.ever_waiting: set[int] = set()
        self.flipped: set[int] = set()
        self.counts: collections.Counter[str] = collections.Counter()

    def close(self) -> None:
        for session in self.sessions:
            session.close()
        self.observer.close()

    # -- driving ----------------------------------------------------------------------

    def step(self) -> None:
        self.harvest()
        free = [s for s in self.sessions if s.pending is None]
        if not free:
            raise AssertionError("every session is blocked: a deadlock among them")
        weights = [4 if s in self.workers else 1 if s is self.operator else 2 for s in free]
        session = self.rng.choices(free, weights)[0]
        holders = self.holders()
        if holders and self.rng.random() < 0.8:
            # A statement waits: most often, a transaction it waits for ends next.
            self.end(self.rng.choice(holders), commit=self.rng.random() < 0.85)
        elif session in self.callers:
            self.caller_step(session)
        elif session is self.operator:
            self.operator_step(session)
        else:
            self.worker_step(session)
        self.harvest()
        self.check()

    def holders(self) -> list[Session]:
        """Sessions in a transaction, not running a statement, that a waiting
        statement of another session waits for."""
        by_pid = {s.pid: s for s in self.sessions}
        found: list[Session] = []
        for session in self.sessions:
            if not self.driver.blocked(session):
                continue
            row = self.observer.execute("SELECT pg_blocking_pids(%s)", (session.pid,)).fetchone()
            for pid in sorted(row[0] if row else []):
                holder = by_pid.get(pid)
                if holder and holder.pending is None and holder.in_transaction:
                    found.append(holder)
        return sorted(set(found), key=self.sessions.index)

    def harvest(self) -> None:
        """Collect every finished statement; an error must be one its step may meet,
        and then its transaction is over."""
        for session in self.sessions:
            if session.pending is None or not session.pending.done():
                continue
            what = session.pending_what
            result, error = self.driver.take(session)
            if error is None:
                self.record(session, what, result)
                continue
            state = getattr(error, "sqlstate", None)
            allowed = {
                SERIALIZATION: session in self.callers,
                FOREIGN_KEY: session in self.callers and what.startswith("INSERT"),
                CHECK: session is self.operator,
            }
            if not allowed.get(state or "", False):
                raise AssertionError(f"{session.name}: {what} raised {error!r}") from error
            self.counts[f"refused {state}"] += 1
            self.end(session, commit=False, run=False)

    def record(self, session: Session, what: str, result: Any) -> None:
        if what == "COMMIT":
            owned = self.owned.get(session.name, {})
            for effect, *args in session.effects:
                if effect == "by hand":
                    self.counts["moved by hand"] += 1
                elif effect == "claim":
                    owned[args[0]] = args[1]
                elif effect == "done":
                    owned.pop(args[0], None)
            session.effects.clear()
        elif what == "ROLLBACK":
            session.effects.clear()
        elif result:
            session.effects.extend(result)

    def run(self, session: Session, what: str, query: LiteralString, params: Any = ()) -> None:
        """One statement, in the session's transaction (begun first if none is open);
        its effects as the statement's rows say."""
        begin = not session.in_transaction
        session.in_transaction = True

        def statement(conn: Conn) -> list[Any]:
            if begin:
                conn.execute("BEGIN")
            rows = conn.execute(query, params).fetchall()
            if what.startswith("claim"):
                return [("claim", id, attempt) for id, attempt in rows]
            if what.startswith(("finish", "retry", "release")):
                return [("done", row[0]) for row in rows]
            if what.startswith("INSERT"):
                return [("insert", row[0]) for row in rows]
            if what.startswith(("start by hand", "make Queued by hand")):
                # Passed over (or refused) while a parent has not Succeeded; once all
                # have, the item may be moved by hand (the rule is checked after).
                return [("by hand", row[0]) for row in rows]
            return []

        self.driver.run(session, what, statement)

    def end(self, session: Session, *, commit: bool, run: bool = True) -> None:
        session.in_transaction = False
        self.highest_parent.pop(session.name, None)
        if not run:
            session.conn.execute("ROLLBACK")
            session.effects.clear()
            return
        verb: LiteralString = "COMMIT" if commit else "ROLLBACK"

        def statement(conn: Conn) -> None:
            conn.execute(verb)

        self.driver.run(session, verb, statement)

    # -- callers ------------------------------------------------------------------------

    def caller_step(self, session: Session) -> None:
        rng = self.rng
        if not session.in_transaction:
            isolation = rng.choice(ISOLATIONS)
            session.in_transaction = True
            self.driver.run(session, f"BEGIN {isolation}", begin(isolation))
            return
        if rng.random() < 0.4:
            self.end(session, commit=rng.random() < 0.85)
            return
        rows = [self.new_row(session) for _ in range(rng.randint(1, 3))]
        params = (
            [row[0] for row in rows],
            [row[1] for row in rows],
            [None if row[2] is None else "{" + ",".join(map(str, row[2])) + "}" for row in rows],
        )
        afters = "; ".join(f"after {row[2]}" for row in rows if row[2] is not None)
        self.run(session, f"INSERT {len(rows)} rows {afters}", INSERT, params)

    def new_row(self, session: Session) -> tuple[str, str | None, list[int] | None]:
        rng = self.rng
        kind, scope = rng.choice(KINDS), rng.choice(SCOPES)
        if rng.random() < 0.3:
            return kind, scope, None
        # Committed parents in rising order across the transaction (see above), and
        # the transaction's own earlier items (no other session can lock those).
        lowest = self.highest_parent.get(session.name, 0)
        # Mostly items that have not ended (so their ends meet the children), now and
        # then any (a parent that already Succeeded, Failed or was Cancelled).
        where: LiteralString = (
            "status IN ('Waiting', 'Queued', 'Running')" if rng.random() < 0.75 else "true"
        )
        committed = [id for id in self.committed_ids(where) if id >= lowest][-12:]
        own = [effect[1] for effect in session.effects if effect[0] == "insert"]
        candidates = committed + own
        if not candidates:
            return kind, scope, None
        parents = sorted(set(rng.sample(candidates, min(len(candidates), rng.randint(1, 3)))))
        named = [p for p in parents if p in committed]
        if named:
            self.highest_parent[session.name] = max(named)
        return kind, scope, parents

    def committed_ids(self, where: LiteralString) -> list[int]:
        rows = self.observer.execute("SELECT id FROM work_items WHERE " + where + " ORDER BY id")
        return [row[0] for row in rows.fetchall()]

    # -- Workers ------------------------------------------------------------------------

    def worker_step(self, session: Session) -> None:
        rng = self.rng
        if session.in_transaction:
            self.end(session, commit=rng.random() < 0.9)
            return
        owned = self.owned[session.name]
        mine = rng.choice(sorted(owned.items())) if owned else None
        calls: list[tuple[str, LiteralString, Any, float]] = [
            ("claim", "SELECT id, attempt FROM work_claim_v3(%s, %s, %s, %s)",
             (session.name, deps.LEASE, rng.randint(1, 4), KINDS), 4),
            ("request cancel", "SELECT work_request_cancel_v2(%s)", (self.some_item(),), 0.3),
            ("settle pass", "SELECT work_settle_noted_v2(100)", (), 1),
            ("retention", "SELECT * FROM work_delete_finished_v2(ARRAY['Succeeded'],"
             " '-infinity', 0, 100)", (), 0.5),
        ]  # fmt: skip
        if mine is not None:
            ids, attempts = [mine[0]], [mine[1]]
            calls += [
                ("finish Succeeded", "SELECT f FROM work_finish_v1(%s, %s, 'Succeeded') AS f",
                 (ids, attempts), 8),
                ("finish Failed", "SELECT f FROM work_finish_v1(%s, %s, 'Failed', 'no', 'E')"
                 " AS f", (ids, attempts), 0.7),
                ("finish Cancelled", "SELECT f FROM work_finish_v1(%s, %s, 'Cancelled',"
                 " 'cancel requested') AS f", (ids, attempts), 0.5),
                ("retry", "SELECT id FROM work_requeue_v1(%s, %s, 'retry', 0, 'E')",
                 (ids, attempts), 1),
                ("release", "SELECT id FROM work_requeue_v1(%s, %s, 'release')",
                 (ids, attempts), 0.5),
            ]  # fmt: skip
        what, query, params, _ = rng.choices(calls, [c[3] for c in calls])[0]
        if what.startswith(("finish", "retry", "release")):
            what += f" {ids[0]}"
        self.run(session, what, query, params)

    def some_item(self, where: LiteralString = "status IN ('Waiting', 'Queued', 'Running')") -> int:
        rows = self.observer.execute("SELECT id FROM work_items WHERE " + where + " ORDER BY id")
        ids = [row[0] for row in rows.fetchall()]
        return self.rng.choice(ids) if ids else 0

    # -- the operator -------------------------------------------------------------------

    def operator_step(self, session: Session) -> None:
        rng = self.rng
        if session.in_transaction:
            self.end(session, commit=rng.random() < 0.85)
            return
        waiting = self.some_item("status = 'Waiting'")
        edits: list[tuple[str, LiteralString, int, float]] = [
            ("cancel", "SELECT work_request_cancel_v2(%s)", self.some_item(), 0.5),
            ("retry", "SELECT * FROM work_retry_v1(ARRAY[%s]::bigint[])",
             self.some_item("status IN ('Failed', 'Cancelled')"), 1.5),
            ("cancel by hand", "UPDATE work_items SET status = 'Cancelled', finished_at = now()"
             " WHERE id = %s AND status IN ('Queued', 'Waiting') RETURNING id", waiting, 0.5),
            ("make Queued by hand", "UPDATE work_items SET status = 'Queued'"
             " WHERE id = %s AND status = 'Waiting' RETURNING id", waiting, 1),
            ("start by hand", "UPDATE work_items SET status = 'Running', attempt = attempt + 1,"
             " worker_id = 'hand', lease_expires_at = now() + interval '1 hour',"
             " started_at = now() WHERE id = %s AND status = 'Waiting' RETURNING id", waiting, 1),
            ("delete a Waiting item", "DELETE FROM work_items WHERE id = %s"
             " AND status = 'Waiting' RETURNING id", waiting, 0.5),
            ("lock for update", "SELECT id FROM work_items WHERE id = %s FOR UPDATE",
             self.some_item("true"), 2),
        ]  # fmt: skip
        what, query, target, _ = rng.choices(edits, [e[3] for e in edits])[0]
        self.run(session, f"{what} {target}", query, (target,))

    # -- checks ---------------------------------------------------------------------------

    def check(self) -> None:
        """After every step, on committed state."""
        o = self.observer
        rows = o.execute("SELECT id, status FROM work_items").fetchall()
        now: dict[int, str] = {id: status for id, status in rows}
        self.ever_succeeded |= {id for id, status in rows if status == "Succeeded"}
        self.flipped |= {id for id in self.ever_waiting if now.get(id) == "Queued"}
        self.ever_waiting |= {id for id, status in rows if status == "Waiting"}
        assert self.broken() == [], f"the rule broken: {self.broken()}"
        for worker, owned in self.owned.items():
            for id, attempt in owned.items():
                row = o.execute(
                    "SELECT status, attempt FROM work_items WHERE id = %s", (id,)
                ).fetchone()
                assert row == ("Running", attempt), f"{worker} holds {id}/{attempt}: {row}"
        assert all(n == 1 for n in running_per_scope(o).values())
        assert wedges(o) == []
        if deps.noted(o):
            self.counts["steps with a noted item"] += 1
        if sum(s.in_transaction for s in self.sessions) >= 2:
            self.counts["overlapping steps"] += 1

    def broken(self) -> list[tuple[Any, ...]]:
        """The rule's violations, but for a parent that Succeeded and was deleted by
        retention once its child no longer needed it (the child Succeeded, or ran,
        failed, and was retried)."""
        return [
            v for v in deps.violations(self.observer)
            if not (v[3] is None and v[2] in self.ever_succeeded)
        ]  # fmt: skip

    def finish(self) -> None:
        """End every transaction (commit, or roll back, by the seed), one settle pass:
        nothing Waiting whose parents have all ended. Then drain: every item ends."""
        self.driver.end_every_transaction(
            self.harvest, lambda session: self.end(session, commit=self.rng.random() < 0.8)
        )
        self.check()
        o = self.observer
        deps.settle_pass(o, 1000)
        assert deps.stuck(o) == [], "Waiting though every parent has ended"
        self.drain()

    def drain(self) -> None:
        o = self.observer
        for _ in range(500):
            o.execute(
                "UPDATE work_items SET lease_expires_at = now() - interval '1s'"
                " WHERE status = 'Running'"
            )
            o.execute("SELECT * FROM work_recover_v1(1000000, 1000)")
            deps.settle_pass(o, 1000)
            claimed = deps.claim(o, KINDS, limit=50, worker="drain")
            if not claimed:
                break
            deps.finish(o, claimed)
            self.ever_succeeded |= {c[0] for c in claimed}
            assert self.broken() == []
        left = o.execute(
            "SELECT id, status, after FROM work_items"
            " WHERE status NOT IN ('Succeeded', 'Failed', 'Cancelled') ORDER BY id"
        ).fetchall()
        assert left == [], f"not ended after the drain: {left}"


def begin(isolation: str) -> Any:
    query: LiteralString = {
        "read committed": "BEGIN ISOLATION LEVEL READ COMMITTED",
        "repeatable read": "BEGIN ISOLATION LEVEL REPEATABLE READ",
    }[isolation]

    def statement(conn: Conn) -> None:
        conn.execute(query)

    return statement


def run_seed(dsn: str, seed: int, steps: int) -> DagRun:
    run = DagRun(dsn, seed)
    try:
        for _ in range(steps):
            run.step()
        run.finish()
    except BaseException as exc:
        tail = "\n".join(run.driver.log[-30:])
        raise AssertionError(f"seed {seed} failed: {exc}\nlast steps:\n{tail}") from exc
    finally:
        run.close()
    return run
