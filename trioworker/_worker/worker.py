"""The Worker: claims work items and runs them, all its loops children of one nursery.

    async with trio.open_nursery() as nursery:
        worker = Worker(store, registry, fail_stop=end_the_process)
        await nursery.start(worker.run)  # returns once it is listening
        ...
        worker.stop()  # graceful: finish or release running items

`run` returns after a graceful stop; cancel it to stop at once (nothing is written:
running items are left to lease recovery).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import Sequence
from typing import Protocol

import attrs
import trio

from trioworker._core.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    IdTakenOver,
    StoreError,
)
from trioworker._core.limits import Declared, describe_limit
from trioworker._core.model import HeldLease, Recovered, Status, WorkerInfo, WorkItem
from trioworker._core.registry import Registry
from trioworker._core.retry import Backoff
from trioworker._core.settings import Settings
from trioworker._store.api import Store
from trioworker._store.reads import ALIVE_BEATS
from trioworker._worker.attempt import Slot, Slots
from trioworker._worker.executor import EventSink, Executor, FailStop, Tracer

log = logging.getLogger("trioworker.worker")

#: Added to a schedule's wait (and the least wait): a due time is past when woken.
SCHEDULE_NAP = 0.01


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Watchdog(Protocol):
    """Something outside the Worker's interpreter that ends its process when its
    handlers outlive their bound, even when the interpreter cannot run (C code holding
    the GIL, a blocked log write): `run`'s supervisor."""

    def publish(self, kill_at: float) -> None:
        """End this process at `kill_at` (`time.monotonic()`; inf: never), unless a
        later call moves it."""


@attrs.frozen
class WorkerStatistics:
    """A snapshot of a Worker's counters (`Worker.statistics()`)."""

    claimed: int
    running: int
    events: dict[str, int]  # completed, retry, fail, cancel, release, self_stopped, lost, ...


