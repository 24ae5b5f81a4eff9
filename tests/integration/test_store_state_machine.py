"""Random sequences of store operations, run on PostgreSQL and the in-memory store in
lockstep: both must answer alike, and the invariants must hold after every step.
"""

from __future__ import annotations

import collections
import datetime as dt
import re
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import psycopg
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.support.harness import MemoryHarness, PostgresHarness
from tests.support.lines import wedges
from trioworker import (
    InvalidLimit,
    InvalidWorkItem,
    ItemState,
    Limit,
    Lost,
    Pause,
    PostgresStore,
    Status,
)

LEASE = 300.0
SCOPES = st.sampled_from([None, "a", "b", "c"])
DEDUP = st.sampled_from([None, None, "k1", "k2"])
WORKERS = st.sampled_from(["w1", "w2", "w3"])
FILTERS = st.sampled_from([None, ("a",), ("b", "c")])
KINDS = st.sampled_from([("Crawl", "Purge"), ("Crawl",), ("Purge",)])
PRIORITIES = st.sampled_from([0, 0, 0, 5, -5])
#: Not yet due for this long (None: due at once).
DELAYS = st.sampled_from([None, None, None, None, None, 600.0])
#: What a pause, a limit or a clear names: a kind, a scope, or (for a limit) the
#: default running limit of scopes.
TARGETS = st.sampled_from(
    [{"kind": "Crawl"}, {"kind": "Purge"}, {"scope": "a"}, {"scope": "b"}, {"scope": "c"}]
)
LIMIT_TARGETS = st.sampled_from(
    [{"kind": "Crawl"}, {"kind": "Purge"}, {"scope": "a"}, {"scope": "b"}, {}]
)
RUNNING = st.sampled_from([None, 1, 2, 3])
RATES = st.sampled_from([None, None, None, None, "1/h", "3/h"])
#: Ids in reasons ("parent 7 failed", "superseded by queued item 7"), which the two
#: stores may number apart (a deduplicated insert takes an id on PostgreSQL).
IDS_IN_REASONS = re.compile(r"(parent|queued item) (\d+)")

Call = Callable[[Any, Callable[[int], int]], Awaitable[Any]]


