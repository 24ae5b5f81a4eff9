"""Random sequences of store operations, run on PostgreSQL and the in-memory store in
lockstep: both must answer alike, and the invariants must hold after every step.
"""

from __future__ import annotations

import collections
from typing import Any

import psycopg
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.support.harness import MemoryHarness, PostgresHarness
from tests.support.lines import wedges
from trioworker import ItemState, Lost, PostgresStore, Status

LEASE = 300.0
SCOPES = st.sampled_from([None, "a", "b", "c"])
DEDUP = st.sampled_from([None, None, "k1", "k2"])
WORKERS = st.sampled_from(["w1", "w2", "w3"])
FILTERS = st.sampled_from([None, ("a",), ("b", "c")])
KINDS = st.sampled_from([("Crawl", "Purge"), ("Crawl",), ("Purge",)])
PRIORITIES = st.sampled_from([0, 0, 0, 5, -5])


def lockstep_machine(store: PostgresStore, pg: psycopg.Connection[Any]) -> type:
    class StoreMachine(RuleBasedStateMachine):
        """Each rule runs on both stores; `ids` maps PostgreSQL ids to in-memory ids."""

        def __init__(self) -> None:
            super().__init__()
            pg.execute("TRUNCATE work_items RESTART IDENTITY CASCADE")
            self.pg = PostgresHarness(store, pg)
            self.mem = MemoryHarness()
            self.ids: dict[int, int] = {}
            self.seen: dict[int, ItemState] = {}
            self.claims: dict[int, int] = {}  # pg id -> attempt of its latest claim

        def both(self, op: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            on_pg = trio.from_thread.run(lambda: getattr(self.pg.store, op)(*args, **kwargs))
            mem_args = [
                self.ids.get(a, a) if i == 0 and op != "enqueue" else a for i, a in enumerate(args)
            ]
            on_mem = trio.from_thread.run(lambda: getattr(self.mem.store, op)(*mem_args, **kwargs))
            return on_pg, on_mem

        @rule(
            kind=st.sampled_from(["Crawl", "Purge"]),
            scope=SCOPES,
            dedup_key=DEDUP,
            priority=PRIORITIES,
        )
        def enqueue(
            self, kind: str, scope: str | None, dedup_key: str | None, priority: int
        ) -> None:
            a, b = self.both("enqueue", kind, scope=scope, dedup_key=dedup_key, priority=priority)
            assert a.deduplicated == b.deduplicated
            if a.deduplicated:
                assert self.ids[a.id] == b.id
            self.ids[a.id] = b.id

        @rule(worker=WORKERS, scopes=FILTERS, kinds=KINDS)
        def claim(
            self, worker: str, scopes: tuple[str, ...] | None, kinds: tuple[str, ...]
        ) -> None:
            unscoped = scopes is None
            a, b = self.both("claim", worker, LEASE, scopes, unscoped=unscoped, kinds=kinds)
            assert (a is None) == (b is None), (a, b)
            if a is not None:
                assert self.ids[a.id] == b.id and a.attempt == b.attempt
                self.claims[a.id] = a.attempt

        @precondition(lambda self: self.claims)
        @rule(
            data=st.data(),
            stale=st.booleans(),
            op=st.sampled_from(
                ["heartbeat", "complete", "fail", "cancel_attempt", "release", "retry_later"]
            ),
        )
        def write(self, data: st.DataObject, stale: bool, op: str) -> None:
            id = data.draw(st.sampled_from(sorted(self.claims)))
            attempt = self.claims[id] - 1 if stale else self.claims[id]
            args: tuple[Any, ...] = {
                "heartbeat": (LEASE,),
                "fail": ("gave up", "Error"),
                "retry_later": (3600.0, "Error"),
            }.get(op, ())
            a, b = self.both(op, id, attempt, *args)
            assert a == b, (op, a, b)

        @precondition(lambda self: self.claims)
        @rule(data=st.data(), stale=st.booleans())
        def complete_in_transaction(self, data: st.DataObject, stale: bool) -> None:
            """A handler's `tx.complete()`: its fenced transaction notes the success."""
            id = data.draw(st.sampled_from(sorted(self.claims)))
            attempt = self.claims[id] - 1 if stale else self.claims[id]

            async def complete(store: Any, id: int) -> bool:
                try:
                    async with store.fenced_transaction(id, attempt) as tx:
                        tx.complete()
                except Lost:
                    return False
                return True

            a = trio.from_thread.run(complete, self.pg.store, id)
            b = trio.from_thread.run(complete, self.mem.store, self.ids[id])
            assert a == b, (a, b)

        @precondition(lambda self: self.claims)
        @rule(data=st.data())
        def expire_lease(self, data: st.DataObject) -> None:
            id = data.draw(st.sampled_from(sorted(self.claims)))
            if self.seen.get(id) and self.seen[id].status is Status.RUNNING:
                self.pg.expire_lease(id)
                trio.from_thread.run_sync(self.mem.expire_lease, self.ids[id])

        @rule()
        def recover(self) -> None:
            a, b = self.both("recover_expired_leases", 2)
            assert sorted((self.ids[r.id], r.status, r.stalls) for r in a) == sorted(
                (r.id, r.status, r.stalls) for r in b
            )

        @precondition(lambda self: self.ids)
        @rule(data=st.data())
        def request_cancel(self, data: st.DataObject) -> None:
            id = data.draw(st.sampled_from(sorted(self.ids)))
            a, b = self.both("cancel", id)
            assert a == b

        @invariant()
        def stores_agree_and_invariants_hold(self) -> None:
            pg_items = self.pg.items()
            mem_items = {i.id: i for i in self.mem.items()}
            assert sorted(self.ids) == [i.id for i in pg_items], "an item disappeared"
            running: collections.Counter[str] = collections.Counter()
            queued_keys: collections.Counter[str] = collections.Counter()
            for item in pg_items:
                twin = mem_items[self.ids[item.id]]
                assert (item.status, item.attempt, item.stalls, item.failures) == (
                    twin.status, twin.attempt, twin.stalls, twin.failures,
                ), (item, twin)  # fmt: skip
                assert (item.completed_at is None) == (twin.completed_at is None), (item, twin)
                before = self.seen.get(item.id)
                if before is not None:
                    assert item.attempt >= before.attempt, "attempts only grow"
                    if before.status.is_terminal:
                        assert item.status is before.status, "terminal states stay terminal"
                    if before.completed_at is not None:
                        assert item.status in (Status.RUNNING, Status.SUCCEEDED), (
                            "a committed success ends Succeeded, or not yet"
                        )
                        assert (item.attempt, item.stalls) == (before.attempt, before.stalls)
                if item.status is Status.RUNNING and item.scope is not None:
                    running[item.scope] += 1
                if item.status is Status.QUEUED and item.dedup_key is not None:
                    queued_keys[item.dedup_key] += 1
                self.seen[item.id] = item
            assert all(n == 1 for n in running.values()), running
            assert all(n == 1 for n in queued_keys.values()), queued_keys
            assert wedges(pg) == []

    return StoreMachine


async def test_random_operation_sequences_keep_the_invariants(
    store: PostgresStore, pg: psycopg.Connection[Any]
) -> None:
    """At most one Running per scope, one Queued per dedup key, attempts only grow,
    terminal stays terminal, a success committed in a fenced transaction ends
    Succeeded or not at all, nothing disappears, no line wedged; and the two stores
    never disagree, in priorities and kinds too.
    """
    machine = lockstep_machine(store, pg)
    await trio.to_thread.run_sync(
        lambda: run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=100,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    )
