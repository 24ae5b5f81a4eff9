"""Whatever a handler raises is data (issue 31, defect 5), on Trio's virtual clock:
Hypothesis builds hostile exceptions (a `__str__` or `__repr__` raising KeyboardInterrupt,
SystemExit, a bare BaseException or a forged trio.Cancelled; Trio's Cancelled itself,
alone or in a group; groups nested past the recursion limit, listing themselves, or
whose `exceptions` raise; a class whose metaclass has no name; texts of a million
characters) and a handler raises one while running, after a cancel request or after
completing its item. The Worker goes on: the item ends as its policy says, with a
storable error, and the next item completes.

The recipes are plain data (Hypothesis prints them when a case fails); each exception
is built inside the run, since pytest and Hypothesis themselves would trip on them.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.fakes import Failstops, ScriptedStore, running
from trioworker import Context, Registry, RetryPolicy, Status, WorkItem

RAISED = ["KeyboardInterrupt", "SystemExit", "BaseException", "GeneratorExit", "Cancelled",
          "RecursionError", "ValueError"]  # fmt: skip
LEAF = st.one_of(
    st.tuples(st.just("plain"), st.sampled_from(RAISED), st.text(max_size=20)),
    st.tuples(st.just("str raises"), st.sampled_from(RAISED)),
    st.tuples(st.just("repr raises"), st.sampled_from(RAISED)),
    st.tuples(st.just("str and repr raise"), st.sampled_from(RAISED)),
    st.tuples(st.just("nameless")),
    st.tuples(st.just("huge"), st.integers(10_000, 1_000_000)),
    st.tuples(st.just("exceptions raise"), st.sampled_from(RAISED)),
    st.tuples(st.just("lists itself")),
    st.tuples(st.just("hostile notes"), st.sampled_from(RAISED)),
    st.tuples(st.just("cyclic context")),
)
RECIPE = st.recursive(
    LEAF,
    lambda inner: st.one_of(
        st.tuples(st.just("group"), st.lists(inner, min_size=1, max_size=3)),
        st.tuples(st.just("deep"), st.integers(1, 3_000), inner),
    ),
    max_leaves=6,
)
WHEN = st.sampled_from(["running", "after a cancel request", "after completing"])


def forged_cancelled() -> trio.Cancelled:
    """A real trio.Cancelled, caught from a scope of its own: raised again later it is
    no cancellation of anything."""

    async def catch() -> trio.Cancelled:
        with trio.CancelScope() as scope:
            scope.cancel()
            try:
                await trio.lowlevel.checkpoint()
            except trio.Cancelled as exc:
                return exc
        raise AssertionError("not cancelled")

    return trio.run(catch)


FORGED = forged_cancelled()


def make(name: str) -> BaseException:
    if name == "Cancelled":
        return FORGED
    made: BaseException = {
        "KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit,
        "BaseException": BaseException, "GeneratorExit": GeneratorExit,
        "RecursionError": RecursionError, "ValueError": ValueError,
    }[name]()  # fmt: skip
    return made


class Nameless(type):
    @property
    def __name__(cls) -> str:  # type: ignore[override]
        raise KeyboardInterrupt


def build(recipe: Any) -> BaseException:  # noqa: PLR0911, PLR0912  a case a kind
    """The exception a recipe describes."""
    what = recipe[0]
    if what == "plain":
        error = make(recipe[1])
        error.args = (recipe[2],) if recipe[1] != "Cancelled" else error.args
        return error
    if what in ("str raises", "repr raises", "str and repr raise"):
        raised = recipe[1]
        methods: dict[str, Any] = {}
        if what != "repr raises":
            methods["__str__"] = lambda self: (_ for _ in ()).throw(make(raised))
        if what != "str raises":
            methods["__repr__"] = lambda self: (_ for _ in ()).throw(make(raised))
        return type("Hostile", (Exception,), methods)()
    if what == "nameless":
        return Nameless("NoName", (Exception,), {})("x")
    if what == "huge":
        return ValueError("x" * recipe[1])
    if what == "exceptions raise":
        raised = recipe[1]

        class Broken(ExceptionGroup):  # type: ignore[type-arg]
            @property
            def exceptions(self) -> Any:  # type: ignore[override]
                raise make(raised)

        return Broken("broken", [ValueError("inside")])
    if what == "lists itself":

        class Itself(ExceptionGroup):  # type: ignore[type-arg]
            @property
            def exceptions(self) -> Any:  # type: ignore[override]
                return (self, self)

        return Itself("itself", [ValueError("inside")])
    if what == "hostile notes":
        raised = recipe[1]

        class Noted(Exception):
            @property
            def __notes__(self) -> Any:
                raise make(raised)

        return Noted("noted")
    if what == "cyclic context":
        first, second = ValueError("first"), ValueError("second")
        first.__context__, second.__context__ = second, first
        return first
    if what == "group":
        return BaseExceptionGroup("group", [build(child) for child in recipe[1]])
    if what == "deep":
        error = build(recipe[2])
        for _ in range(recipe[1]):
            error = BaseExceptionGroup("deeper", [error])
        return error
    raise AssertionError(recipe)


async def scenario(recipe: Any, when: str) -> tuple[Status, str | None, Status, list[str]]:
    store, registry, failstops = ScriptedStore(), Registry(), Failstops()

    @registry.handler("Hostile", retry=RetryPolicy(max_attempts=1))
    async def hostile(item: WorkItem, ctx: Context) -> None:
        if when == "after completing":
            async with ctx.transaction() as tx:
                tx.complete()
        if when == "after a cancel request":
            try:
                await trio.sleep_forever()
            finally:
                raise build(recipe)
        raise build(recipe)

    @registry.handler("Innocent")
    async def innocent(item: WorkItem, ctx: Context) -> None:
        await trio.sleep(1)

    with trio.fail_after(1000):
        async with running(store, registry, fail_stop=failstops):
            bad = await store.enqueue("Hostile", scope="s")
            if when == "after a cancel request":
                await store.cancel(bad.id)
            await trio.sleep(15)  # the cancel request is read at 10 s
            good = await store.enqueue("Innocent", scope="s")
            await trio.sleep(5)
    hostile_state, innocent_state = await store.get_item(bad.id), await store.get_item(good.id)
    assert hostile_state is not None and innocent_state is not None
    return hostile_state.status, hostile_state.error, innocent_state.status, failstops.calls


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recipe=RECIPE, when=WHEN)
def test_whatever_a_handler_raises_the_worker_goes_on(recipe: Any, when: str) -> None:
    status, error, next_item, failstops = trio.run(
        scenario, recipe, when, clock=trio.testing.MockClock(autojump_threshold=0)
    )
    expected = {
        "running": Status.FAILED,
        "after a cancel request": Status.CANCELLED,
        "after completing": Status.SUCCEEDED,
    }[when]
    assert status is expected
    if expected is Status.FAILED:
        assert type(error) is str and 0 < len(error) <= 4096
    assert next_item is Status.SUCCEEDED
    assert failstops == []
