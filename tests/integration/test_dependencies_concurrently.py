"""Dependencies under concurrency (issue 34; migrations/0003.dependencies.sql): real
transactions held open across steps on several connections, interleaved in every
order or from seeds, checking safety after every step and liveness at the end.

Safety (tests/support/dependencies.py): no item Queued, Running or Succeeded while a
parent it names has not Succeeded, and no Waiting item holding a claim, a slot or a
head. Liveness: once every transaction has ended and one settle pass has run, nothing
is Waiting whose parents have all ended, and what became Queued is claimed.

The last section holds what these tests found: each of its tests fails until the SQL
it names is fixed.
"""

from __future__ import annotations

import collections
import functools
import os
import random
from collections.abc import Iterator
from typing import Any, LiteralString

import psycopg
import pytest

from tests.integration import test_lines_concurrently as lines
from tests.support import dependencies as deps
from tests.support.database import Databases
from tests.support.dependencies import (
    COMMIT,
    Steps,
    an_interleaving,
    enqueue_after,
    finishing,
    in_transaction,
    interleavings,
)
from tests.support.dependency_run import run_seed
from tests.support.interleave import Session, Statement
from tests.support.lines import wedges

Conn = psycopg.Connection[Any]


@pytest.fixture
def sessions(dsn: str) -> Iterator[list[Session]]:
    """Four sessions on the test database, each driven from a thread of its own."""
    opened = [Session.open(name, dsn) for name in ("a", "b", "c", "d")]
    try:
        yield opened
    finally:
        for session in opened:
            session.close()


def some(orders: list[Any]) -> list[Any]:
    """The orders to run: all when there are few, else a sample drawn from a seed
    (the first of $TRIOWORKER_INTERLEAVE_SEEDS, as for the lines tests) of
    $TRIOWORKER_DEPENDENCY_ORDERS of them (24; `all` runs every one). A failure names
    its order's steps."""
    wanted = os.environ.get("TRIOWORKER_DEPENDENCY_ORDERS", "24")
    if wanted == "all" or len(orders) <= int(wanted):
        return orders
    return random.Random(lines.seeds()[0]).sample(orders, int(wanted))


def keeps_the_rule(pg: Conn, order: str) -> None:
    assert deps.violations(pg) == [], order
    assert wedges(pg) == [], order


# -- 1. parents finishing while a child naming them is enqueued -------------------------


@pytest.mark.parametrize("n_parents", [1, 2])
def test_a_child_enqueued_as_its_parents_finish_is_queued_once_all_have_in_every_order(
    pg: Conn, sessions: list[Session], n_parents: int
) -> None:
    """A caller inserts a child after N Running parents and commits; each parent's
    Worker finishes it Succeeded in a transaction of its own and commits: every order
    of those steps (with two parents, 24 of the 90 drawn from a seed). After every step
    the child is not Queued while a parent has not Succeeded; at the end it is Queued,
    or Waiting and noted (its commit met a parent held by that parent's finish, or, with
    two parents, each finish met the child held by the other), and Queued after one
    settle pass; a Worker's claim takes it."""
    caller, *workers = sessions[: n_parents + 1]
    child_steps = [(caller, "insert"), (caller, "commit child")]
    parent_steps = [[(w, f"finish {i}"), (w, f"commit {i}")] for i, w in enumerate(workers)]
    orders = list(interleavings(child_steps, *parent_steps))
    assert len(orders) == {1: 6, 2: 90}[n_parents]
    took_note = blocked = 0
    for order in some(orders):
        parents = deps.running(pg, "P", n_parents)
        statements: dict[str, Statement] = {
            "insert": enqueue_after([p[0] for p in parents], scope="c"),
            "commit child": COMMIT,
        }
        for i, parent in enumerate(parents):
            statements |= {f"finish {i}": finishing([parent]), f"commit {i}": COMMIT}
        steps = Steps(pg, sessions)
        steps.play(order, statements, functools.partial(keeps_the_rule, pg))
        blocked += steps.driver.blocks
        child = steps.results["insert"][0][0]
        label = [name for _, name in order]
        if deps.status(pg, child) == "Waiting":
            took_note += 1
            assert child in deps.noted(pg), label
            deps.settle_pass(pg)
        assert deps.status(pg, child) == "Queued", label
        assert deps.claim(pg, ["C"]) == [(child, 1)], label
        deps.finish(pg, [(child, 1)])
    assert deps.violations(pg) == [] and deps.stuck(pg) == []
    # No step waited on another's lock (the enqueue holds no parent, its commit and the
    # finishes take rows SKIP LOCKED), and the orders raced: some commits or finishes
    # met a row the other held and took the noted path.
    assert blocked == 0
    assert took_note > 0


