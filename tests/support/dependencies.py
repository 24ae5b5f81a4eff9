"""Checks on dependencies (migrations/0003.dependencies.sql), written apart from the
product's own SQL, and the statements the concurrency tests send for them.

Safety: an item runs only after every parent has Succeeded, so no item is Queued,
Running or Succeeded while a parent it names has not Succeeded (a parent deleted after
its child Succeeded is no longer there to ask), no Waiting item has lost a parent, and
a Waiting item holds no claim, no slot and no place at a line's head. Liveness: once
every transaction has ended and a Worker's settle pass has run, no item is Waiting
whose parents have all ended.
"""

from __future__ import annotations

import concurrent.futures
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, LiteralString, TypeVar

import psycopg

from tests.support.interleave import Driver, Session, Statement

Conn = psycopg.Connection[Any]
T = TypeVar("T")

#: Leases run out only when a test expires them: time plays no part.
LEASE = 3600

VIOLATIONS: LiteralString = """
SELECT c.id, c.status, a.parent, p.status AS parent_status
FROM work_items AS c
CROSS JOIN LATERAL unnest(c.after) AS a (parent)
LEFT JOIN work_items AS p ON p.id = a.parent
WHERE (c.status IN ('Queued', 'Running') AND p.status IS DISTINCT FROM 'Succeeded')
   OR (c.status = 'Succeeded' AND p.id IS NOT NULL AND p.status <> 'Succeeded')
   OR (c.status = 'Waiting' AND p.id IS NULL)
UNION ALL
SELECT id, status, NULL, 'holds a claim, a slot or a head'
FROM work_items
WHERE status = 'Waiting'
  AND (lease_expires_at IS NOT NULL OR worker_id IS NOT NULL OR is_head
       OR scope_slot IS NOT NULL OR kind_slot IS NOT NULL)
ORDER BY 1, 3
"""

STUCK: LiteralString = """
SELECT c.id FROM work_items AS c
WHERE c.status = 'Waiting'
  AND NOT EXISTS (SELECT 1 FROM work_dependencies AS d
                  JOIN work_items AS p ON p.id = d.parent_id
                  WHERE d.child_id = c.id
                    AND p.status NOT IN ('Succeeded', 'Failed', 'Cancelled'))
ORDER BY 1
"""


def violations(pg: Conn) -> list[tuple[Any, ...]]:
    """Items that break the rule (committed state, one snapshot): there must be none."""
    return pg.execute(VIOLATIONS).fetchall()


def stuck(pg: Conn) -> list[int]:
    """Waiting items whose parents have all ended: none once a settle pass has run
    after every transaction ended."""
    return [row[0] for row in pg.execute(STUCK).fetchall()]


def noted(pg: Conn) -> list[int]:
    """The Waiting items a settle left for a Worker's settle pass, each once."""
    rows = pg.execute("SELECT DISTINCT item_id FROM work_unsettled_waiting ORDER BY 1")
    return [row[0] for row in rows.fetchall()]


def settle_pass(pg: Conn, limit: int = 100) -> int:
    """One settle pass, as a Worker runs on NOTIFY and every poll."""
    row = pg.execute("SELECT work_settle_noted_v2(%s)", (limit,)).fetchone()
    assert row is not None
    return int(row[0])


def statuses(pg: Conn, ids: Sequence[int]) -> dict[int, str]:
    rows = pg.execute("SELECT id, status FROM work_items WHERE id = ANY(%s)", (list(ids),))
    return {id: status for id, status in rows.fetchall()}


def status(pg: Conn, id: int) -> str:
    return statuses(pg, [id])[id]


def reason(pg: Conn, id: int) -> str | None:
    row = pg.execute("SELECT reason FROM work_items WHERE id = %s", (id,)).fetchone()
    assert row is not None
    return None if row[0] is None else str(row[0])


def insert(
    conn: Conn,
    kind: str,
    *,
    scope: str | None = None,
    after: Sequence[int] | None = None,
    n: int = 1,
) -> list[int]:
    """N items as plain SQL inserts them (one statement), their ids in order."""
    rows = conn.execute(
        "INSERT INTO work_items (kind, scope, after)"
        " SELECT %s, %s, %s FROM generate_series(1, %s) ORDER BY 1 RETURNING id",
        (kind, scope, None if after is None else list(after), n),
    ).fetchall()
    return sorted(row[0] for row in rows)


def claim(
    conn: Conn, kinds: Sequence[str], limit: int = 100, worker: str = "w"
) -> list[tuple[int, int]]:
    """(id, attempt) of each item a Worker serving `kinds` claims, in one call."""
    rows = conn.execute(
        "SELECT id, attempt FROM work_claim_v3(%s, %s, %s, %s) ORDER BY id",
        (worker, LEASE, limit, list(kinds)),
    ).fetchall()
    return [(id, attempt) for id, attempt in rows]


def finish(conn: Conn, claimed: Sequence[tuple[int, int]], outcome: str = "Succeeded") -> list[int]:
    """Finish claimed attempts as the Worker does (work_finish_v1): the ids written."""
    reason = {"Succeeded": None, "Failed": "gave up", "Cancelled": "cancel requested"}[outcome]
    rows = conn.execute(
        "SELECT f FROM work_finish_v1(%s, %s, %s, %s, %s) AS f ORDER BY 1",
        ([c[0] for c in claimed], [c[1] for c in claimed], outcome, reason,
         "E" if outcome == "Failed" else None),
    ).fetchall()  # fmt: skip
    return [row[0] for row in rows]


