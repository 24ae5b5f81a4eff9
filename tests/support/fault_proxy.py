"""A TCP proxy in Trio that can blackhole a link without closing its sockets.

`blackhole()` stops forwarding in both directions and holds new connections unanswered,
as a network partition does: nothing is closed or reset, bytes wait in the kernel.
`heal()` lets them flow again. `reset()` closes every connection at once.
`ProxyThread` runs one in a thread of its own, for tests that are not async.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import trio


class FaultProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._flowing = trio.Event()
        self._flowing.set()
        self._connections: set[trio.CancelScope] = set()
        self.blackholed = False

    def blackhole(self) -> None:
        self.blackholed = True
        self._flowing = trio.Event()

    def heal(self) -> None:
        self.blackholed = False
        self._flowing.set()

    def reset(self) -> None:
        for scope in list(self._connections):
            scope.cancel()

    async def _gate(self) -> None:
        while not self._flowing.is_set():
            await self._flowing.wait()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._handle, listeners)
            task_status.started(self.port)

    async def _handle(self, client: trio.SocketStream) -> None:
        with trio.CancelScope() as scope:
            self._connections.add(scope)
            try:
                async with client:
                    await self._gate()
                    try:
                        upstream = await trio.open_tcp_stream(*self.target)
                    except OSError:
                        return  # the server is down: the client sees its connection close
                    async with upstream, trio.open_nursery() as nursery:
                        nursery.start_soon(self._pump, client, upstream, nursery.cancel_scope)
                        nursery.start_soon(self._pump, upstream, client, nursery.cancel_scope)
            finally:
                self._connections.discard(scope)

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope
    ) -> None:
        """Copy one direction until either side hangs up, then end the connection."""
        try:
            while True:
                await self._gate()
                data = await source.receive_some(65536)
                if not data:
                    return
                await self._gate()
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            done.cancel()

    def dsn(self, base_dsn: str) -> str:
        """`base_dsn`, pointed at the proxy."""
        import psycopg.conninfo

        params = psycopg.conninfo.conninfo_to_dict(base_dsn)
        params.update(host="127.0.0.1", port=str(self.port))
        return psycopg.conninfo.make_conninfo(**params)


class ProxyThread:
    """A FaultProxy running in a Trio loop of its own, controlled from this thread."""

    def __init__(self, host: str, port: int) -> None:
        self.proxy = FaultProxy(host, port)
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.proxy.run)
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def _call(self, fn: Callable[[], None]) -> None:
        trio.from_thread.run_sync(fn, trio_token=self._token)

    def blackhole(self) -> None:
        self._call(self.proxy.blackhole)

    def heal(self) -> None:
        self._call(self.proxy.heal)

    def close(self) -> None:
        assert self._stop is not None
        self._call(self._stop.set)
        self._thread.join(10)
