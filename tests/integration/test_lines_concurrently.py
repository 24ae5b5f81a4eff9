"""Liveness and safety under concurrency: seeded interleavings of real transactions.

Callers enqueue (single rows, multi-row INSERTs across scopes, COPY) in transactions at
READ COMMITTED, REPEATABLE READ or SERIALIZABLE, held open across steps; an operator
cancels, deletes, reschedules, moves and locks items by hand, and expires leases; two
Workers claim, heartbeat, complete, fail, cancel, retry, release, request cancels,
recover leases and settle noted scopes, each call in a transaction of its own that a
later step commits or rolls back. After every step: never two Running items in one
scope, nothing lost, and no wedged scope. After a final drain, everything due has been
claimed and the product's own repair found nothing.

A failure names its seed; `TRIOWORKER_INTERLEAVE_SEEDS=17` reruns that one (and
`=0-199` runs many, for a soak).
"""

from __future__ import annotations

import os
import random
from typing import Any, Self

import attrs
import psycopg

from tests.support.interleave import Driver, Session
from tests.support.lines import running_per_scope, wedges

KINDS = ["K", "J", "P"]
SCOPES = ["s0", "s1", "s2", None]
ISOLATIONS = ["read committed"] * 3 + ["repeatable read", "serializable"]
STEPS = 300
LEASE = 3600  # leases run out only when the operator expires them: time plays no part


def seeds() -> list[int]:
    spec = os.environ.get("TRIOWORKER_INTERLEAVE_SEEDS", "1-6")
    first, _, last = spec.partition("-")
    return list(range(int(first), int(last or first) + 1))


@attrs.define
class Model:
    """What the committed state must hold, as the driver saw it happen."""

    present: set[int] = attrs.Factory(set)
    owned: dict[str, dict[int, int]] = attrs.Factory(dict)  # worker -> id -> attempt