def running(pg: Conn, kind: str, n: int = 1, *, scope: str | None = None) -> list[tuple[int, int]]:
    """N items of `kind` enqueued and claimed (committed): (id, attempt) each."""
    insert(pg, kind, scope=scope, n=n)
    got = claim(pg, [kind], limit=n, worker="setup")
    assert len(got) == n, got
    return got


# -- statements for a Driver -----------------------------------------------------------


def in_transaction(query: LiteralString, params: Any = ()) -> Statement:
    """BEGIN (when no transaction is open), then the query: its rows."""

    def statement(conn: Conn) -> list[tuple[Any, ...]]:
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            conn.execute("BEGIN")
        return conn.execute(query, params).fetchall()

    return statement


def just(query: LiteralString) -> Statement:
    def statement(conn: Conn) -> None:
        conn.execute(query)

    return statement


COMMIT = just("COMMIT")


def enqueue_after(parents: Sequence[int], kind: str = "C", scope: str | None = None) -> Statement:
    """A caller's INSERT of one item after `parents`, in its transaction: its id."""
    return in_transaction(
        "INSERT INTO work_items (kind, scope, after) VALUES (%s, %s, %s) RETURNING id",
        (kind, scope, list(parents)),
    )


def finishing(claimed: Sequence[tuple[int, int]], outcome: str = "Succeeded") -> Statement:
    """A Worker's finish of its claims (work_finish_v1), in its transaction."""

    def statement(conn: Conn) -> list[int]:
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            conn.execute("BEGIN")
        return finish(conn, claimed, outcome)

    return statement


class Steps:
    """Named steps on sessions through a Driver: each finished statement's result (or
    error) is kept under its step's name; an error fails the test unless `errors` is
    given to collect it."""

    def __init__(self, observer: Conn, sessions: list[Session]) -> None:
        self.driver = Driver(observer, sessions)
        self.sessions = sessions
        self.results: dict[str, Any] = {}
        self.errors: dict[str, BaseException] = {}
        self._may_fail: set[str] = set()

    def run(
        self, session: Session, name: str, statement: Statement, *, may_fail: bool = False
    ) -> None:
        """Send the step's statement and wait until it finished or blocked."""
        if may_fail:
            self._may_fail.add(name)
        self.driver.run(session, name, statement)
        self.collect()

    def collect(self) -> None:
        for session in self.sessions:
            if session.pending is None or not session.pending.done():
                continue
            name = session.pending_what
            result, error = self.driver.take(session)
            if error is None:
                self.results[name] = result
            elif name in self._may_fail:
                self.errors[name] = error
            else:
                raise AssertionError(f"{session.name}: {name} raised {error!r}") from error

    def play(
        self,
        order: Sequence[tuple[Session, str]],
        statements: Mapping[str, Statement],
        check: Callable[[str], None],
    ) -> None:
        """Run each step's statement in order, and `check(the order, as text)` after
        each; a step whose session is still blocked waits until the first later step
        that lets it go has run."""
        label = ", ".join(name for _, name in order)
        left = list(order)
        while left:
            self.collect()
            ready = [step for step in left if step[0].pending is None]
            assert ready, f"{label}: every session left is blocked"
            session, name = ready[0]
            left.remove(ready[0])
            self.run(session, name, statements[name])
            check(label)
        self.wait()

    def wait(self) -> None:
        """Every pending statement finished (none may stay blocked)."""
        self.driver.settle()
        self.collect()
        blocked = [f"{s.name}: {s.pending_what}" for s in self.sessions if s.pending]
        assert not blocked, f"still blocked at the end: {blocked}"

    def outcome(self, timeout: float = 15.0) -> None:
        """Wait until every pending statement has finished, blocked or not (PostgreSQL
        ends a deadlock after deadlock_timeout, 1 s by default), and collect it."""
        deadline = time.monotonic() + timeout
        for session in self.sessions:
            if session.pending is not None:
                concurrent.futures.wait([session.pending], max(deadline - time.monotonic(), 0))
        self.collect()
        blocked = [f"{s.name}: {s.pending_what}" for s in self.sessions if s.pending]
        assert not blocked, f"still waiting after {timeout}s: {blocked}"

    def blocked(self, session: Session) -> bool:
        return self.driver.blocked(session)


def interleavings(*sequences: Sequence[T]) -> Iterator[list[T]]:
    """Every merge of the sequences that keeps each one's own order."""
    if all(not s for s in sequences):
        yield []
        return
    for i, sequence in enumerate(sequences):
        if sequence:
            rest = [*sequences[:i], sequence[1:], *sequences[i + 1 :]]
            for merged in interleavings(*rest):
                yield [sequence[0], *merged]


def an_interleaving(rng: random.Random, *sequences: Sequence[T]) -> list[T]:
    """One merge of the sequences keeping each one's order, each merge as likely."""
    left = [list(s) for s in sequences]
    merged: list[T] = []
    while any(left):
        which = rng.choices(range(len(left)), [len(s) for s in left])[0]
        merged.append(left[which].pop(0))
    return merged
