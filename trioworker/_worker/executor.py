"""Run claimed attempts: each handler in a nursery of its own, and the one write after it.

Each claimed item runs in its own nursery, whose cancel scope is the attempt's: its
deadline is the send time of the last successful heartbeat (the claim counts as the
first) + lease/2, on Trio's clock, and only a successful heartbeat moves it (the
Worker's one heartbeat statement renews every attempt, `heartbeats.py`). The kind's
timeout is a scope of its own inside it. Whoever cancels the attempt records why first
(`Attempt.stop`); once the deadline has passed, the reason is the self-stop whatever
came before. `decide` picks the write from the reason alone, and the deadline is the
last word before every write: a self-stopped attempt writes nothing, so it can never
reach the fail path. Whatever the handler raises is data; only the Worker's own
cancellation, told by its own scope's state, goes on up.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Protocol

import trio

from trioworker._core.errors import DatabaseUnavailable, HandlerTimeout, Lost, StoreError
from trioworker._core.jsontext import UndecodableValue
from trioworker._core.model import WorkItem
from trioworker._core.policy import (
    Action,
    AttemptOutcome,
    CancelReason,
    Decision,
    Outcome,
    decide,
    describe_error,
    reduced,
    undecodable_payload,
    undecodable_values,
)
from trioworker._core.registry import Registration, Registry
from trioworker._core.retry import Backoff
from trioworker._core.settings import Settings
from trioworker._core.validation import result_json
from trioworker._store.api import Store, handler_view
from trioworker._worker.asyncio_loop import AsyncioLoop
from trioworker._worker.attempt import Attempt, Slot
from trioworker._worker.batching import CompletionBatcher
from trioworker._worker.context import Context, Shared
from trioworker._worker.heartbeats import Heartbeats
from trioworker._worker.logging import item_logger
from trioworker._worker.raised import holds, only_cancelled
from trioworker._worker.stops import StopWatch

log = logging.getLogger("trioworker.executor")

#: A handler that returned (made once: an Outcome is frozen).
RETURNED = Outcome()
#: Called when a handler will not stop: it must end the process (the CLI's exits 70).
FailStop = Callable[[str], None]


class EventSink(Protocol):
    """Where a Worker reports what happens (the Prometheus metrics, say): events such
    as "claimed", "complete", "self_stopped", and timings such as "heartbeat_rtt"."""

    def observe(self, event: str, kind: str, value: float | None = None) -> None: ...


class AttemptTrace(Protocol):
    """One attempt as a tracer sees it (`trioworker.otel`: a span, claim to write)."""

    def event(self, name: str, detail: str | None = None) -> None:
        """Something happened: "heartbeat_failed" (with why) or "self_stopped"."""

    def end(self, outcome: AttemptOutcome, error: BaseException | None) -> None:
        """The attempt is over: `outcome` names its write, or why there was none
        (ABANDONED comes with the exception that ended it when the Worker stopped at
        once)."""


class Tracer(Protocol):
    """Starts an `AttemptTrace` for each attempt a Worker runs."""

    def start(self, item: WorkItem) -> AttemptTrace: ...


class _NoTrace:
    def event(self, name: str, detail: str | None = None) -> None:
        pass

    def end(self, outcome: AttemptOutcome, error: BaseException | None) -> None:
        pass


_NO_TRACE = _NoTrace()


class _NoTracer:
    def start(self, item: WorkItem) -> AttemptTrace:
        return _NO_TRACE


class Executor:
    """Runs the attempts of one Worker: `run` for each claimed item; `heartbeats.run`
    and `watch_stops` once, in the Worker's nursery, beside `completions.run`."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        settings: Settings,
        *,
        worker_id: str,
        fail_stop: FailStop,
        events: EventSink | None = None,
        tracer: Tracer | None = None,
        on_earliest_stop: Callable[[float], None] | None = None,
    ) -> None:
        """`on_earliest_stop(at)` is told the earliest time by which a running handler
        must have ended (Trio's clock; inf: none), whenever it changes."""
        self.store = store
        self.registry = registry
        self.settings = settings
        self.worker_id = worker_id
        self.fail_stop = fail_stop
        self.events = events
        self.tracer: Tracer = tracer or _NoTracer()
        #: The attempts whose handlers run, each on its own: after a failover lost a
        #: claim, one item (even one attempt number) can come back while its first run
        #: goes on.
        self.running: set[Attempt] = set()
        #: Attempts begun and not yet written (or given up), for a graceful stop.
        self.in_flight = 0
        self._idle: trio.Event | None = None
        self.stops = StopWatch(on_earliest_stop)
        self.heartbeats = Heartbeats(
            store,
            settings,
            self.running,
            moved=self._moved,
            together=self.stops.together,
            observe=self._observe,
        )
        self.completions = CompletionBatcher(store, self._completed)
        self._shared = Shared(
            worker_id,
            trio.CapacityLimiter(settings.max_concurrent_files),
            # What handlers get as `ctx.store`: the store's handler face alone.
            handler_view(store),
            functools.partial(
                store.fenced_transaction, server_timeout=settings.fenced_server_timeout
            ),
            log,
            steps=_StepStore(store, settings.fenced_server_timeout),
            lost=self._lost,
        )
        #: Why every attempt that starts from now on is stopped at once (the shutdown).
        self._stop_all: CancelReason | None = None

    @property
    def limiter(self) -> trio.CapacityLimiter:
        return self._shared.limiter

    def serve_asyncio(self, nursery: trio.Nursery) -> AsyncioLoop:
        """Give handlers an asyncio loop (`Context.run_asyncio`), opened in `nursery`
        when a handler first needs it."""
        self._shared.asyncio_loop = loop = AsyncioLoop(nursery)
        return loop

    def shut_down(self) -> None:
        """The shutdown grace period is over: stop every attempt (they are released)."""
        self._stop_all = CancelReason.SHUTDOWN
        with self.stops.together():
            for attempt in list(self.running):
                attempt.stop(CancelReason.SHUTDOWN)
                self._moved(attempt)

    async def idle(self) -> None:
        """Return once no attempt is in flight (none runs, none is writing)."""
        while self.in_flight:
            self._idle = idle = trio.Event()
            await idle.wait()

    async def run(self, item: WorkItem, claim_sent_at: float, slot: Slot) -> Decision:
        """Run one claimed attempt to its end, and make (or hand over) its one write,
        which it returns. `slot` is the Worker's slot it holds, given back when the
        attempt is done with its scope: an unscoped one when its handler is over, a
        scoped one once its write has been made; a completion's, when the Worker claims
        along with completions, goes to the claim sent with it (`batching.py`)."""
        self.in_flight += 1
        trace = self.tracer.start(item)
        attempt = Attempt(item, claim_sent_at + self.settings.self_stop_after, slot, trace)
        decision = None
        try:
            registration = self.registry.get(item.kind)
            undecodable = isinstance(item.payload, UndecodableValue) or item.undecodable
            if registration is None or undecodable:
                decision = await self._refuse(attempt, registration)
            else:
                decision = await self._attempt(attempt, registration)
            return decision
        except BaseException as exc:
            # The Worker stopped at once (or broke): no write; lease recovery takes it.
            trace.end(AttemptOutcome.ABANDONED, None if isinstance(exc, trio.Cancelled) else exc)
            raise
        finally:
            if decision is None or decision.action is not Action.COMPLETE:
                slot.release()
                self._done()  # else the completion batcher's answer ends the attempt

    async def _attempt(self, attempt: Attempt, registration: Registration) -> Decision:
        """The handler in its nursery, then the decision and its write (a completion
        is handed to the batcher, whose answer ends the attempt)."""
        item = attempt.item
        if trio.current_time() < attempt.deadline:
            decision, outcome, reason = await self._handle(attempt, registration)
        else:
            # The claim's answer came after the attempt's self-stop deadline (a link
            # that stalled, then healed): its handler never starts, nothing is written.
            decision, outcome, reason = self._decide(attempt, registration, None)
        completes = decision.action is Action.COMPLETE
        if item.scope is None and not (completes and self.completions.claims_along):
            attempt.slot.release()  # its handler is over: the next claim may overlap the write
        # (A completion's slot, when the Worker claims along with completions, is the
        # claim's that goes out with it: batching.py.)
        if completes:
            self.completions.submit(attempt)
            return decision
        if decision.action is Action.NOTHING:
            written = nothing_written(reason, outcome)
        else:
            written = await self._write(attempt, decision)
        attempt.trace.end(written, outcome.error)
        return decision

    async def _handle(
        self, attempt: Attempt, registration: Registration
    ) -> tuple[Decision, Outcome, CancelReason | None]:
        """Run the handler in the attempt's nursery, held to its bound, and decide."""
        item = attempt.item
        if self._stop_all is not None:
            attempt.stop(self._stop_all)
        self.running.add(attempt)
        attempt.bound = attempt.must_end_by(self.settings.stop_grace)
        self.stops.add(attempt.bound)
        ctx = Context(self._shared, attempt)
        started = trio.current_time()
        error: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                attempt.scope = scope = nursery.cancel_scope
                scope.deadline = attempt.deadline
                if attempt.stop_at < math.inf:
                    scope.cancel()
                try:
                    if registration.timeout is None:
                        returned = await registration.handler(item, ctx)
                    else:
                        timeout = trio.CancelScope(deadline=started + registration.timeout)
                        attempt.timeout = timeout
                        self._moved(attempt)
                        with timeout:
                            returned = await registration.handler(item, ctx)
                    # Its result, as stored with its Succeeded: one that cannot be
                    # stored (UnstorableResult) fails the attempt, as an error of its
                    # handler. One completed in its transaction stored its own there.
                    if returned is not None and not attempt.completed:
                        attempt.result = result_json(returned)
                except BaseException as exc:  # what the handler raised is data
                    error = exc
            # The Worker's own cancellation, told by its own scope's state (never by
            # what the handler raised), goes on up here, before anything is decided.
            await self._unless_worker_cancelled(attempt, error)
            decided = self._decide(attempt, registration, error)
        finally:
            self._end(attempt)
        self._observe("handler_duration", item.kind, trio.current_time() - started)
        return decided

    async def _unless_worker_cancelled(self, attempt: Attempt, error: BaseException | None) -> None:
        """Raise Trio's Cancelled if the Worker itself is being cancelled (a checkpoint
        only then); what the handler raised meanwhile is ignored, and said so."""
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
        except trio.Cancelled:
            if error is not None and not only_cancelled(error):
                self._item_log(attempt.item).info(
                    "as the Worker stopped, the handler raised %s; ignored", describe_error(error)
                )
            raise

    @trio.lowlevel.enable_ki_protection
    def _decide(
        self,
        attempt: Attempt,
        registration: Registration,
        error: BaseException | None,
    ) -> tuple[Decision, Outcome, CancelReason | None]:
        """The write that follows, while the attempt still counts as running (so a
        hostile `__str__` that never returns still meets the fail-stop); describing
        the error never raises."""
        reason = attempt.reason
        if reason is not None and only_cancelled(error):
            error = None  # its own cancellation, as asked: no error of the handler's
        elif reason is CancelReason.LOST and isinstance(error, Lost):
            error = None  # a step's record found it lost (`Context.step`): said once
        if error is None:
            outcome = RETURNED
        else:
            lost = any(holds(error, link) for link in attempt.database_errors)
            outcome = Outcome(error=error, database_lost=lost)
        if reason is CancelReason.TIMEOUT:  # a handler failure, retried by the kind's policy
            assert registration.timeout is not None
            reason, outcome = None, Outcome(error=HandlerTimeout(registration.timeout))
        decision = decide(
            reason,
            outcome,
            failures_before=attempt.item.failures,
            policy=registration.retry,
            completed=attempt.completed,
        )
        self._log_end(attempt, reason, outcome, decision)
        return decision, outcome, reason

    def _end(self, attempt: Attempt) -> None:
        """The handler is over: no more heartbeats, no fail-stop bound."""
        self.running.discard(attempt)
        self.stops.discard(attempt.bound)
        attempt.bound = math.inf

    def _lost(self, attempt: Attempt) -> None:
        """A step's record found the item taken: the attempt stops as lost."""
        attempt.stop(CancelReason.LOST)
        self._moved(attempt)

    def _moved(self, attempt: Attempt) -> None:
        """The attempt's deadline moved, or it was asked to stop: its bound follows."""
        if attempt.bound == math.inf:  # its handler is over (a heartbeat came after)
            return
        bound = attempt.must_end_by(self.settings.stop_grace)
        if bound != attempt.bound:
            self.stops.move(attempt.bound, bound)
            attempt.bound = bound

    def _done(self) -> None:
        self.in_flight -= 1
        if not self.in_flight and self._idle is not None:
            self._idle.set()

    def _completed(self, attempt: Attempt, outcome: AttemptOutcome) -> None:
        """The batcher's answer for a completion: the attempt is over."""
        if outcome is AttemptOutcome.COMPLETE:
            if attempt.completed:
                outcome = AttemptOutcome.SUCCEEDED_IN_TRANSACTION
            self._observe(outcome.value, attempt.item.kind)
        elif outcome is AttemptOutcome.FENCED_OUT:
            self._fenced_out(attempt, "complete")
        else:
            self._too_late(attempt, "complete")
        attempt.trace.end(outcome, None)
        attempt.slot.release()
        self._done()

    async def watch_stops(self) -> None:
        """Ask for the fail-stop when a handler asked to stop has not ended within the
        stop grace (one task for the Worker)."""
        await self.stops.watch(self._overdue)

    def _overdue(self, now: float) -> None:
        for attempt in [a for a in self.running if a.bound <= now]:
            reason = (attempt.reason or CancelReason.SELF_STOP).value
            item = attempt.item
            message = (
                f"handler of item {item.id} (attempt {item.attempt}, kind {item.kind})"
                f" did not stop within {self.settings.stop_grace:g}s of being cancelled"
                f" ({reason}); its file side effects cannot be trusted to stop, so the"
                " Worker stops"
            )
            self.stops.discard(attempt.bound)
            attempt.bound = math.inf
            # The fail-stop first: logging may block (a full pipe); the CLI's never
            # returns, and its supervisor says so.
            self.fail_stop(message)
            self._item_log(item).critical(message)  # no arguments: a % in it stays

    def _item_log(self, item: WorkItem) -> logging.LoggerAdapter[logging.Logger]:
        return item_logger(log, item, self.worker_id)

    async def _refuse(self, attempt: Attempt, registration: Registration | None) -> Decision:
        """An item no handler here can run: an unknown kind goes back untouched (claims
        take only the registry's kinds, so the store broke that); an undecodable
        payload or time (stored by plain SQL past what Python reads) fails at once."""
        item = attempt.item
        ilog = self._item_log(item)
        if registration is None:
            ilog.error("claimed an item of kind %r, which has no handler here", item.kind)
            decision = Decision(Action.RELEASE)
        elif isinstance(item.payload, UndecodableValue):
            ilog.error(
                "the payload cannot be decoded (%s): failing the item without running it",
                item.payload.reason,
            )
            decision = undecodable_payload(item.payload.reason)
        else:
            assert item.undecodable
            ilog.error(
                "a stored value cannot be decoded (%s): failing the item without running it",
                "; ".join(f"{column} {why}" for column, why in item.undecodable),
            )
            decision = undecodable_values(item.undecodable)
        attempt.trace.end(await self._write(attempt, decision), None)
        return decision

    def _log_end(
        self,
        attempt: Attempt,
        reason: CancelReason | None,
        outcome: Outcome,
        decision: Decision,
    ) -> None:
        """Say how the attempt ended, where there is something to say (nothing when it
        just completes)."""
        kind, completed = attempt.item.kind, attempt.completed
        if reason is CancelReason.SELF_STOP:
            if attempt.scope is None:
                self._item_log(attempt.item).warning(
                    "self-stopped before its handler started: the claim was answered more"
                    " than %.1fs (half the lease) after it was sent; writing nothing,"
                    " lease recovery will requeue it",
                    self.settings.self_stop_after,
                )
            else:
                self._item_log(attempt.item).warning(
                    "self-stopped: no heartbeat succeeded for %.1fs (half the lease);"
                    " writing nothing, lease recovery will %s",
                    self.settings.self_stop_after,
                    "finish it as Succeeded" if completed else "requeue it",
                )
            attempt.trace.event(AttemptOutcome.SELF_STOPPED.value)
            self._observe(AttemptOutcome.SELF_STOPPED.value, kind)
        elif reason is CancelReason.LOST:
            self._item_log(attempt.item).warning(
                "lost: another attempt owns the item now; writing nothing"
            )
            self._observe(AttemptOutcome.LOST.value, kind)
        elif completed:
            pass  # Succeeded in its transaction; what it raised after is told below
        elif reason is not None:
            self._item_log(attempt.item).info("stopped (%s)", reason.value)
        elif outcome.database_lost and outcome.error is not None:
            self._item_log(attempt.item).warning(
                "lost PostgreSQL in the attempt's transaction (%s); writing nothing,"
                " lease recovery will requeue it as a stall",
                describe_error(outcome.error),
            )
            self._observe(AttemptOutcome.DATABASE_LOST.value, kind)
        elif decision.action is Action.RETRY:
            self._item_log(attempt.item).warning(
                "handler failed (%s); retrying in %.1fs",
                decision.error,
                decision.delay,
                extra={"traceback": decision.traceback},
            )
        elif decision.action is Action.FAIL:
            self._item_log(attempt.item).error(
                "handler failed for good: %s (%s)",
                decision.reason,
                decision.error,
                extra={"traceback": decision.traceback},
            )
        if outcome.error is not None and (reason is not None or completed):
            after = "the cancel" if reason is not None else "completing its item"
            self._item_log(attempt.item).info(
                "after %s the handler raised %s; ignored", after, describe_error(outcome.error)
            )

    async def _write(self, attempt: Attempt, decision: Decision) -> AttemptOutcome:
        """Make the decided write, retrying through short outages; say what became of
        it: the action's outcome, FENCED_OUT or WRITE_FAILED.

        The self-stop deadline is the last word before each try, the first one too:
        from then on the item belongs to lease recovery, so nothing is sent.
        """
        item = attempt.item
        backoff = Backoff(initial=0.2, maximum=2.0)
        refusals = 0
        while not attempt.self_stopped:
            try:
                applied = await self._apply(item, decision)
            except StoreError as exc:
                if not isinstance(exc, DatabaseUnavailable):
                    # The database refused the write itself: once more as it was, then
                    # in smaller forms, never left to become a stall.
                    refusals += 1
                    smaller = decision if refusals == 1 else reduced(decision)
                    if smaller is not None:
                        self._item_log(item).warning(
                            "the database refused %s (%s); %s",
                            decision.action.value,
                            exc,
                            "trying again" if smaller is decision else "recording it reduced",
                        )
                        decision = smaller
                        continue
                delay = backoff.next()
                if too_late(trio.current_time(), delay, attempt.deadline):
                    break
                self._item_log(item).warning(
                    "could not record %s (%s); retrying", decision.action.value, exc
                )
                await trio.sleep(delay)
                continue
            if applied:
                done = AttemptOutcome.of(decision.action)
                self._observe(done.value, item.kind)
                return done
            self._fenced_out(attempt, decision.action.value)
            return AttemptOutcome.FENCED_OUT
        self._too_late(attempt, decision.action.value)
        return AttemptOutcome.WRITE_FAILED

    def _fenced_out(self, attempt: Attempt, action: str) -> None:
        self._item_log(attempt.item).warning(
            "%s was fenced out: the attempt had lost the item", action
        )
        self._observe(AttemptOutcome.LOST.value, attempt.item.kind)

    def _too_late(self, attempt: Attempt, action: str) -> None:
        self._item_log(attempt.item).error(
            "could not record %s before the self-stop deadline; lease recovery will take the item",
            action,
        )

    async def _apply(self, item: WorkItem, decision: Decision) -> bool:
        store, id, attempt = self.store, item.id, item.attempt
        match decision.action:
            case Action.RETRY:
                assert decision.error is not None
                return await store.retry_later(
                    id, attempt, decision.delay, decision.error, decision.traceback
                )
            case Action.FAIL:
                assert decision.reason is not None
                return await store.fail(
                    id, attempt, decision.reason, decision.error, decision.traceback
                )
            case Action.CANCEL:
                return await store.cancel_attempt(id, attempt)
            case Action.RELEASE:
                return await store.release(id, attempt)
        raise AssertionError(f"no write for {decision.action}")  # pragma: no cover, no mutate

    def _observe(self, event: str, kind: str, value: float | None = None) -> None:
        if self.events is not None:
            self.events.observe(event, kind, value)


class _StepStore:
    """The store's steps, recorded under the Worker's `fenced_server_timeout`, and the
    parents' results."""

    def __init__(self, store: Store, server_timeout: float | None) -> None:
        self.step = store.step
        self.parent_results = store.parent_results
        self._store = store
        self._server_timeout = server_timeout

    async def record_step(
        self, id: int, attempt: int, name: str, result: str | None, *, until: Callable[[], float]
    ) -> bool:
        return await self._store.record_step(
            id, attempt, name, result, until=until, server_timeout=self._server_timeout
        )


def too_late(now: float, delay: float, give_up_at: float) -> bool:
    """Whether a write retried `delay` seconds from `now` would come at or after
    `give_up_at` (so the write gives up instead)."""
    return now + delay >= give_up_at


def nothing_written(reason: CancelReason | None, outcome: Outcome) -> AttemptOutcome:
    """Why an attempt wrote nothing: SELF_STOPPED, DATABASE_LOST or LOST."""
    if reason is CancelReason.SELF_STOP:
        return AttemptOutcome.SELF_STOPPED
    if reason is None and outcome.database_lost:
        return AttemptOutcome.DATABASE_LOST
    return AttemptOutcome.LOST