class Run:
    def __init__(self, dsn: str, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.observer = psycopg.connect(dsn, autocommit=True)
        self.callers = [Session.open(f"caller{i}", dsn) for i in range(3)]
        self.operator = Session.open("operator", dsn)
        self.workers = [Session.open(f"worker{i}", dsn) for i in range(2)]
        self.sessions = [*self.callers, self.operator, *self.workers]
        self.driver = Driver(self.observer, self.sessions)
        self.model = Model(owned={w.name: {} for w in self.workers})
        #: Steps after which two or more sessions had a transaction open.
        self.overlapping_steps = 0
        #: Workers' writes to an item whose scope a caller's open transaction enqueued into.
        self.races = 0

    def close(self) -> None:
        for session in self.sessions:
            session.close()
        self.observer.close()

    def play(self) -> Self:
        """STEPS steps and the drain, then close the sessions; a failure names the seed
        and the last steps taken."""
        try:
            for _ in range(STEPS):
                self.step()
            self.finish()
        except BaseException as exc:
            tail = "\n".join(self.driver.log[-25:])
            raise AssertionError(f"seed {self.seed} failed: {exc}\nlast steps:\n{tail}") from exc
        finally:
            self.close()
        return self

    # -- the steps -----------------------------------------------------------------

    def step(self) -> None:
        self.harvest()
        free = [s for s in self.sessions if s.pending is None]
        if not free:
            raise AssertionError("every session is blocked: a deadlock among them")
        # Workers and the operator act more often than each caller, so that their
        # transactions meet the callers' open ones.
        weights = [3 if s in self.workers else 2 if s is self.operator else 1 for s in free]
        self.session_step(self.rng.choices(free, weights)[0])
        self.harvest()
        if sum(s.in_transaction for s in self.sessions) >= 2:
            self.overlapping_steps += 1
        self.check()

    def session_step(self, session: Session) -> None:
        """One step of SESSION's part; runs that add sessions add their parts here."""
        if session in self.callers:
            self.caller_step(session)
        elif session is self.operator:
            self.operator_step(session)
        else:
            self.worker_step(session)

    def harvest(self) -> None:
        """Collect every statement that has finished; an error must be an allowed one."""
        for session in self.sessions:
            if session.pending is None or not session.pending.done():
                continue
            what = session.pending_what
            result, error = self.driver.take(session)
            if error is None:
                self.record(session, what, result)
                continue
            if (
                isinstance(error, psycopg.errors.SerializationFailure)
                and session in self.callers
                and "dedup" in what
            ):
                # A strict caller that met its own dedup key committed elsewhere: the
                # caller asked for that key's uniqueness; its transaction is over.
                self.end(session, commit=False, run=False)
                continue
            raise AssertionError(f"{session.name}: {what} raised {error!r}")

    def record(self, session: Session, what: str, result: Any) -> None:
        if what == "COMMIT":
            self.apply(session)
        elif what == "ROLLBACK":
            session.effects.clear()
        elif result is not None:
            session.effects.extend(result)

    def apply(self, session: Session) -> None:
        for effect, *args in session.effects:
            if effect == "insert":
                self.model.present.add(args[0])
            elif effect == "delete":
                self.model.present.discard(args[0])
            elif effect == "claim":
                for owned in self.model.owned.values():
                    owned.pop(args[0], None)
                self.model.owned[session.name][args[0]] = args[1]
            elif effect in ("done", "lost"):
                for owned in self.model.owned.values():
                    owned.pop(args[0], None)
        session.effects.clear()

    def begin(self, session: Session, isolation: str = "read committed") -> None:
        session.in_transaction = True
        self.driver.run(session, f"BEGIN {isolation}", just(f"BEGIN ISOLATION LEVEL {isolation}"))

    def end(self, session: Session, *, commit: bool, run: bool = True) -> None:
        session.in_transaction = False
        if not run:
            session.conn.execute("ROLLBACK")
            session.effects.clear()
            return
        verb = "COMMIT" if commit else "ROLLBACK"
        self.driver.run(session, verb, just(verb))

    # -- callers ---------------------------------------------------------------------

    def caller_step(self, session: Session) -> None:
        rng = self.rng
        if not session.in_transaction:
            self.begin(session, rng.choice(ISOLATIONS))
            return
        choice = rng.random()
        if choice < 0.35:
            rows = [self.new_row(session)]
            self.insert(session, rows)
        elif choice < 0.55:
            rows = [self.new_row(session, dedup=False) for _ in range(rng.randint(2, 5))]
            self.insert(session, rows)
        elif choice < 0.65:
            self.copy(session, [self.new_row(session, dedup=False) for _ in range(3)])
        else:
            self.end(session, commit=choice < 0.9)

    def new_row(self, session: Session, *, dedup: bool = True) -> tuple[Any, ...]:
        rng = self.rng
        key = None
        if dedup and rng.random() < 0.3:  # each caller has keys of its own
            key = f"{session.name}-{rng.randint(0, 3)}"
        return (rng.choice(KINDS), rng.choice(SCOPES), rng.choice([0, 0, 5]), key)

    def insert(self, session: Session, rows: list[tuple[Any, ...]]) -> None:
        values = ", ".join(["(%s, %s, %s, %s)"] * len(rows))
        params = [v for row in rows for v in row]
        query = (
            "INSERT INTO work_items (kind, scope, priority, dedup_key) VALUES " + values
            + " ON CONFLICT (dedup_key) WHERE status = 'Queued' AND dedup_key IS NOT NULL"
            " DO NOTHING RETURNING id"
        )  # fmt: skip

        def statement(conn: psycopg.Connection[Any]) -> list[Any]:
            rows = conn.execute(query + ", scope", params).fetchall()  # type: ignore[arg-type]
            return [("insert", r[0], r[1]) for r in rows]

        dedup = " dedup" if any(r[3] for r in rows) else ""
        self.driver.run(session, f"INSERT {len(rows)} rows{dedup}", statement)

    def copy(self, session: Session, rows: list[tuple[Any, ...]]) -> None:
        """COPY, with ids taken from the sequence first (reading the table back would
        add the test's own reads to a serializable caller's transaction)."""

        def statement(conn: psycopg.Connection[Any]) -> list[Any]:
            ids = [
                r[0]
                for r in conn.execute(
                    "SELECT nextval(pg_get_serial_sequence('work_items', 'id'))"
                    " FROM generate_series(1, %s)",
                    (len(rows),),
                ).fetchall()
            ]
            with conn.cursor() as cur:
                copy_sql = "COPY work_items (id, kind, scope, priority) FROM STDIN"
                with cur.copy(copy_sql) as c:
                    for id, (kind, scope, priority, _) in zip(ids, rows, strict=True):
                        c.write_row((id, kind, scope, priority))
            return [("insert", id, row[1]) for id, row in zip(ids, rows, strict=True)]

        self.driver.run(session, f"COPY {len(rows)} rows", statement)

    # -- the operator ------------------------------------------------------------------

    def operator_step(self, session: Session) -> None:
        rng = self.rng
        if not session.in_transaction:
            self.begin(session)
            return
        target = self.interesting_item()
        choice = rng.random()
        edits = [
            ("cancel by hand", "UPDATE work_items SET status = 'Cancelled', finished_at = now()"
             " WHERE id = %s AND status = 'Queued' RETURNING NULL"),
            ("delete a queued item", "DELETE FROM work_items WHERE id = %s AND status = 'Queued'"
             " RETURNING id"),
            ("delete a finished item", "DELETE FROM work_items WHERE id = %s"
             " AND status IN ('Succeeded', 'Failed', 'Cancelled') RETURNING id"),
            ("reschedule later", "UPDATE work_items SET run_after = now() + interval '1 hour'"
             " WHERE id = %s AND status = 'Queued' RETURNING NULL"),
            ("reschedule earlier", "UPDATE work_items SET run_after = now() - interval '1 hour'"
             " WHERE id = %s AND status = 'Queued' RETURNING NULL"),
            ("move to another scope", f"UPDATE work_items SET scope = '{rng.choice(SCOPES[:-1])}'"
             " WHERE id = %s AND status = 'Queued' RETURNING NULL"),
            ("lock for update", "SELECT NULL FROM work_items WHERE id = %s FOR UPDATE"),
            ("expire a lease", "UPDATE work_items SET lease_expires_at = now() - interval '1s'"
             " WHERE id = %s AND status = 'Running' RETURNING NULL"),
        ]  # fmt: skip
        if choice < 0.65:
            what, query = rng.choice(edits)

            def statement(conn: psycopg.Connection[Any]) -> list[Any]:
                rows = conn.execute(query, (target,)).fetchall()  # type: ignore[call-overload]
                return [("delete", r[0]) for r in rows if r[0] is not None]

            self.driver.run(session, f"{what} {target}", statement)
        else:
            self.end(session, commit=choice < 0.92)

    def interesting_item(self) -> int:
        """An item where collisions happen: a Running item, the next one in a line, a
        head, or any; picked from committed state, so the pick depends on the seed."""
        where = self.rng.choice([
            "status = 'Running'", "status = 'Running'", "status = 'Queued' AND is_head",
            "status = 'Queued' AND NOT is_head", "true",
        ])  # fmt: skip
        rows = self.observer.execute(f"SELECT id FROM work_items WHERE {where} ORDER BY id")
        ids = [r[0] for r in rows.fetchall()]  # type: ignore[call-overload]
        return self.rng.choice(ids) if ids else 0

    # -- the Workers -------------------------------------------------------------------

    def worker_step(self, session: Session) -> None:
        rng = self.rng
        if session.in_transaction:
            self.end(session, commit=rng.random() < 0.9)
            return
        owned = self.model.owned[session.name]
        mine = rng.choice(sorted(owned.items())) if owned else None
        choice = rng.random()
        calls: list[tuple[str, str, tuple[Any, ...]]] = [
            ("claim", "SELECT id, attempt, kind, started_at FROM work_claim_v3(%s, %s, %s, %s)",
             (session.name, LEASE, rng.randint(1, 3), KINDS if session.name == "worker0"
              else rng.sample(KINDS, 2))),
            ("recover", "SELECT id, NULL FROM work_recover_v1(2, 100)", ()),
            ("settle noted", "SELECT NULL, NULL, work_settle_noted_v1(100)", ()),
            ("request cancel", "SELECT NULL, NULL, work_request_cancel_v1(%s)",
             (self.interesting_item(),)),
        ]  # fmt: skip
        if mine is not None:
            ids, attempts = [mine[0]], [mine[1]]
            calls += [
                ("complete", "SELECT f, NULL FROM work_finish_v1(%s, %s, 'Succeeded') AS f",
                 (ids, attempts)),
                ("fail",
                 "SELECT f, NULL FROM work_finish_v1(%s, %s, 'Failed', 'gave up', 'E') AS f",
                 (ids, attempts)),
                ("cancel (fenced)",
                 "SELECT f, NULL FROM work_finish_v1(%s, %s, 'Cancelled', 'cancel requested') AS f",
                 (ids, attempts)),
                ("retry", "SELECT id, NULL FROM work_requeue_v1(%s, %s, 'retry', 0, 'E')",
                 (ids, attempts)),
                ("release", "SELECT id, NULL FROM work_requeue_v1(%s, %s, 'release')",
                 (ids, attempts)),
                ("heartbeat", "UPDATE work_items SET heartbeat_at = now(),"
                 " lease_expires_at = now() + interval '1 hour'"
                 " WHERE id = %s AND attempt = %s AND status = 'Running' RETURNING NULL, NULL",
                 (mine[0], mine[1])),
            ]  # fmt: skip
        weights = [4, 1, 1, 2] + ([4, 1, 1, 2, 1, 2] if mine is not None else [])
        what, query, params = rng.choices(calls, weights)[0]
        del choice
        if mine is not None and what in ("complete", "fail", "cancel (fenced)", "retry", "release"):
            row = self.observer.execute("SELECT scope FROM work_items WHERE id = %s", (mine[0],))
            scope = (row.fetchone() or (None,))[0]
            if scope is not None and any(
                effect[0] == "insert" and effect[2] == scope
                for caller in self.callers
                for effect in caller.effects
            ):
                self.races += 1  # this leave meets an open enqueue into its scope

        def statement(conn: psycopg.Connection[Any]) -> list[Any]:
            conn.execute("BEGIN")
            rows = conn.execute(query, params).fetchall()  # type: ignore[call-overload]
            if what == "claim":  # with each item's kind and start (test_limits_concurrently)
                return [("claim", *r) for r in rows]
            if what in ("complete", "fail", "cancel (fenced)", "retry", "release"):
                return [("done", r[0]) for r in rows]
            if what == "recover":  # items another Worker held are that Worker's no more
                return [("lost", r[0]) for r in rows]
            return []

        session.in_transaction = True
        self.driver.run(session, what, statement)

    # -- checks ---------------------------------------------------------------------

    def check(self) -> None:
        """After every step, on committed state: the rule, nothing lost, no wedge."""
        assert all(n == 1 for n in running_per_scope(self.observer).values())
        ids = {r[0] for r in self.observer.execute("SELECT id FROM work_items").fetchall()}
        lost, unexpected = self.model.present - ids, ids - self.model.present
        assert not lost and not unexpected, f"lost {sorted(lost)}, unexpected {sorted(unexpected)}"
        assert wedges(self.observer) == []

    def finish(self) -> None:
        """End every open transaction (commit or roll back, by the seed), then drain."""
        self.driver.end_every_transaction(
            self.harvest, lambda session: self.end(session, commit=self.rng.random() < 0.7)
        )
        self.check()
        assert self.observer.execute("SELECT * FROM work_repair_v2(1000)").fetchall() == []
        self.drain()

    def drain(self) -> None:
        """Every Worker gone: leases run out and are recovered, and a Worker serving
        every kind claims and completes until nothing is claimable. Then nothing due
        may be left Queued."""
        o = self.observer
        for _ in range(200):
            o.execute("UPDATE work_items SET lease_expires_at = now() - interval '1s'"
                      " WHERE status = 'Running'")  # fmt: skip
            o.execute("SELECT * FROM work_recover_v1(1000000, 1000)")
            o.execute("SELECT work_settle_noted_v1(1000)")
            claimed = o.execute(
                "SELECT id, attempt FROM work_claim_v3('drain', 60, 50, %s)", (KINDS,)
            ).fetchall()
            if not claimed:
                break
            o.execute(
                "SELECT work_finish_v1(%s, %s, 'Succeeded') AS f",
                ([r[0] for r in claimed], [r[1] for r in claimed]),
            )
        stuck = o.execute(
            "SELECT id, kind, scope, priority, is_head FROM work_items"
            " WHERE status IN ('Queued', 'Running') AND run_after <= now() ORDER BY id"
        ).fetchall()
        assert stuck == [], f"due work never claimed after the drain: {stuck}"


def just(query: str) -> Any:
    def statement(conn: psycopg.Connection[Any]) -> None:
        conn.execute(query)  # type: ignore[arg-type]

    return statement


def test_seeded_interleavings_keep_every_scope_live(databases: Any) -> None:
    """Seeded interleavings of every operation: the rule and nothing lost after every
    step, no wedged scope ever, and after a final drain everything due was claimed."""
    races = blocks = 0
    for seed in seeds():
        with databases.database() as dsn:
            run = Run(dsn, seed).play()
        assert run.overlapping_steps > STEPS // 2, f"seed {seed}: transactions seldom overlapped"
        races += run.races
        blocks += run.driver.blocks
    # The runs were concurrent: Workers' writes met callers' open enqueues into the
    # same scope, and statements waited on other sessions' locks.
    assert races > 0 and blocks > 0