class Worker:
    """Claims work items of its registry's kinds and runs them, each attempt stopping
    itself half a lease after its last good heartbeat (module docstring: how to run one).
    """

    #: Where claimed items run: the nursery of `run` while it claims, None once it has
    #: closed. Set by `run` before the completion batcher may claim along, the only
    #: reader; so no value before that.
    _items: trio.Nursery | None

    def __init__(
        self,
        store: Store,
        registry: Registry,
        settings: Settings | None = None,
        *,
        worker_id: str | None = None,
        scopes: Sequence[str] | None = None,
        unscoped: bool | None = None,
        fail_stop: FailStop,
        watchdog: Watchdog | None = None,
        metrics: EventSink | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        """`scopes`: serve only these scopes (None: all). `unscoped`: take unscoped
        items too (default: yes when serving all scopes, no when serving a list).
        `fail_stop` is called when a handler will not stop; it must end the process.
        `watchdog` is told when to end the process from outside if the interpreter
        cannot. `tracer` traces each attempt (`trioworker.otel.OtelTracer`, say).
        """
        self.store = store
        self.registry = registry
        self.settings = settings or Settings()
        self.worker_id = worker_id or default_worker_id()
        self.scopes = None if scopes is None else sorted(set(scopes))
        self.unscoped = (scopes is None) if unscoped is None else unscoped
        #: The kinds this Worker claims: those its registry has handlers for.
        self.kinds = tuple(registry.kinds)
        self.events: collections.Counter[str] = collections.Counter()
        self._metrics = metrics
        self._watchdog = watchdog
        self.executor = Executor(
            store,
            registry,
            self.settings,
            worker_id=self.worker_id,
            fail_stop=fail_stop,
            events=self,
            tracer=tracer,
            on_earliest_stop=None if watchdog is None else self._publish_stop_bound,
        )
        self._wake = trio.Event()
        self._settle_wake = trio.Event()
        #: The slots the last claim (the claim loop's, or one sent along with
        #: completions) found no item for: a claim takes every item that may start, so
        #: while any, the claim loop waits for a NOTIFY, a free slot or the poll.
        self._unfilled = 0
        self._stopping = trio.Event()
        self._slot_wait = trio.CancelScope()
        #: Why this Worker's id is no longer its own (another Worker took it over).
        self._taken_over: str | None = None
        #: When this Worker last advertised itself (Trio's clock; None: not yet, which
        #: its presence loop keeps trying).
        self._advertised_at: float | None = None
        #: A slot per running attempt; a slot given back wakes the claim loop.
        self._slots = Slots(self.settings.concurrency, self._wake_claims)

    # -- events (the executor reports here; they are counted, and passed to metrics) ----

    def observe(self, event: str, kind: str, value: float | None = None) -> None:
        if value is None:
            self.events[event] += 1
        if self._metrics is not None:
            self._metrics.observe(event, kind, value)

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(
            claimed=self.events["claimed"],
            running=self.executor.in_flight,
            events=dict(self.events),
        )

    # -- control -------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming; running items get the shutdown grace period, then are released."""
        if not self._stopping.is_set():
            log.info(
                "stopping: no new claims; %d running item(s) get %.0fs to finish",
                self.executor.in_flight,
                self.settings.shutdown_grace,
            )
        self._stopping.set()
        self._slot_wait.cancel()
        self._wake.set()

    def _on_notify(self, scope: str | None) -> None:
        if scope is None or self._serves(scope):
            self._wake.set()

    def _on_settle(self, scope: str | None) -> None:
        self._settle_wake.set()

    def _serves(self, scope: str) -> bool:
        if scope == "":
            return self.unscoped
        return self.scopes is None or scope in self.scopes

    # -- the loops ----------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Claim and run items until `stop()` (graceful) or cancellation (at once).
        IdTakenOver, once stopped as by `stop()`, if another Worker took over its id."""
        log.info(
            "worker %s starting: kinds %s; %s, concurrency %d, lease %gs, heartbeat %gs, poll %gs",
            self.worker_id,
            ", ".join(self.kinds) or "none",
            self._describe_scopes(),
            self.settings.concurrency,
            self.settings.lease,
            self.settings.heartbeat,
            self.settings.poll,
        )
        await self.claim_id()
        await self._declare_limits()
        executor = self.executor
        async with trio.open_nursery() as background:
            await background.start(
                functools.partial(self.store.listen, self._on_notify, on_settle=self._on_settle)
            )
            background.start_soon(self._presence_loop)
            background.start_soon(self._recovery_loop)
            background.start_soon(self._settle_loop)
            if self.registry.schedules:
                background.start_soon(self._schedule_loop)
            background.start_soon(executor.heartbeats.run)
            background.start_soon(executor.completions.run)
            background.start_soon(executor.watch_stops)
            asyncio_loop = executor.serve_asyncio(background)
            async with trio.open_nursery() as items:
                self._items = items
                executor.completions.claims = self
                task_status.started()
                log.info("worker %s ready", self.worker_id)
                await self._claim_loop(items)
                await self._drain()
            self._items = None
            await executor.idle()  # completions handed over are answered (or given up)
            asyncio_loop.close()
            background.cancel_scope.cancel()
        if self._taken_over is not None:
            raise IdTakenOver(self._taken_over)
        log.info("worker %s stopped", self.worker_id)

    def _backoff(self) -> Backoff:
        """How the Worker's loops space their tries while PostgreSQL fails them."""
        return Backoff(initial=0.5, maximum=max(self.settings.poll * 2, 5.0))

    async def _declare_limits(self) -> None:
        """Put the limits its handlers declare in force before the first claim (each
        replaces the kind's limit in the database); while PostgreSQL cannot be reached,
        try again with backoff, claiming nothing meanwhile. Refused (the Worker's role
        may not, say): ConfigurationError, and the Worker stops."""
        backoff = self._backoff()
        pending = self.registry.declared_limits
        while pending and not self._stopping.is_set():
            try:
                done = await self.store.declare_limit(pending[0])
            except DatabaseUnavailable as exc:
                delay = backoff.next()
                log.warning(
                    "cannot put the limit declared for kind %s in force: %s; no claims"
                    " until it is; retrying in %.1fs",
                    pending[0].kind,
                    exc,
                    delay,
                )
                with trio.move_on_after(delay):
                    await self._stopping.wait()
                continue
            except StoreError as exc:
                raise ConfigurationError(
                    f"cannot put the limit declared for kind {pending[0].kind} in force: {exc}"
                    " (a Worker's role needs EXECUTE on work_declare_limit_v1: docs/grants.sql)"
                ) from None
            pending = pending[1:]
            self._log_declared(done)

    def _log_declared(self, done: Declared) -> None:
        """Say a declared limit was written (a warning when it replaced another)."""
        if not done.written:
            return
        kind, declared = done.declared.kind, done.declared
        now = describe_limit(declared.running, declared.rate)
        if done.before is None:
            log.info("kind %s: its declared limit is in force (%s)", kind, now)
        else:
            log.warning(
                "kind %s: its declared limit (%s) replaces the one the database held (%s)",
                kind,
                now,
                describe_limit(*done.before),
            )

    def _describe_scopes(self) -> str:
        served = "all scopes" if self.scopes is None else "scopes " + ", ".join(self.scopes)
        return served + (" and unscoped items" if self.unscoped else " only")

    async def _claim_loop(self, items: trio.Nursery) -> None:
        backoff = self._backoff()
        while (first := await self._free_slot()) is not None:
            if self._unfilled > 0:  # nothing more could start as of the last claim
                self._unfilled = 0
                self._slots.unused([first])
                await self._idle(await self._until_next_due())
                continue
            slots = [first, *self._slots.take_free()]  # one claim fills every free slot
            # Stopped or cut off for as long as others wait before taking its id: no
            # claim until this Worker has advertised itself again (its id its own).
            # Taken over, it has stopped: the wait ends at once, and so does the loop.
            if self._seemed_gone() and not await self._advertise(quiet=True):
                self._slots.unused(slots)
                with trio.move_on_after(backoff.next()):  # the presence loop logs why
                    await self._stopping.wait()
                continue
            self._wake = trio.Event()  # before the claim: a NOTIFY during it is not lost
            self._unfilled = 0
            sent_at = trio.current_time()
            try:
                claimed = await self.store.claim_batch(
                    self.worker_id,
                    self.settings.lease,
                    len(slots),
                    self.scopes,
                    unscoped=self.unscoped,
                    kinds=self.kinds,
                )
            except StoreError as exc:
                self._slots.unused(slots)
                delay = backoff.next()
                log.warning(
                    "cannot claim: %s (failure %d); retrying in %.1fs",
                    exc,
                    backoff.failures,
                    delay,
                )
                with trio.move_on_after(delay):  # backoff: NOTIFYs do not cut it short
                    await self._stopping.wait()
                continue
            if backoff.failures:
                log.info("PostgreSQL answers again; claiming")
                backoff.reset()
            self._start(items, claimed, sent_at, slots)

    def _start(
        self, items: trio.Nursery, claimed: list[WorkItem], sent_at: float, slots: list[Slot]
    ) -> None:
        """Run each item claimed in a slot of its own; give back the slots left over,
        and note how many there were (`_unfilled`)."""
        self._slots.unused(slots[len(claimed) :])
        self._unfilled = len(slots) - len(claimed)
        run = self.executor.run
        for index, item in enumerate(claimed):  # never more than asked for
            self.observe("claimed", item.kind)
            items.start_soon(run, item, sent_at, slots[index])

    # -- claims along with completions (the executor's batcher calls these) ---------------

    def claiming(self) -> bool:
        """Whether a batch of completions claims too: while the Worker claims at all,
        and not while it seemed gone (the claim loop advertises again before it claims).
        (The batcher asks only once `run` has set `_items`.)"""
        return not self._stopping.is_set() and not self._seemed_gone()

    def free_slots(self) -> list[Slot]:
        return self._slots.take_free()

    async def complete_and_claim(
        self, attempts: Sequence[tuple[int, int]], slots: list[Slot]
    ) -> set[int]:
        """Complete a batch and claim for `slots` in one round trip (`batching.py`)."""
        sent_at = trio.current_time()
        try:
            applied, claimed = await self.store.complete_and_claim(
                attempts,
                self.worker_id,
                self.settings.lease,
                len(slots),
                self.scopes,
                unscoped=self.unscoped,
                kinds=self.kinds,
            )
        except BaseException:
            self._slots.unused(slots)  # (the claim loop claims for them)
            raise
        items = self._items
        if items is None:  # sent before the Worker stopped, answered after its items ended
            self._slots.unused(slots)
            for item in claimed:  # back to Queued at once, not after the lease
                with contextlib.suppress(StoreError):
                    await self.store.release(item.id, item.attempt)
            return applied
        self._start(items, claimed, sent_at, slots)
        return applied

    async def _free_slot(self) -> Slot | None:
        """Wait for a free slot; None (holding none) once stop() has been called."""
        self._slot_wait = trio.CancelScope()
        with self._slot_wait:
            if not self._stopping.is_set():
                return await self._slots.take()
        return None

    def _wake_claims(self) -> None:
        """A slot came free: claim again at once, more work may be waiting."""
        self._wake.set()

    async def _until_next_due(self) -> float:
        """The poll interval, or less when a delayed item falls due sooner."""
        try:
            due = await self.store.seconds_until_due(
                kinds=self.kinds, scopes=self.scopes, unscoped=self.unscoped
            )
        except StoreError:
            return self.settings.poll
        if due is None:
            return self.settings.poll
        return min(self.settings.poll, max(due, 0.0) + 0.01)

    async def _idle(self, seconds: float) -> None:
        with trio.move_on_after(seconds):
            await self._wake.wait()

    async def _drain(self) -> None:
        """Give running items the grace period, then cancel them (they are released)."""
        with trio.move_on_after(self.settings.shutdown_grace):
            await self.executor.idle()
        if self.executor.running:
            log.warning(
                "shutdown grace period over: cancelling and releasing %d item(s)",
                len(self.executor.running),
            )
            self.executor.shut_down()

    async def _recovery_loop(self) -> None:
        while True:
            try:
                recovered = await self.store.recover_expired_leases(self.settings.max_stalls)
                held = await self.store.held_leases()
                repaired = await self.store.repair_heads()
            except StoreError as exc:
                log.warning(
                    "lease recovery failed: %s; next try in %.0fs",
                    exc,
                    self.settings.recovery_every,
                )
                recovered, held, repaired = [], [], []
            for scope in repaired:
                self.observe("heads_repaired", "")
                log.error(
                    "scope %r was wedged (due work no claim could take) and is repaired:"
                    " this is a bug in trioworker, please report it",
                    scope,
                )
            for r in recovered:
                self._log_recovered(r)
            for h in held:
                self._log_held(h)
            await trio.sleep(self.settings.recovery_every)

    def _log_held(self, h: HeldLease) -> None:
        """Say, every pass, that an expired item's row is held past every bound the queue
        sets on a holder, and by which backend: someone must end that session."""
        self.observe("lease_held", h.kind)
        holder = "another session" if h.holder is None else f"backend {h.holder}"
        log.warning(
            "lease of item %d expired %.0fs ago, and %s still holds its row: lease"
            " recovery takes the item back once that session ends (attempt %d on Worker %s)",
            h.id,
            h.expired_for,
            holder,
            h.attempt,
            h.worker_id,
            extra={"item_id": h.id, "attempt": h.attempt, "kind": h.kind, "scope": h.scope,
                   "worker_id": self.worker_id, "stalled_worker_id": h.worker_id,
                   "holder_pid": h.holder},
        )  # fmt: skip

    def _log_recovered(self, r: Recovered) -> None:
        """Say what lease recovery did with an item; count its stall."""
        fields = {
            "item_id": r.id,
            "attempt": r.attempt,
            "kind": r.kind,
            "scope": r.scope,
            "worker_id": self.worker_id,
            "stalled_worker_id": r.worker_id,
        }
        # Both Workers: the one whose attempt stopped heartbeating, and this one.
        whose = f"attempt {r.attempt} on Worker {r.worker_id}; recovered by {self.worker_id}"
        if r.status is Status.SUCCEEDED:  # its success was committed: no stall
            log.info(
                "lease expired after the attempt committed its success in its"
                " transaction: finished as Succeeded, no stall (%s)",
                whose,
                extra=fields,
            )
            return
        self.observe("stall_recovered", r.kind)
        if r.status is Status.FAILED:
            log.error(
                "lease expired; stall %d of %d: failed as stalled (%s)",
                r.stalls,
                self.settings.max_stalls,
                whose,
                extra=fields,
            )
        elif r.status is Status.QUEUED:
            log.warning(
                "lease expired; stall %d of %d: requeued (%s)",
                r.stalls,
                self.settings.max_stalls,
                whose,
                extra=fields,
            )
        else:
            log.warning(
                "lease expired; stall %d: %s (%s; %s)",
                r.stalls,
                r.status.value,
                r.reason,
                whose,
                extra=fields,
            )

    async def _settle_loop(self) -> None:
        """Settle what was left noted (scopes changed by hand, Waiting items a settle
        met held): at once when it is announced, every poll interval in case an
        announcement was missed, and again soon after a pass that settled anything.
        A pass notes again, unannounced, what another transaction still holds: the
        last two parents of an item finishing at once in two Workers' transactions,
        the second announcing it while the first has not committed. That transaction
        is about to end, so the pass after it comes at 0.05 s, and each that follows
        unannounced twice as late, until one settles nothing (at most a poll interval
        apart). An announcement starts again at 0.05 s: during a busy fan-in many
        passes settle something, and their count says nothing of how long the last
        holder will take."""
        soon = Backoff(initial=0.05, maximum=self.settings.poll)
        wait = self.settings.poll
        while True:
            with trio.move_on_after(wait) as unannounced:
                await self._settle_wake.wait()
            self._settle_wake = trio.Event()
            if not unannounced.cancelled_caught:
                soon.reset()
            try:
                settled = await self.store.settle_noted_scopes()
            except StoreError as exc:
                settled = 0
                log.warning(
                    "settling scopes failed: %s; next try in %.0fs", exc, self.settings.poll
                )
            if settled > 0:
                wait = soon.next()
            else:
                soon.reset()
                wait = self.settings.poll

    async def _schedule_loop(self) -> None:
        """Enqueue the registry's periodic items as they fall due. The database holds
        each schedule's next due time and a Worker fires one under its row lock, so
        each due time is enqueued once, whichever of the Workers gets to it."""
        schedules = self.registry.schedules
        backoff = self._backoff()
        synced = False  # pragma: no mutate  (None is as false)
        while not self._stopping.is_set():  # a stopping Worker enqueues no more work
            try:
                if not synced:
                    await self.store.sync_schedules(schedules)
                    synced = True
                fired, wait = await self.store.fire_schedules(schedules)
            except StoreError as exc:
                delay = backoff.next()
                log.warning("cannot fire schedules: %s; retrying in %.1fs", exc, delay)
                await trio.sleep(delay)
                continue
            backoff.reset()
            for f in fired:
                self.observe("scheduled", f.name)
                log.info(
                    "schedule %s: due %s, %s item %d",
                    f.name,
                    f.due.isoformat(timespec="seconds"),
                    "merged onto its still queued" if f.deduplicated else "enqueued",
                    f.item,
                )
            # Until the next due time (by the database's clock), or a poll interval:
            # another Worker may have changed or fired a schedule meanwhile.
            nap = self.settings.poll if wait is None else min(self.settings.poll, wait)
            with trio.move_on_after(nap + SCHEDULE_NAP):
                await self._stopping.wait()

    async def claim_id(self) -> None:
        """Advertise this Worker before it claims anything: ConfigurationError if a
        live Worker holds its id (a second `--worker-id w1` beside a live w1), so two
        never run, or stop, as one. PostgreSQL unreachable: the presence loop retries."""
        sent_at = trio.current_time()
        with contextlib.suppress(StoreError):  # the presence loop tries at once, and says so
            await self.store.advertise(self.info())
            self._advertised_at = sent_at

    def info(self) -> WorkerInfo:
        """What this Worker advertises in the Workers table."""
        return WorkerInfo(
            id=self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            kinds=self.kinds,
            scopes=None if self.scopes is None else tuple(self.scopes),
            unscoped=self.unscoped,
            concurrency=self.settings.concurrency,
            advertise_every=self.settings.recovery_every,
        )

    def _seemed_gone(self) -> bool:
        """Whether other Workers may take this one for gone: it has not advertised itself
        for as long as they allow (a SIGSTOP, a stalled link), so its id may be another's."""
        if self._advertised_at is None:
            return False
        since = trio.current_time() - self._advertised_at
        return since >= self.settings.recovery_every * ALIVE_BEATS

    async def _advertise(self, *, quiet: bool = False) -> bool:
        """Advertise this Worker once; whether it did (`quiet`: a failure is not logged).
        Its id taken over meanwhile (it seemed gone, and another Worker started under
        it): say so, once, and stop. An advertisement counts from when it was sent: a
        Worker stopped between sending one and reading its answer seemed gone meanwhile."""
        sent_at = trio.current_time()
        try:
            await self.store.advertise(self.info())
        except StoreError as exc:
            if not quiet:
                log.warning("could not advertise this Worker: %s", exc)
        except ConfigurationError as exc:  # taken over while it seemed gone
            if self._taken_over is None:
                self._taken_over = f"this Worker's id was taken over while it seemed gone: {exc}"
                log.error(
                    "%s; stopping: no new claims, running items end by their fence",
                    self._taken_over,
                )
            self.stop()
        else:
            self._advertised_at = sent_at
            return True
        return False

    async def _presence_loop(self) -> None:
        """Advertise this Worker every recovery interval (the table's last_seen says it
        is alive); on the way out, record that it stopped, unless its id was taken over
        (the other Worker's stop is not this one's to record)."""
        advertised = False  # pragma: no mutate  (None is as false)
        try:
            while self._taken_over is None:
                advertised = await self._advertise() or advertised
                await trio.sleep(self.settings.recovery_every)
        finally:
            if advertised and self._taken_over is None:
                with trio.CancelScope(shield=True), trio.move_on_after(self.settings.poll):
                    try:
                        await self.store.worker_stopped(self.worker_id)
                    except StoreError as exc:
                        log.warning("could not record that this Worker stopped: %s", exc)

    def _publish_stop_bound(self, earliest: float) -> None:
        """Tell the watchdog outside: the earliest time a running handler must have
        ended (Trio's clock), as `time.monotonic()`, plus a margin (the in-process
        fail-stop comes first whenever the interpreter runs)."""
        assert self._watchdog is not None
        at = time.monotonic() + (earliest - trio.current_time()) + self.settings.kill_margin
        self._watchdog.publish(at)
