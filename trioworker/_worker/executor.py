"""Run one claimed attempt: the handler, its heartbeats, and the one write after it.

The handler runs in a cancel scope whose deadline is the send time of the last
successful heartbeat (the claim counts as the first) + lease/2, on Trio's clock. Each
heartbeat call runs under `move_on_after(heartbeat interval)`; only a successful one
moves the deadline. Whoever cancels the scope records why first; when the deadline
cancels it, the reason is the self-stop. `decide` then picks the write from the reason
alone, so a self-stopped or lost attempt writes nothing.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import trio

from trioworker._core.errors import DatabaseUnavailable, HandlerTimeout, StoreError
from trioworker._core.jsontext import UndecodableValue
from trioworker._core.model import Heartbeat, WorkItem
from trioworker._core.policy import (
    Action,
    AttemptOutcome,
    CancelReason,
    Decision,
    Outcome,
    decide,
    reduced,
    undecodable_payload,
)
from trioworker._core.registry import Registry
from trioworker._core.retry import Backoff
from trioworker._core.settings import Settings
from trioworker._store.api import Store, client_view
from trioworker._worker.context import Context
from trioworker._worker.logging import item_logger

log = logging.getLogger("trioworker.executor")

T = TypeVar("T")


class Attempt:
    """One attempt's cancel scope, the recorded reason it was cancelled, and whether its
    handler is over."""

    def __init__(
        self,
        item: WorkItem,
        claim_sent_at: float,
        settings: Settings,
        on_deadline: Callable[[float, float], None] | None = None,
    ) -> None:
        """`on_deadline(old, new)` is called when a heartbeat moves the deadline."""
        self.item = item
        self._on_deadline = on_deadline
        self.claim_sent_at = claim_sent_at
        self.settings = settings
        self.scope = trio.CancelScope(deadline=claim_sent_at + settings.self_stop_after)
        self._reason: CancelReason | None = None
        self._changed = trio.Event()  # set when the deadline moves, a cancel comes or the end
        self._ended = trio.Event()  # set when the handler is over
        self._on_end: Callable[[], None] | None = None

    def beat(self, sent_at: float) -> None:
        """A heartbeat sent at `sent_at` succeeded: push the self-stop deadline."""
        old = self.scope.deadline
        deadline = max(old, sent_at + self.settings.self_stop_after)
        if deadline != old:
            self.scope.deadline = deadline
            self._changed.set()
            self._changed = trio.Event()
            if self._on_deadline is not None:
                self._on_deadline(old, deadline)

    @property
    def stop_requested(self) -> bool:
        return self.scope.cancel_called or trio.current_time() >= self.scope.deadline

    def cancel(self, reason: CancelReason) -> None:
        """Record why, then cancel; a scope already past its deadline stays self-stopped."""
        if self._reason is None and not self.stop_requested:
            self._reason = reason
        self.scope.cancel()
        self._changed.set()

    @property
    def reason(self) -> CancelReason | None:
        if self._reason is not None:
            return self._reason
        return CancelReason.SELF_STOP if self.stop_requested else None

    @property
    def ended(self) -> bool:
        """Whether the handler is over."""
        return self._ended.is_set()

    def end(self) -> None:
        """The handler is over: the attempt's watchers go."""
        self._ended.set()
        self._changed.set()
        if self._on_end is not None:
            self._on_end()

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call `callback` when the handler is over (`end()`): one callback, registered
        before the end (the watcher checks `ended` and registers with no checkpoint
        between)."""
        self._on_end = callback

    async def wait_stop_requested(self) -> None:
        """Return once the scope is cancelled, by its deadline or explicitly."""
        await self._wait_until(lambda: self.stop_requested)

    async def wait_end_or_stop(self) -> None:
        """Return once the handler is over or the scope is cancelled."""
        await self._wait_until(lambda: self.ended or self.stop_requested)

    async def _wait_until(self, condition: Callable[[], bool]) -> None:
        """Wait for `condition`, checked whenever the deadline passes or `_changed` fires."""
        while not condition():
            changed = self._changed
            with trio.move_on_at(self.scope.deadline):
                await changed.wait()


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


class _NoTracer:
    def start(self, item: WorkItem) -> AttemptTrace:
        return _NoTrace()


class Executor:
    """Runs attempts for one Worker."""

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
        on_deadline: Callable[[], None] | None = None,
        complete: Callable[[int, int], Awaitable[bool]] | None = None,
    ) -> None:
        """`on_deadline` is called whenever the set of self-stop deadlines changes;
        `complete` replaces `store.complete` (the Worker passes its batcher's)."""
        self.store = store
        #: What handlers get as `ctx.store`: the store's client face alone.
        self.client = client_view(store)
        self.complete = complete or store.complete
        self.on_deadline = on_deadline
        self.registry = registry
        self.settings = settings
        self.worker_id = worker_id
        self.fail_stop = fail_stop
        self.limiter = trio.CapacityLimiter(settings.max_concurrent_files)
        self.events = events
        self.tracer = tracer or _NoTracer()
        #: The attempts now running, each on its own: after a failover lost a claim,
        #: one item (even one attempt number) can come back while its first run goes on.
        self.running: set[Attempt] = set()
        #: How many running attempts have each self-stop deadline: attempts claimed
        #: together share one, so the earliest is found among a few, not all of them.
        self._deadlines: collections.Counter[float] = collections.Counter()
        self._shutting_down = False  # pragma: no mutate  (None is as false)

    def shut_down(self) -> None:
        """The shutdown grace period is over: cancel every attempt (they are released)."""
        self._shutting_down = True
        for attempt in list(self.running):
            attempt.cancel(CancelReason.SHUTDOWN)

    async def run(self, item: WorkItem, claim_sent_at: float) -> Decision:
        """Run one claimed attempt to its end, and make its one write."""
        trace = self.tracer.start(item)
        try:
            return await self._run(item, claim_sent_at, trace)
        except BaseException as exc:
            # The Worker stopped at once (or broke): no write; lease recovery takes it.
            trace.end(AttemptOutcome.ABANDONED, unless_cancelled(exc))
            raise

    async def _run(self, item: WorkItem, claim_sent_at: float, trace: AttemptTrace) -> Decision:
        ilog = item_logger(log, item, self.worker_id)
        registration = self.registry.get(item.kind)
        if registration is None:
            # Claims take only the registry's kinds; an item of another kind here
            # means the store broke that, so the item goes back untouched.
            ilog.error("claimed an item of kind %r, which has no handler here", item.kind)
            decision = Decision(Action.RELEASE)
            give_up_at = claim_sent_at + self.settings.self_stop_after
            trace.end(await self._write(item, decision, give_up_at, ilog), None)
            return decision
        if isinstance(item.payload, UndecodableValue):
            # Stored by plain SQL past what Python can read: no attempt can run it.
            ilog.error(
                "the payload cannot be decoded (%s): failing the item without running it",
                item.payload.reason,
            )
            decision = undecodable_payload(item.payload.reason)
            give_up_at = claim_sent_at + self.settings.self_stop_after
            trace.end(await self._write(item, decision, give_up_at, ilog), None)
            return decision

        attempt = Attempt(item, claim_sent_at, self.settings, self._deadline_moved)
        self.running.add(attempt)
        self._deadline_moved(None, attempt.scope.deadline)
        if self._shutting_down:
            attempt.cancel(CancelReason.SHUTDOWN)
        ctx = Context(
            self.worker_id,
            attempt.scope,
            self.limiter,
            ilog,
            self.client,
            item,
            open_fenced=self.store.fenced_transaction,
            on_completed=functools.partial(attempt.cancel, CancelReason.COMPLETED),
        )
        started = trio.current_time()
        try:
            async with trio.open_nursery() as nursery:
                timeout_at = (
                    None if registration.timeout is None else started + registration.timeout
                )
                nursery.start_soon(self._watch, attempt, ilog, trace, timeout_at)
                outcome = await self._run_handler(registration.handler, item, ctx, attempt)
                attempt.end()  # the stop watch returns; what it started is cancelled
        finally:
            self.running.remove(attempt)
            self._deadline_moved(attempt.scope.deadline, None)
        reason = attempt.reason
        if reason is CancelReason.TIMEOUT:  # a handler failure, retried by the kind's policy
            assert registration.timeout is not None
            reason, outcome = None, Outcome(error=HandlerTimeout(registration.timeout))
        self._observe("handler_duration", item.kind, trio.current_time() - started)
        decision = decide(
            reason,
            outcome,
            failures_before=item.failures,
            policy=registration.retry,
        )
        self._log_end(ilog, reason, outcome, decision, attempt)
        if reason is CancelReason.SELF_STOP:
            trace.event(AttemptOutcome.SELF_STOPPED.value)
        if decision.action is Action.NOTHING:
            written = nothing_written(reason, outcome, ctx.completed_in_transaction)
        else:
            written = await self._write(item, decision, attempt.scope.deadline, ilog)
        trace.end(written, outcome.error)
        return decision

    def _deadline_moved(self, old: float | None, new: float | None) -> None:
        """A running attempt's deadline moved from `old` to `new` (None: it started or
        ended)."""
        if old is not None:
            self._deadlines[old] -= 1
            if not self._deadlines[old]:
                del self._deadlines[old]
        if new is not None:
            self._deadlines[new] += 1
        if self.on_deadline is not None:
            self.on_deadline()

    def earliest_deadline(self) -> float:
        return min(self._deadlines, default=math.inf)

    async def _run_handler(
        self, handler: Any, item: WorkItem, ctx: Context, attempt: Attempt
    ) -> Outcome:
        """Whatever the handler raises is data for `decide`: an Exception, and also a
        KeyboardInterrupt, SystemExit or any other BaseException raised in its code
        (the Worker's own signals never arrive that way). Only Trio's cancellation of
        the Worker itself goes on up; the attempt's own is caught by its scope."""
        try:
            with attempt.scope:
                await handler(item, ctx)
        except trio.Cancelled:
            raise
        except BaseExceptionGroup as group:
            cancelled, raised = group.split(trio.Cancelled)
            if cancelled is not None:  # the Worker is being cancelled: that goes on up
                if raised is not None:
                    ctx.log.info("as the Worker stopped, the handler raised %r; ignored", raised)
                raise cancelled from None
            return Outcome(error=group, database_lost=ctx.lost_database(group))
        except BaseException as exc:
            return Outcome(error=exc, database_lost=ctx.lost_database(exc))
        return Outcome()

    async def _watch(
        self,
        attempt: Attempt,
        ilog: logging.LoggerAdapter[Any],
        trace: AttemptTrace,
        timeout_at: float | None,
    ) -> None:
        """The attempt's stop watch, which starts its other watchers (the heartbeats, the
        kind's timeout), in a nursery of its own, when the first of them is due or when a
        stop comes first. A handler that is over before then, as most are, costs this
        task alone, which the end wakes: nothing is cancelled (in Trio, delivering a
        cancellation costs more than the task). Once started, the watchers are cancelled
        at the end."""
        first_due = attempt.claim_sent_at + self.settings.heartbeat
        with trio.move_on_at(first_due if timeout_at is None else min(first_due, timeout_at)):
            await attempt.wait_end_or_stop()
        if attempt.ended:
            return
        async with trio.open_nursery() as watchers:
            attempt.on_end(watchers.cancel_scope.cancel)
            watchers.start_soon(self._heartbeats, attempt, ilog, trace)
            if timeout_at is not None:
                watchers.start_soon(self._time_out, attempt, timeout_at)
            await self._watch_stop(attempt, ilog)

    async def _heartbeats(
        self, attempt: Attempt, ilog: logging.LoggerAdapter[Any], trace: AttemptTrace
    ) -> None:
        """Renew the lease every interval, until the attempt has self-stopped or is lost:
        those write nothing, and a heartbeat is a write. After a cancel request or at
        shutdown they go on, so the lease holds until the fenced write that follows.
        """
        interval = self.settings.heartbeat
        next_beat = attempt.claim_sent_at + interval
        while True:
            await trio.sleep_until(next_beat)
            next_beat += interval
            if attempt.reason in (CancelReason.SELF_STOP, CancelReason.LOST):
                return
            sent_at = trio.current_time()
            with trio.move_on_after(interval) as timeout:
                try:
                    result = await self.store.heartbeat(
                        attempt.item.id, attempt.item.attempt, self.settings.lease
                    )
                except StoreError as exc:
                    ilog.warning(
                        "heartbeat failed (%s); self-stop in %.1fs unless one succeeds",
                        exc,
                        attempt.scope.deadline - trio.current_time(),
                    )
                    trace.event("heartbeat_failed", str(exc))
                    continue
            if timeout.cancelled_caught:
                trace.event("heartbeat_failed", f"no answer within {interval:g}s")
                ilog.warning(
                    "heartbeat got no answer within %.1fs; self-stop in %.1fs unless one succeeds",
                    interval,
                    attempt.scope.deadline - trio.current_time(),
                )
                continue
            self._observe("heartbeat_rtt", attempt.item.kind, trio.current_time() - sent_at)
            if result is Heartbeat.LOST:
                attempt.cancel(CancelReason.LOST)
                return
            attempt.beat(sent_at)
            if result is Heartbeat.CANCEL_REQUESTED:
                attempt.cancel(CancelReason.CANCEL_REQUESTED)

    async def _time_out(self, attempt: Attempt, at: float) -> None:
        """The kind's timeout: cancel the handler at `at` (unless something came first)."""
        await trio.sleep_until(at)
        attempt.cancel(CancelReason.TIMEOUT)

    async def _watch_stop(self, attempt: Attempt, ilog: logging.LoggerAdapter[Any]) -> None:
        """Fail-stop the process if the handler ignores its cancel past the grace period."""
        await attempt.wait_stop_requested()
        await trio.sleep(self.settings.stop_grace)
        reason = (attempt.reason or CancelReason.SELF_STOP).value  # never None here
        message = (
            f"handler of item {attempt.item.id} (attempt {attempt.item.attempt},"
            f" kind {attempt.item.kind}) did not stop within {self.settings.stop_grace:g}s"
            f" of being cancelled ({reason}); its file side effects cannot be trusted"
            " to stop, so the Worker stops"
        )
        ilog.critical(message)  # no arguments: logging leaves a % in it alone
        self.fail_stop(message)

    def _log_end(
        self,
        ilog: logging.LoggerAdapter[Any],
        reason: CancelReason | None,
        outcome: Outcome,
        decision: Decision,
        attempt: Attempt,
    ) -> None:
        if reason is CancelReason.SELF_STOP:
            ilog.warning(
                "self-stopped: no heartbeat succeeded for %.1fs (half the lease);"
                " writing nothing, lease recovery will requeue it",
                self.settings.self_stop_after,
            )
            self._observe(AttemptOutcome.SELF_STOPPED.value, attempt.item.kind)
        elif reason is CancelReason.LOST:
            ilog.warning("lost: another attempt owns the item now; writing nothing")
            self._observe(AttemptOutcome.LOST.value, attempt.item.kind)
        elif reason is CancelReason.COMPLETED:
            if attempt.scope.cancelled_caught:
                ilog.info(
                    "the handler went on after completing its item in a transaction;"
                    " cancelled there (the scope was free for the next item)"
                )
        elif reason is not None:
            ilog.info("stopped (%s)", reason.value)
        elif outcome.database_lost:
            ilog.warning(
                "lost PostgreSQL in the attempt's transaction (%s); writing nothing,"
                " lease recovery will requeue it as a stall",
                outcome.error,
            )
            self._observe(AttemptOutcome.DATABASE_LOST.value, attempt.item.kind)
        elif decision.action is Action.RETRY:
            ilog.warning(
                "handler failed (%s); retrying in %.1fs",
                decision.error,
                decision.delay,
                exc_info=outcome.error,
            )
        elif decision.action is Action.FAIL:
            ilog.error(
                "handler failed for good: %s (%s)",
                decision.reason,
                decision.error,
                exc_info=outcome.error,
            )
        if outcome.error is not None and reason is not None:
            ilog.info("after the cancel the handler raised %r; ignored", outcome.error)

    async def _write(
        self,
        item: WorkItem,
        decision: Decision,
        give_up_at: float,
        ilog: logging.LoggerAdapter[Any],
    ) -> AttemptOutcome:
        """Make the decided write, retrying through short outages; say what became of
        it: the action's outcome, FENCED_OUT or WRITE_FAILED.

        Gives up rather than retry at or after `give_up_at`, the attempt's self-stop
        deadline: from then on the item belongs to lease recovery, and the write would
        be fenced out anyway.
        """
        backoff = Backoff(initial=0.2, maximum=2.0)
        refusals = 0
        while True:
            try:
                applied = await self._apply(item, decision)
            except StoreError as exc:
                if not isinstance(exc, DatabaseUnavailable):
                    # The database refused the write itself: once more as it was, then
                    # in smaller forms, never left to become a stall.
                    refusals += 1
                    smaller = decision if refusals == 1 else reduced(decision)
                    if smaller is not None:
                        ilog.warning(
                            "the database refused %s (%s); %s",
                            decision.action.value,
                            exc,
                            "trying again" if smaller is decision else "recording it reduced",
                        )
                        decision = smaller
                        continue
                delay = backoff.next()
                if too_late(trio.current_time(), delay, give_up_at):
                    ilog.error(
                        "could not record %s (%s); lease recovery will requeue the item",
                        decision.action.value,
                        exc,
                    )
                    return AttemptOutcome.WRITE_FAILED
                ilog.warning("could not record %s (%s); retrying", decision.action.value, exc)
                await trio.sleep(delay)
                continue
            if applied:
                done = AttemptOutcome.of(decision.action)
                self._observe(done.value, item.kind)
                return done
            ilog.warning("%s was fenced out: the attempt had lost the item", decision.action.value)
            self._observe(AttemptOutcome.LOST.value, item.kind)
            return AttemptOutcome.FENCED_OUT

    async def _apply(self, item: WorkItem, decision: Decision) -> bool:
        store, id, attempt = self.store, item.id, item.attempt
        match decision.action:
            case Action.COMPLETE:
                return await self.complete(id, attempt)
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


def too_late(now: float, delay: float, give_up_at: float) -> bool:
    """Whether a write retried `delay` seconds from `now` would come at or after
    `give_up_at` (so the write gives up instead)."""
    return now + delay >= give_up_at


def unless_cancelled(exc: BaseException) -> BaseException | None:
    """What of `exc` is not Trio's cancellation (None: all of it is)."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)[1]
    return None if isinstance(exc, trio.Cancelled) else exc


def nothing_written(
    reason: CancelReason | None, outcome: Outcome, completed: bool
) -> AttemptOutcome:
    """Why an attempt wrote nothing: SUCCEEDED_IN_TRANSACTION, SELF_STOPPED,
    DATABASE_LOST or LOST."""
    if completed:
        return AttemptOutcome.SUCCEEDED_IN_TRANSACTION
    if reason is CancelReason.SELF_STOP:
        return AttemptOutcome.SELF_STOPPED
    if reason is None and outcome.database_lost:
        return AttemptOutcome.DATABASE_LOST
    return AttemptOutcome.LOST