# -- 2. the last two parents of one child finishing at once: the noted path -------------


@pytest.mark.parametrize("first_commit", ["holder", "noter"])
def test_the_last_two_parents_finishing_at_once_leave_the_child_to_one_settle_pass(
    dsn: str, pg: Conn, sessions: list[Session], first_commit: str
) -> None:
    """Two children wait on parents P1 and P2, both Running. P1's Worker finishes it in
    a transaction held open (its trigger holds the children), then P2's Worker finishes
    P2 in another: its trigger finds them held, notes them in work_unsettled_waiting
    and announces them. Both commit (either first): the children are Waiting, but
    noted; one settle pass makes them Queued, and a claim takes them. A pass run while
    the holder is still open notes them again instead of losing them."""
    holder, noter = sessions[:2]
    (p1, a1), (p2, a2) = deps.running(pg, "P", 2)
    children = deps.insert(pg, "C", after=[p1, p2], n=2)
    waiting = dict.fromkeys(children, "Waiting")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN trioworker_settle")
        steps = Steps(pg, sessions)
        steps.run(holder, "finish P1", finishing([(p1, a1)]))
        steps.run(noter, "finish P2", finishing([(p2, a2)]))
        assert not steps.blocked(noter)  # the trigger noted the children, never waited
        first, second = (holder, noter) if first_commit == "holder" else (noter, holder)
        steps.run(first, "commit first", COMMIT)
        assert deps.statuses(pg, children) == waiting
        if first is noter:
            assert deps.noted(pg) == children
            deps.settle_pass(pg)  # P1's transaction still holds them: noted again
            assert deps.statuses(pg, children) == waiting
            assert deps.noted(pg) == children
        steps.run(second, "commit second", COMMIT)
        steps.wait()
        assert deps.statuses(pg, children) == waiting
        assert deps.noted(pg) == children
        announced = [n.channel for n in listener.notifies(timeout=1, stop_after=1)]
        assert announced == ["trioworker_settle"]
    assert deps.violations(pg) == []
    deps.settle_pass(pg)
    assert deps.statuses(pg, children) == dict.fromkeys(children, "Queued")
    assert deps.noted(pg) == [] and deps.stuck(pg) == []
    assert deps.claim(pg, ["C"]) == [(c, 1) for c in children]


# -- 3. a parent cancelled or failed while its children are enqueued and claimed -------