def lockstep_machine(
    store: PostgresStore, pg: psycopg.Connection[Any], reached: collections.Counter[str]
) -> type:
    """The machine; `reached` counts the outcomes its rules reached, so a run can show
    it reached each one."""

    class StoreMachine(RuleBasedStateMachine):
        """Each rule runs on both stores; `ids` maps PostgreSQL ids to in-memory ids."""

        def __init__(self) -> None:
            super().__init__()
            pg.execute(
                "TRUNCATE work_items, work_unsettled_waiting, work_limits, work_pauses,"
                " work_spent_scopes RESTART IDENTITY CASCADE"
            )
            self.pg = PostgresHarness(store, pg)
            self.mem = MemoryHarness()
            self.ids: dict[int, int] = {}
            self.seen: dict[int, ItemState] = {}
            self.claims: dict[int, int] = {}  # pg id -> attempt of its latest claim
            self.parents: dict[int, list[int]] = {}  # pg id -> its parents' pg ids
            # What the machine set, to check each claim against: paused kinds and
            # scopes, running limits by ("kind"|"scope", name), the default's (None).
            self.paused: set[tuple[str, str]] = set()
            self.running_limits: dict[tuple[str, str] | None, int] = {}
            self.ceiling = 1  # the highest running limit a claim met

        def both(self, op: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            on_pg = trio.from_thread.run(lambda: getattr(self.pg.store, op)(*args, **kwargs))
            mem_args = [
                self.ids.get(a, a) if i == 0 and op != "enqueue" else a for i, a in enumerate(args)
            ]
            on_mem = trio.from_thread.run(lambda: getattr(self.mem.store, op)(*mem_args, **kwargs))
            return on_pg, on_mem

        def apart(self, call: Call) -> tuple[Any, Any]:
            """`call(store, id_of)` on each store, `id_of` giving that store's id of a
            PostgreSQL id."""
            on_pg = trio.from_thread.run(lambda: call(self.pg.store, lambda id: id))
            on_mem = trio.from_thread.run(lambda: call(self.mem.store, self.ids.__getitem__))
            return on_pg, on_mem

        def in_memory(self, reason: str | None) -> str | None:
            """A PostgreSQL reason with the in-memory store's ids."""
            if reason is None:
                return None
            return IDS_IN_REASONS.sub(lambda m: f"{m[1]} {self.ids[int(m[2])]}", reason)

        def scope_limit(self, scope: str) -> int:
            own = self.running_limits.get(("scope", scope))
            return own if own is not None else self.running_limits.get(None, 1)

        def check_claimed(self, claimed: Any) -> None:
            """A claim started only what the pauses and running limits let start."""
            reached["claim"] += 1
            if self.paused:
                reached["claim while a kind or scope is paused"] += 1
            assert ("kind", claimed.kind) not in self.paused, claimed
            running = [i for i in self.pg.items() if i.status is Status.RUNNING]
            if claimed.scope is not None:
                assert ("scope", claimed.scope) not in self.paused, claimed
                in_scope = sum(i.scope == claimed.scope for i in running)
                assert in_scope <= self.scope_limit(claimed.scope), (claimed, in_scope)
                if in_scope > 1:
                    reached["claim: a scope's second slot"] += 1
            kind_limit = self.running_limits.get(("kind", claimed.kind))
            if kind_limit is not None:
                of_kind = sum(i.kind == claimed.kind for i in running)
                assert of_kind <= kind_limit, (claimed, of_kind)
                reached["claim under a kind's running limit"] += 1
            self.ceiling = max(self.ceiling, *self.running_limits.values(), 1)

        def settle(self) -> None:
            """The settle pass a limit's change asks the Workers for (on its NOTIFY):
            a raised limit gives a busy scope its next heads. The in-memory claim reads
            the lines themselves, so it has nothing to settle."""
            trio.from_thread.run(self.pg.store.settle_noted_scopes)

        def running(self) -> list[int]:
            """Claimed items Running at their latest claim's attempt, as last seen."""
            return sorted(
                id
                for id, attempt in self.claims.items()
                if (seen := self.seen.get(id)) is not None
                and seen.status is Status.RUNNING
                and seen.attempt == attempt
            )

        def waiting(self) -> list[int]:
            return sorted(id for id, s in self.seen.items() if s.status is Status.WAITING)

        @initialize(
            items=st.lists(
                st.tuples(
                    st.sampled_from(["Crawl", "Purge"]),
                    st.sampled_from([None, "a", "a", "b", "c"]),
                    PRIORITIES,
                ),
                min_size=2,
                max_size=8,
            )
        )
        def some_work(self, items: list[tuple[str, str | None, int]]) -> None:
            """Work to claim from the first step (a rule may not run in a whole example:
            Hypothesis leaves some out, and finds other bugs that way)."""
            for kind, scope, priority in items:
                a, b = self.both("enqueue", kind, scope=scope, priority=priority)
                self.ids[a.id] = b.id

        @initialize(
            roomy=st.booleans(),
            rated=st.booleans(),
            limits=st.lists(st.tuples(LIMIT_TARGETS, st.sampled_from([1, 2, 3])), max_size=2),
        )
        def some_limits(
            self, roomy: bool, rated: bool, limits: list[tuple[dict[str, str], int]]
        ) -> None:
            """Running limits from the first step, so claims meet them often (and, if
            `roomy`, scope a may run two); if `rated`, scope b may start one an hour, so
            its rate is spent after its first claim while its next items stay due."""
            for named, running in [({"scope": "a"}, 2)] * roomy + limits:
                self.change_limit(named, running, None, clear=False)
            if rated:
                self.change_limit({"scope": "b"}, None, "1/h", clear=False)

        @rule(
            kind=st.sampled_from(["Crawl", "Purge"]),
            scope=SCOPES,
            dedup_key=DEDUP,
            priority=PRIORITIES,
            delay=DELAYS,
        )
        def enqueue(
            self,
            kind: str,
            scope: str | None,
            dedup_key: str | None,
            priority: int,
            delay: float | None,
        ) -> None:
            """An item, due now or in ten minutes (`run_after`)."""
            run_after = None if delay is None else dt.timedelta(seconds=delay)
            reached["enqueue, due later" if delay else "enqueue"] += 1
            a, b = self.both(
                "enqueue",
                kind,
                scope=scope,
                dedup_key=dedup_key,
                priority=priority,
                run_after=run_after,
            )
            assert a.deduplicated == b.deduplicated
            if a.deduplicated:
                assert self.ids[a.id] == b.id
            self.ids[a.id] = b.id

        @precondition(lambda self: self.ids)
        @rule(
            data=st.data(),
            kind=st.sampled_from(["Crawl", "Purge"]),
            scope=SCOPES,
            priority=PRIORITIES,
            unknown=st.sampled_from([False] * 9 + [True]),
        )
        def enqueue_after(
            self, data: st.DataObject, kind: str, scope: str | None, priority: int, unknown: bool
        ) -> None:
            """An item after 1-3 items (the newest likelier), or after one that does not
            exist: refused by both, nothing written."""
            known = sorted(self.ids)
            parents = data.draw(
                st.lists(st.sampled_from(known[-6:] + known), min_size=1, max_size=3)
            )

            async def enqueue(store: Any, id_of: Callable[[int], int]) -> Any:
                after = [id_of(p) for p in parents]
                if unknown:
                    after.append(max(after) + 1000)
                try:
                    return await store.enqueue(kind, scope=scope, priority=priority, after=after)
                except InvalidWorkItem as exc:
                    return exc

            a, b = self.apart(enqueue)
            if unknown:
                assert isinstance(a, InvalidWorkItem) and isinstance(b, InvalidWorkItem), (a, b)
                return
            assert not a.deduplicated and not b.deduplicated
            self.ids[a.id] = b.id
            self.parents[a.id] = sorted(set(parents))

        @precondition(lambda self: self.waiting())
        @rule(data=st.data())
        def cancel_waiting(self, data: st.DataObject) -> None:
            """A Waiting item cancelled, its Waiting descendants with it."""
            id = data.draw(st.sampled_from(self.waiting()))
            a, b = self.both("cancel", id)
            assert a == b

        @precondition(lambda self: self.ids)
        @rule(data=st.data())
        def retry(self, data: st.DataObject) -> None:
            """Items retried (those Failed or Cancelled): a child whose parents have not
            all Succeeded waits again, or is Cancelled again at once."""
            ids = data.draw(st.lists(st.sampled_from(sorted(self.ids)), min_size=1, max_size=3))

            async def retry(store: Any, id_of: Callable[[int], int]) -> Any:
                return await store.retry([id_of(id) for id in ids])

            a, b = self.apart(retry)
            assert sorted(self.ids[id] for id in a) == sorted(b), (a, b)
            reached["retry" if a else "retry, none"] += 1
            for id in a:  # out of a terminal state by an operator's hand
                self.seen.pop(id, None)

        @precondition(lambda self: self.parents)
        @rule(data=st.data())
        def family(self, data: st.DataObject) -> None:
            """`show`'s parents and children (and for a Waiting item, why it waits), and
            `parent_results`, alike."""
            id = data.draw(st.sampled_from(sorted(self.ids)))

            async def read(store: Any, id_of: Callable[[int], int]) -> Any:
                shown = await store.show(id_of(id))
                waits = shown.waiting if shown.item.status is Status.WAITING else []
                relatives = [
                    [(r.id, r.kind, r.status) for r in rs] for rs in (shown.parents, shown.children)
                ]
                return relatives, waits, await store.parent_results(id_of(id))

            (relatives, waits, results), on_mem = self.apart(read)
            on_pg = (
                [[(self.ids[r], kind, status) for r, kind, status in rs] for rs in relatives],
                [self.in_memory(w) for w in waits],
                {self.ids[p]: v for p, v in results.items()},
            )
            assert on_pg == on_mem
            assert [r for r, _, _ in relatives[0]] == self.parents.get(id, [])

        @rule(worker=WORKERS, scopes=FILTERS, kinds=KINDS, batch=st.sampled_from([1, 1, 3]))
        def claim(
            self, worker: str, scopes: tuple[str, ...] | None, kinds: tuple[str, ...], batch: int
        ) -> None:
            """A Worker's claim of up to `batch` items, of its kinds and scopes."""
            unscoped = scopes is None
            a, b = self.both(
                "claim_batch", worker, LEASE, batch, scopes, unscoped=unscoped, kinds=kinds
            )
            assert [(self.ids[i.id], i.attempt) for i in a] == [(i.id, i.attempt) for i in b]
            for claimed in a:
                self.claims[claimed.id] = claimed.attempt
            for claimed in a:
                self.check_claimed(claimed)

        @precondition(lambda self: self.running())
        @rule(
            data=st.data(),
            stale=st.sampled_from([False, False, False, True]),
            op=st.sampled_from(
                ["heartbeat", "complete", "fail", "cancel_attempt", "release", "retry_later"]
            ),
        )
        def write(self, data: st.DataObject, stale: bool, op: str) -> None:
            """An attempt's write, mostly by one that holds its item (else fenced off)."""
            id = data.draw(st.sampled_from(self.running()))
            attempt = self.claims[id] - 1 if stale else self.claims[id]
            args: tuple[Any, ...] = {
                "heartbeat": (LEASE,),
                "fail": ("gave up", "Error"),
                "retry_later": (3600.0, "Error"),
            }.get(op, ())
            a, b = self.both(op, id, attempt, *args)
            assert a == b, (op, a, b)
            reached[f"{op}{'' if a else ', refused'}"] += 1

        @precondition(lambda self: self.running())
        @rule(data=st.data(), stale=st.sampled_from([False, False, False, True]))
        def complete_in_transaction(self, data: st.DataObject, stale: bool) -> None:
            """A handler's `tx.complete()`: its fenced transaction notes the success."""
            id = data.draw(st.sampled_from(self.running()))
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
            reached["complete in a fenced transaction" if a else "fenced, refused"] += 1

        @rule(ok=st.booleans())
        def run_one(self, ok: bool) -> None:
            """The next item of any kind and scope claimed and ended at once, Succeeded or
            Failed: parents end while their children wait."""
            a, b = self.both("claim", "w1", LEASE, None, unscoped=True, kinds=("Crawl", "Purge"))
            assert (a is None) == (b is None), (a, b)
            if a is None:
                return
            assert self.ids[a.id] == b.id and a.attempt == b.attempt
            self.claims[a.id] = a.attempt
            self.check_claimed(a)
            args = (a.id, a.attempt) if ok else (a.id, a.attempt, "gave up", "Error")
            done = self.both("complete" if ok else "fail", *args)
            assert done == (True, True), done

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

        @rule(named=TARGETS)
        def pause(self, named: dict[str, str]) -> None:
            """A kind or a scope paused: its Queued items are not claimed. Both stores
            say alike whether it was paused already."""
            a, b = self.both("pause", **named)
            assert a == b, (a, b)
            reached["pause" if a else "pause, no change"] += 1
            self.paused.add(next(iter(named.items())))

        @rule(data=st.data())
        def resume(self, data: st.DataObject) -> None:
            """A pause lifted (mostly one that is there)."""
            paused = [{what: name} for what, name in sorted(self.paused)]
            named = data.draw(st.sampled_from(paused) if paused else TARGETS)
            a, b = self.both("resume", **named)
            assert a == b, (a, b)
            reached["resume" if a else "resume, no change"] += 1
            self.paused.discard(next(iter(named.items())))

        @rule(named=LIMIT_TARGETS, running=RUNNING, rate=RATES, clear=st.booleans())
        def change_limit(
            self, named: dict[str, str], running: int | None, rate: str | None, clear: bool
        ) -> None:
            """A running limit and/or a rate set on a kind or a scope, or the default
            running limit of scopes; what the stores refuse (nothing to set, a default
            with a rate) they refuse alike. Or (`clear`) the limit removed."""
            if clear:
                a, b = self.both("clear_limit", **named)
                assert a == b, (a, b)
                reached["clear_limit" if a else "clear_limit, none"] += 1
                self.settle()
                self.running_limits.pop(next(iter(named.items()), None), None)
                return

            async def set(store: Any, _: Callable[[int], int]) -> Any:
                try:
                    limit = await store.set_limit(**named, running=running, rate=rate)
                except InvalidLimit as exc:
                    return str(exc)
                return attrs.evolve(limit, updated_at=None)

            a, b = self.apart(set)
            assert a == b, (a, b)
            reached["set_limit, refused" if isinstance(a, str) else "set_limit"] += 1
            self.settle()
            if running is not None and not isinstance(a, str):
                key = next(iter(named.items()), None)
                self.running_limits[key] = running

        @invariant()
        def stores_agree_and_invariants_hold(self) -> None:
            [(pg_now,)] = pg.execute("SELECT clock_timestamp()").fetchall()
            pg_items = self.pg.items()
            mem_now = trio.from_thread.run_sync(self.mem.store.now)
            mem_items = {i.id: i for i in self.mem.items()}
            assert sorted(self.ids) == [i.id for i in pg_items], "an item disappeared"
            assert len(mem_items) == len(pg_items), "an item appeared in memory"
            by_id = {i.id: i for i in pg_items}
            running: collections.Counter[str] = collections.Counter()
            queued_keys: collections.Counter[str] = collections.Counter()
            for item in pg_items:
                twin = mem_items[self.ids[item.id]]
                assert (item.status, item.attempt, item.stalls, item.failures) == (
                    twin.status, twin.attempt, twin.stalls, twin.failures,
                ), (item, twin)  # fmt: skip
                assert self.in_memory(item.reason) == twin.reason, (item, twin)
                assert item.error == twin.error, (item, twin)
                assert due_in(item, pg_now) == due_in(twin, mem_now), (item, twin)
                if item.status is Status.QUEUED and due_in(item, pg_now):
                    reached["a Queued item not yet due"] += 1
                assert (item.finished_at is None) == (twin.finished_at is None), (item, twin)
                parents = [by_id[p].status for p in self.parents.get(item.id, [])]
                undone = [s for s in parents if s is not Status.SUCCEEDED]
                if item.status is Status.WAITING:
                    assert undone and not {Status.FAILED, Status.CANCELLED} & set(undone), (
                        "a Waiting item has a parent pending, none ended otherwise"
                    )
                elif item.status in (Status.QUEUED, Status.RUNNING, Status.SUCCEEDED):
                    assert not undone, "an item runs only after every parent has Succeeded"
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
            assert all(n <= self.ceiling for n in running.values()), running
            a, b = self.apart(lambda store, _: store.limits())
            assert sorted(map(comparable, a)) == sorted(map(comparable, b)), (a, b)
            a, b = self.apart(lambda store, _: store.pauses())
            assert sorted(map(comparable, a)) == sorted(map(comparable, b)), (a, b)
            assert all(n == 1 for n in queued_keys.values()), queued_keys
            assert wedges(pg) == []
            (noted,) = pg.execute("SELECT count(*) FROM work_unsettled_waiting").fetchone() or (0,)
            assert noted == 0, "one session at a time: every Waiting item settled at once"

    return StoreMachine


#: Outcomes every run reaches (each seen 20 times or more a run, in runs of 100
#: examples), so a change that makes the machine stop reaching one fails here rather
#: than leaving a rule that tests nothing.
REACHED_EVERY_RUN = {
    "claim",
    "claim: a scope's second slot",
    "claim under a kind's running limit",
    "claim while a kind or scope is paused",
    "complete in a fenced transaction",
    "enqueue, due later",
    "a Queued item not yet due",
    "pause",
    "resume",
    "set_limit",
    "set_limit, refused",
    "clear_limit",
    "retry",
}


def due_in(item: ItemState, now: dt.datetime) -> int:
    """Whole minutes until `item` is due (0: due): the stores' clocks differ by the
    moments between their calls, never by a minute."""
    return max(0, round((item.run_after - now).total_seconds() / 60))


def comparable(value: Limit | Pause) -> tuple[Any, ...]:
    """A limit or a pause without the time it was written."""
    fields = attrs.asdict(value, recurse=False)
    fields.pop("updated_at", None)
    fields.pop("paused_at", None)
    return tuple(str(v) for v in fields.values())


async def test_random_operation_sequences_keep_the_invariants(
    store: PostgresStore, pg: psycopg.Connection[Any]
) -> None:
    """No claim starts what a pause or a running limit holds back, and no scope runs
    more than the highest limit it had; one Queued per dedup key, attempts only grow,
    terminal stays terminal (but by a retry), a success committed in a fenced
    transaction ends Succeeded or not at all, nothing disappears, no line wedged, a
    Waiting item waits for a parent still pending and an item with parents runs only
    after they have all Succeeded; and the two stores never disagree, in statuses,
    reasons, errors, due times, priorities, kinds, parents and children too, nor in
    their limits and pauses.
    """
    reached: collections.Counter[str] = collections.Counter()
    machine = lockstep_machine(store, pg, reached)
    await trio.to_thread.run_sync(
        lambda: run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=100,
                stateful_step_count=50,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
    )
    missed = REACHED_EVERY_RUN - set(reached)
    assert not missed, f"rules' outcomes never reached: {sorted(missed)} ({reached})"
