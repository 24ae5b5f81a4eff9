"""`AsyncioLoop`: asyncio-only code run from Trio tasks on a trio-asyncio loop that is
opened on first use, in the nursery it is given, and closed with it. Real time: the
loop does real I/O (a socket), which the autojump clock would race."""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys

import pytest
import trio
import trio.testing

from trioworker._worker.asyncio_loop import AsyncioLoop


async def echo_once(stream: trio.SocketStream) -> None:
    async with stream:
        await stream.send_all(b"echo: " + await stream.receive_some())


async def ask(port: int, question: bytes) -> bytes:
    """An asyncio-only client: asyncio's own streams need asyncio's running loop."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(question)
    await writer.drain()
    answer = await reader.read(100)
    writer.close()
    await writer.wait_closed()
    return answer


async def produce_and_consume(n: int) -> list[int]:
    """asyncio tasks, a queue and sleeps: what an asyncio SDK does inside."""
    queue: asyncio.Queue[int] = asyncio.Queue()

    async def produce() -> None:
        for i in range(n):
            await asyncio.sleep(0.001)
            await queue.put(i)

    task = asyncio.create_task(produce())
    got = [await queue.get() for _ in range(n)]
    await task
    return got


async def running_loop() -> asyncio.AbstractEventLoop:
    await asyncio.sleep(0.01)
    return asyncio.get_running_loop()


async def test_an_asyncio_client_talks_to_a_trio_server() -> None:
    """asyncio.open_connection, run from a Trio task, reaches a Trio listener."""
    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, echo_once, 0, host="127.0.0.1")
        [listener] = await nursery.start(serve)
        aio = AsyncioLoop(nursery)
        port = listener.socket.getsockname()[1]
        assert await aio.run(ask, port, b"hello") == b"echo: hello"
        aio.close()
        nursery.cancel_scope.cancel()


async def test_asyncio_tasks_queues_and_sleeps_run() -> None:
    async with trio.open_nursery() as nursery:
        aio = AsyncioLoop(nursery)
        assert await aio.run(produce_and_consume, 5) == [0, 1, 2, 3, 4]
        aio.close()


async def test_the_loop_opens_on_first_use_only_once() -> None:
    """Nothing runs in the nursery until the first call; concurrent first calls share
    one loop, which later calls use too."""
    loops: list[asyncio.AbstractEventLoop] = []
    async with trio.open_nursery() as nursery:
        aio = AsyncioLoop(nursery)
        await trio.testing.wait_all_tasks_blocked()
        assert not aio.is_open and nursery.child_tasks == frozenset()

        async def call() -> None:
            loops.append(await aio.run(running_loop))

        async with trio.open_nursery() as callers:
            for _ in range(3):
                callers.start_soon(call)
        await call()
        assert aio.is_open and len(nursery.child_tasks) == 1
        aio.close()
    assert len(loops) == 4 and len(set(map(id, loops))) == 1
    assert not aio.is_open


async def test_an_error_comes_out_as_itself() -> None:
    async def refuse(text: str) -> None:
        await asyncio.sleep(0)
        raise ValueError(text)

    async with trio.open_nursery() as nursery:
        aio = AsyncioLoop(nursery)
        with pytest.raises(ValueError, match=r"^no$"):
            await aio.run(refuse, "no")
        aio.close()


async def test_a_trio_cancel_cancels_the_asyncio_task() -> None:
    """The caller's cancel scope (a self-stop, say) cancels the asyncio side, whose
    cleanup runs before the call returns."""
    seen: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async with trio.open_nursery() as nursery:
        aio = AsyncioLoop(nursery)
        with trio.move_on_after(0.2) as scope:
            await aio.run(forever)
        assert scope.cancelled_caught and seen == ["cancelled"]
        assert await aio.run(produce_and_consume, 1) == [0]  # the loop goes on
        aio.close()


async def test_close_ends_the_loop_and_later_calls_are_refused() -> None:
    async with trio.open_nursery() as nursery:
        aio = AsyncioLoop(nursery)
        await aio.run(running_loop)
        aio.close()
    # The nursery ended: its loop task returned.
    assert not aio.is_open
    with pytest.raises(RuntimeError, match="closed"):
        await aio.run(running_loop)


async def test_closed_before_first_use_it_never_opens() -> None:
    async with trio.open_nursery() as nursery:
        aio = AsyncioLoop(nursery)
        aio.close()
        with pytest.raises(RuntimeError, match="closed"):
            await aio.run(running_loop)
        assert nursery.child_tasks == frozenset()


def test_importing_it_does_not_import_trio_asyncio() -> None:
    """trio-asyncio replaces asyncio's loop policy when imported: only the first call
    imports it, so an asyncio application in the same process keeps its own loop."""
    done = subprocess.run(
        [sys.executable, "-c",
         "import sys, trioworker._worker.asyncio_loop\n"
         "print('trio_asyncio' in sys.modules)"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


async def test_a_handler_calls_an_asyncio_library_through_its_context() -> None:
    """`ctx.run_asyncio` in a real Worker: a handler's asyncio-only client reaches a
    server and its answer is the handler's; the Worker opens the loop for it."""
    from tests.support.fakes import running
    from trioworker import Context, Registry, Status, WorkItem
    from trioworker.testing import MemoryStore

    store, registry = MemoryStore(), Registry()
    answers: list[bytes] = []

    @registry.handler("Ask")
    async def ask_it(item: WorkItem, ctx: Context) -> None:
        answers.append(await ctx.run_asyncio(ask, item.payload["port"], b"hello"))

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, echo_once, 0, host="127.0.0.1")
        [listener] = await nursery.start(serve)
        port = listener.socket.getsockname()[1]
        async with running(store, registry) as worker:
            item = await store.enqueue("Ask", payload={"port": port})
            with trio.fail_after(10):
                while (state := await store.get_item(item.id)) and not state.status.is_terminal:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            assert worker.executor._shared.asyncio_loop is not None
        nursery.cancel_scope.cancel()
    assert answers == [b"echo: hello"]
    assert state.status is Status.SUCCEEDED