ENDINGS: dict[str, LiteralString] = {
    # The statement that ends parent P in the ender's transaction, by how P is made.
    "cancel Queued": "SELECT work_request_cancel_v2(%(id)s)",
    "cancel Waiting": "SELECT work_request_cancel_v2(%(id)s)",
    "finish Failed": (
        "SELECT work_finish_v1(ARRAY[%(id)s], ARRAY[%(attempt)s], 'Failed', 'no', 'E')"
    ),
    "finish Cancelled": (
        "SELECT work_request_cancel_v2(%(id)s),"
        " work_finish_v1(ARRAY[%(id)s], ARRAY[%(attempt)s], 'Cancelled', 'cancel requested')"
    ),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_parent_that_ends_badly_cancels_every_descendant_none_of_which_runs(
    pg: Conn, sessions: list[Session], ending: str
) -> None:
    """Parent P ends Cancelled (a cancel of it Queued, or Waiting on a Running item of
    its own) or Failed or Cancelled by its Worker, in a transaction held open, while a
    caller enqueues a child of P and of a Succeeded item, a grandchild and a great-
    grandchild in another, in every order of those steps; a child and grandchild of P
    enqueued before wait already. A Worker claims every kind after every step and never
    gets one of them. At the end each descendant is Cancelled with a reason naming its
    own parent, and none ran."""
    caller, ender = sessions[:2]
    done = deps.running(pg, "S")
    deps.finish(pg, done)
    orders = list(interleavings(
        [(caller, "insert"), (caller, "commit caller")],
        [(ender, "end P"), (ender, "commit ender")],
    ))  # fmt: skip
    assert len(orders) == 6
    verb = "failed" if ending == "finish Failed" else "was cancelled"
    for order in orders:
        if ending == "cancel Queued":
            parent, attempt = deps.insert(pg, "P")[0], 0
        elif ending == "cancel Waiting":
            (grandparent, _), = deps.running(pg, "G")  # fmt: skip
            parent, attempt = deps.insert(pg, "P", after=[grandparent])[0], 0
        else:
            (parent, attempt), = deps.running(pg, "P")  # fmt: skip
        early = deps.insert(pg, "C", after=[parent])[0]
        early_grandchild = deps.insert(pg, "D", after=[early])[0]
        statements: dict[str, Statement] = {
            "insert": functools.partial(enqueue_three_generations, [done[0][0], parent]),
            "end P": in_transaction(ENDINGS[ending], {"id": parent, "attempt": attempt}),
            "commit caller": COMMIT,
            "commit ender": COMMIT,
        }
        steps = Steps(pg, sessions)
        steps.play(order, statements, functools.partial(nothing_claimed, pg))
        child, grandchild, great = steps.results["insert"]
        if deps.stuck(pg):  # (a descendant another transaction held: noted)
            deps.settle_pass(pg)
        expected = {
            early: f"parent {parent} {verb}",
            early_grandchild: f"parent {early} was cancelled",
            child: f"parent {parent} {verb}",
            grandchild: f"parent {child} was cancelled",
            great: f"parent {grandchild} was cancelled",
        }
        got = pg.execute(
            "SELECT id, status, reason, attempt, started_at FROM work_items"
            " WHERE id = ANY(%s) ORDER BY id",
            (list(expected),),
        ).fetchall()
        assert got == [(id, "Cancelled", expected[id], 0, None) for id in sorted(expected)], [
            name for _, name in order
        ]
    assert deps.stuck(pg) == [] and deps.violations(pg) == []


def enqueue_three_generations(parents: list[int], conn: Conn) -> list[int]:
    """In a transaction of its own: a child of `parents`, its child and grandchild."""
    conn.execute("BEGIN")
    child = deps.insert(conn, "C", after=parents)[0]
    grandchild = deps.insert(conn, "D", after=[child])[0]
    return [child, grandchild, deps.insert(conn, "E", after=[grandchild])[0]]


def nothing_claimed(pg: Conn, order: str) -> None:
    keeps_the_rule(pg, order)
    claimed = deps.claim(pg, ["C", "D", "E"])
    assert claimed == [], f"{order}: claimed {claimed}"


# -- 4. fan-out and fan-in: 200 children of one parent, one item after 200 --------------

FAN = 200
BATCH = 25


def test_two_hundred_children_and_a_fan_in_after_them_under_concurrent_batches(
    pg: Conn, sessions: list[Session]
) -> None:
    """Fan-out: two callers each enqueue 100 children of one Running parent, in batches
    of 25 within a transaction each, while its Worker finishes it in a third, in an
    order drawn from a seed: all 200 are Queued once all three have committed and one
    settle pass ran (a caller's commit that met the parent held by its finish left its
    children noted for that pass, waiting on nothing). Fan-in:
    an item after all 200, whose children two Workers claim and finish in batches of
    25, each finish in a transaction held open while the other's runs (neither waits
    for the other): it is Waiting while any child has not Succeeded; after the last
    batch it is Waiting and noted (each of the last two finishes saw the other's batch
    unfinished), and one settle pass makes it Queued."""
    a, b, w0, w1 = sessions
    rng = random.Random(lines.seeds()[0])
    parent = deps.running(pg, "P")
    caller_steps = [
        [(s, f"{s.name} insert {i}") for i in range(FAN // 2 // BATCH)] + [(s, f"{s.name} commit")]
        for s in (a, b)
    ]
    order = an_interleaving(rng, *caller_steps, [(w0, "finish P"), (w0, "commit P")])
    statements: dict[str, Statement] = {"finish P": finishing(parent)}
    for _, name in order:
        if "insert" in name:
            statements[name] = functools.partial(enqueue_batch, parent[0][0])
        elif "commit" in name:
            statements[name] = COMMIT
    steps = Steps(pg, sessions)
    steps.play(order, statements, functools.partial(keeps_the_rule, pg))
    children = sorted(id for name, ids in steps.results.items() if "insert" in name for id in ids)
    assert len(children) == FAN
    waiting = [id for id, status in deps.statuses(pg, children).items() if status == "Waiting"]
    assert set(waiting) <= set(deps.noted(pg)), [n for _, n in order]
    deps.settle_pass(pg)
    assert set(deps.statuses(pg, children).values()) == {"Queued"}, [n for _, n in order]

    blocked_before = steps.driver.blocks
    fan_in = deps.insert(pg, "F", after=children)[0]
    assert deps.status(pg, fan_in) == "Waiting"
    unfinished = set(children)
    noted_rounds = 0
    while unfinished:
        opened = []
        for worker in (w0, w1):
            batch = deps.claim(pg, ["C"], limit=BATCH)
            steps.run(worker, f"{worker.name} finish {batch[0][0]}", finishing(batch))
            opened.append((worker, batch))
        assert steps.driver.blocks == blocked_before
        rng.shuffle(opened)
        for worker, batch in opened:
            steps.run(worker, f"{worker.name} commit {batch[0][0]}", COMMIT)
            steps.wait()
            unfinished -= {c[0] for c in batch}
            keeps_the_rule(pg, "fan-in")
            if unfinished:
                assert deps.status(pg, fan_in) == "Waiting"
        # The second finish met the fan-in held by the first's: it noted it.
        noted_rounds += fan_in in deps.noted(pg)
    assert noted_rounds == FAN // (2 * BATCH)
    assert deps.status(pg, fan_in) == "Waiting" and fan_in in deps.noted(pg)
    deps.settle_pass(pg)
    assert deps.status(pg, fan_in) == "Queued"
    assert deps.claim(pg, ["F"]) == [(fan_in, 1)]
    assert deps.stuck(pg) == [] and deps.noted(pg) == []


def enqueue_batch(parent: int, conn: Conn) -> list[int]:
    """BATCH children of `parent` in one statement, in the caller's transaction."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        conn.execute("BEGIN")
    return deps.insert(conn, "C", after=[parent], n=BATCH)


# -- 5. parents in other scopes and kinds: the child takes its place in its own line ----


def test_a_child_of_parents_in_other_scopes_takes_its_scopes_line_and_is_claimed(
    pg: Conn, sessions: list[Session]
) -> None:
    """Parents P1 (kind K, scope a) and P2 (kind J, scope b) Running; their children:
    C1 (M, scope x) behind Q in x's line while R runs in x, C2 (N, scope a, where P1
    runs and A waits), C3 (M, scope y, whose limit is 2, with one Running). P1, P2 and
    R are finished and a caller enqueues Q2 behind C1, each in a transaction of its own,
    in orders drawn from seeds; after every step the rule and every scope's limit hold
    and no scope is wedged. Then, after a settle pass, C2 and C3 are heads, and claims
    take Q, A and C3, then C1 and C2, then Q2: each line in order, never more Running
    in a scope than its limit."""
    w0, w1, w2, caller = sessions
    rng = random.Random(lines.seeds()[0])
    for case in range(10):
        a, x, y = f"a{case}", f"x{case}", f"y{case}"
        pg.execute("SELECT work_set_limit_v1(NULL, %s, 2)", (y,))
        p1 = deps.running(pg, "K", scope=a)
        p2 = deps.running(pg, "J", scope=f"b{case}")
        r = deps.running(pg, "M", scope=x)
        deps.running(pg, "M", scope=y)
        q = deps.insert(pg, "M", scope=x)[0]
        waiting_a = deps.insert(pg, "K", scope=a)[0]
        c1 = deps.insert(pg, "M", scope=x, after=[p1[0][0], p2[0][0]])[0]
        c2 = deps.insert(pg, "N", scope=a, after=[p1[0][0], p2[0][0]])[0]
        c3 = deps.insert(pg, "M", scope=y, after=[p2[0][0], p1[0][0]])[0]
        order = an_interleaving(
            rng,
            [(w0, "finish P1"), (w0, "commit P1")],
            [(w1, "finish P2"), (w1, "commit P2")],
            [(w2, "finish R"), (w2, "commit R")],
            [(caller, "insert Q2"), (caller, "commit Q2")],
        )
        statements = {
            "finish P1": finishing(p1),
            "finish P2": finishing(p2),
            "finish R": finishing(r),
            "insert Q2": in_transaction(
                "INSERT INTO work_items (kind, scope) VALUES ('M', %s) RETURNING id", (x,)
            ),
        } | {name: COMMIT for name in ("commit P1", "commit P2", "commit R", "commit Q2")}
        steps = Steps(pg, sessions)
        steps.play(order, statements, functools.partial(within_limits, pg))
        q2 = steps.results["insert Q2"][0][0]
        deps.settle_pass(pg)
        label = [name for _, name in order]
        assert deps.statuses(pg, [c1, c2, c3]) == dict.fromkeys([c1, c2, c3], "Queued"), label
        heads = pg.execute(
            "SELECT id FROM work_items WHERE is_head AND id = ANY(%s) ORDER BY id",
            ([q, waiting_a, c1, c2, c3, q2],),
        ).fetchall()
        # Each line's first is a head; C1 and Q2 may be heads beside Q (a flip or an
        # enqueue that met a settle of x in progress makes itself one: harmless, as
        # the claims below show).
        assert {q, waiting_a, c2, c3} <= {h[0] for h in heads}, label
        rounds = []
        for _ in range(4):
            claimed = deps.claim(pg, ["K", "M", "N"], limit=10)
            within_limits(pg, "the claims")
            rounds.append(sorted(c[0] for c in claimed))
            deps.finish(pg, claimed)
        assert rounds == [sorted([q, waiting_a, c3]), [c1, c2], [q2], []], label


def within_limits(pg: Conn, order: str) -> None:
    """The rule, no wedge, and no scope with more Running than its running limit."""
    keeps_the_rule(pg, order)
    over = pg.execute(
        "SELECT r.scope, r.n FROM (SELECT w.scope, count(*) AS n FROM work_items AS w"
        " WHERE w.status = 'Running' AND w.scope IS NOT NULL GROUP BY w.scope) AS r"
        " WHERE r.n > COALESCE((SELECT l.running FROM work_limits AS l"
        " WHERE l.scope = r.scope), 1)"
    ).fetchall()
    assert over == [], order


# -- 6. the seeded interleavings, with dependencies ----------------------------------------

DAG_STEPS = 170


def test_seeded_interleavings_of_dags_keep_the_rule_and_leave_nothing_waiting(
    databases: Databases,
) -> None:
    """Seeded interleavings of random DAGs enqueued in open transactions, claims,
    finishes of every outcome, retries, releases, cancels, settle passes, retention and
    an operator's edits (tests/support/dependency_run.py): the rule after every step;
    once every transaction ended and a settle pass ran, nothing Waiting whose parents
    all ended; after the drain, every item ended. The runs were concurrent: statements
    waited on others' locks, Waiting items became Queued, and items were left noted."""
    totals: collections.Counter[str] = collections.Counter()
    for seed in lines.seeds():
        with databases.database() as dsn:
            run = run_seed(dsn, seed, DAG_STEPS)
        assert run.counts["overlapping steps"] > DAG_STEPS // 2, f"seed {seed}: seldom overlapped"
        totals.update(run.counts)
        totals["blocks"] += run.driver.blocks
        totals["flipped"] += len(run.flipped)
    assert totals["blocks"] > 0 and totals["flipped"] > 0, totals
    assert totals["steps with a noted item"] > 0, totals


# -- Found while writing these (each failed on the first design of 0003) ---------------


def test_children_of_shared_parents_enqueued_in_two_transactions_never_deadlock(
    pg: Conn, sessions: list[Session]
) -> None:
    """A caller enqueues children of P1 and of P2, in that order, another children of
    P2 and of P1, each in one transaction (an `enqueue_many` each, or two `enqueue`
    calls), while P1's handler holds its fenced transaction. Both commits must succeed.

    The first design locked each child's parents in id order at its commit, waiting,
    one child after another: the first caller's commit waited for P1 with nothing held;
    the second's locked P2 for its first child and waited for P1; once the handler
    committed, the first got P1 and waited for P2, and PostgreSQL ended one commit with
    a deadlock (40P01). A commit now waits for no parent: a child whose parent another
    transaction holds is noted, and the settle pass adopts it."""
    first, second, handler = sessions[:3]
    (p1, a1), (p2, a2) = deps.running(pg, "P", 2)
    steps = Steps(pg, sessions)
    steps.run(handler, "fence P1", in_transaction("SELECT work_fence_v1(%s, %s)", (p1, a1)))
    for session, parents in ((first, [p1, p2]), (second, [p2, p1])):
        steps.run(session, f"{session.name} insert", in_transaction(
            "INSERT INTO work_items (kind, after)"
            " VALUES ('C', ARRAY[%s]::bigint[]), ('C', ARRAY[%s]::bigint[]) RETURNING id",
            parents))  # fmt: skip
    steps.run(first, "first commit", COMMIT, may_fail=True)
    steps.run(second, "second commit", COMMIT, may_fail=True)
    assert not steps.blocked(first) and not steps.blocked(second)
    steps.run(handler, "handler commit", COMMIT)
    steps.outcome()
    assert {name: repr(error) for name, error in steps.errors.items()} == {}
    children = [row[0] for name in ("a insert", "b insert") for row in steps.results[name]]
    assert deps.statuses(pg, children) == dict.fromkeys(children, "Waiting")
    deps.settle_pass(pg)
    assert deps.noted(pg) == []
    marked = pg.execute(
        "SELECT count(*) FROM work_items WHERE id = ANY(%s) AND has_children", [[p1, p2]]
    ).fetchone()
    assert marked == (2,)
    deps.finish(pg, [(p1, a1), (p2, a2)])
    assert deps.statuses(pg, children) == dict.fromkeys(children, "Queued")


def test_a_queued_parent_is_claimed_while_a_child_naming_it_is_being_enqueued(
    pg: Conn, sessions: list[Session]
) -> None:
    """A caller inserts a child of a Queued parent and keeps its transaction open; a
    Worker's claim must take the parent meanwhile (docs/guide/enqueueing.md: "an
    enqueue takes no lock that another enqueue or a Worker waits for").

    Today it does not: the child's row in work_dependencies takes a FOR KEY SHARE lock
    on its parent (the foreign key), held until the caller's transaction ends, and
    work_claim_v2 locks its candidates FOR UPDATE SKIP LOCKED, which that lock blocks:
    the parent is passed over by every claim until the caller commits. (FOR NO KEY
    UPDATE, which work_recover_v1 takes for this reason, would not conflict.)"""
    caller = sessions[0]
    parent = deps.insert(pg, "P")[0]
    steps = Steps(pg, sessions)
    steps.run(caller, "insert", enqueue_after([parent]))
    claimed = deps.claim(pg, ["P"])
    steps.run(caller, "commit", COMMIT)
    steps.wait()
    assert claimed == [(parent, 1)]


def test_a_scoped_parent_keeps_its_place_in_line_while_a_child_naming_it_is_enqueued(
    pg: Conn, sessions: list[Session]
) -> None:
    """Scope s runs R; P, then Q, wait in one line behind it. A caller inserts a child
    of P and keeps its transaction open while R finishes: the scope's next item must
    be P, as the line says (docs/guide/enqueueing.md: "in the order above").

    Today Q runs first: R's finish settles s, and work_settle_locked makes P its head
    with FOR UPDATE SKIP LOCKED, which the child's FOR KEY SHARE lock on P (its foreign
    key) blocks, so Q stands in as the head and the claim takes it."""
    caller = sessions[0]
    r = deps.running(pg, "K", scope="s")
    parent, q = deps.insert(pg, "K", scope="s", n=2)
    steps = Steps(pg, sessions)
    steps.run(caller, "insert", enqueue_after([parent]))
    deps.finish(pg, r)
    claimed = deps.claim(pg, ["K"])
    steps.run(caller, "commit", COMMIT)
    steps.wait()
    assert claimed == [(parent, 1)], f"P is {parent}, Q is {q}"


def test_a_running_parents_release_does_not_wait_for_a_child_being_enqueued(
    pg: Conn, sessions: list[Session]
) -> None:
    """A caller inserts a child of a Running parent and keeps its transaction open; the
    parent's Worker releases it (shutdown) or retries it meanwhile: that call must not
    wait for the caller.

    Today it waits until the caller's transaction ends: work_requeue_v1 locks the
    Running rows FOR UPDATE, which the child's FOR KEY SHARE lock on its parent (the
    foreign key of work_dependencies) blocks."""
    caller, worker = sessions[:2]
    (parent, attempt), = deps.running(pg, "P")  # fmt: skip
    steps = Steps(pg, sessions)
    steps.run(caller, "insert", enqueue_after([parent]))
    steps.run(worker, "release", in_transaction(
        "SELECT * FROM work_requeue_v1(%s, %s, 'release')", ([parent], [attempt])))  # fmt: skip
    waited = steps.blocked(worker)
    steps.run(caller, "commit", COMMIT)
    steps.run(worker, "commit release", COMMIT)
    steps.wait()
    assert not waited, "the release waited for the caller's transaction"
    assert deps.status(pg, parent) == "Queued"


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_child_enqueued_at_a_strict_isolation_commits_though_its_parent_heartbeated(
    pg: Conn, sessions: list[Session], isolation: str
) -> None:
    """A caller at REPEATABLE READ or SERIALIZABLE inserts a child of a Running parent,
    whose Worker heartbeats it before the caller commits. The commit must succeed
    (docs/guide/enqueueing.md: "Your transaction may run at any isolation level, and
    take its time").

    Today it fails with a serialization failure (40001): at commit,
    work_items_wait_for_parents locks the parent FOR NO KEY UPDATE, and at these levels
    locking a row that another transaction changed since the snapshot is refused. A
    Running parent's row changes at every heartbeat, so a caller whose transaction
    outlasts one heartbeat interval cannot enqueue a child of it at all."""
    caller = sessions[0]
    (parent, attempt), = deps.running(pg, "P")  # fmt: skip
    begin: LiteralString = {
        "REPEATABLE READ": "BEGIN ISOLATION LEVEL REPEATABLE READ",
        "SERIALIZABLE": "BEGIN ISOLATION LEVEL SERIALIZABLE",
    }[isolation]
    steps = Steps(pg, sessions)
    steps.run(caller, "begin", deps.just(begin))
    steps.run(caller, "insert", enqueue_after([parent]))
    pg.execute("SELECT * FROM work_heartbeat_v1(%s, %s, 60)", ([parent], [attempt]))
    steps.run(caller, "commit", COMMIT, may_fail=True)
    steps.wait()
    assert {name: repr(error) for name, error in steps.errors.items()} == {}
    child = steps.results["insert"][0][0]
    assert deps.status(pg, child) == "Waiting"


def test_a_child_cancelled_by_its_failed_parent_does_not_run_once_retention_deleted_it(
    pg: Conn,
) -> None:
    """A parent Fails and its child is Cancelled ("parent N failed"); retention then
    deletes the parent (no child needs it: the child has ended), and an operator
    retries the child. It must not run: its parent never Succeeded (the migration: a
    Waiting item is made Queued "only when every parent has Succeeded"; the guide:
    `retry` of such a child "cancels it again while that parent is still Failed").

    Today it becomes Queued and is claimed: work_items_after_parents reads the parents
    from work_dependencies, whose row went with the parent (ON DELETE CASCADE), so it
    finds none that has not Succeeded. (`after` still names the parent.)"""
    (parent, attempt), = deps.running(pg, "P")  # fmt: skip
    child = deps.insert(pg, "C", after=[parent])[0]
    deps.finish(pg, [(parent, attempt)], "Failed")
    assert deps.reason(pg, child) == f"parent {parent} failed"
    deleted = pg.execute(
        "SELECT * FROM work_delete_finished_v2(ARRAY['Failed'], '-infinity', 0, 10)"
    ).fetchall()
    assert len(deleted) == 1
    pg.execute("SELECT * FROM work_retry_v1(%s)", ([child],))
    claimed = deps.claim(pg, ["C"])
    assert claimed == [], f"the child of a Failed parent ran: {deps.status(pg, child)}"
