"""Every psycopg name the Trio store relies on that psycopg does not document.

The Trio store drives psycopg's own protocol generators and waits on their sockets
with Trio (trio_connection.py). psycopg's asyncio and sync connections differ only in
the function that waits (psycopg issue #29 points there for other event loops), but
that seam is not public API: each name below may change in a release, which is why
pyproject.toml bounds psycopg to the versions tested, and why
tests/unit/test_psycopg_internals.py checks each of them by name (run it first after
moving that bound).

Where psycopg's `AsyncConnection` reaches for asyncio, on the paths the store uses, and
what the Trio store does instead:

- `AsyncConnection.wait()`: every statement, transaction, `notifies()` and
  `set_autocommit()` waits through it; psycopg's runs `waiting.wait_async`
  (`asyncio.get_running_loop`, `loop.add_reader`, `asyncio.sleep`) and answers an
  `asyncio.CancelledError` by cancelling on the server and waiting up to 5 s more.
  Overridden: Trio waits on the socket, and a Trio cancel returns at once.
- `AsyncConnection.connect()`: resolves host names with `loop.getaddrinfo`
  (`conninfo_attempts_async`) and waits with `waiting.wait_conn_async`. Overridden:
  `conninfo_attempts` in a worker thread, `_connect_gen` waited on by Trio.
- `AsyncConnection.cancel_safe()`: `waiting.wait_conn_async`, or `asyncio.to_thread`
  with a libpq older than 17. Overridden: `generators.cancel` waited on by Trio, or
  `PGcancel.cancel` in a Trio worker thread.
- `AsyncConnection.lock`, an `asyncio.Lock`: uncontended it never touches a loop, but a
  second task waiting for it needs asyncio's running loop. Replaced (`LOCK`).
- `AsyncConnection.notifies()`: the lock and `wait(timeout=...)`, which ends the
  iteration by raising `WaitTimeout`: both provided, so psycopg's own method is used.
- Not used by the store, and left on asyncio: COPY (`_copy_async`: an asyncio task and
  queue), pipelines, server-side cursors, `AsyncCursor.stream()`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeAlias, TypeVar

import psycopg
import psycopg.conninfo
import psycopg.errors
import psycopg.generators
import psycopg.waiting
from psycopg import pq

# What a protocol generator yields when it would block: the socket must become
# readable (R), writable (W) or either (RW); and what is sent back into it: what the
# socket became (NONE: nothing yet). `psycopg.waiting` (an IntFlag each, from
# `psycopg._enums`).
from psycopg.waiting import Ready, Wait

__all__ = [
    "LOCK", "WAIT_PARAMETERS", "Gen", "GenConn", "Ready", "Wait", "WaitTimeout",
    "cancel_generator", "connect_generator", "conninfo_attempts", "missing",
    "timeout_from_conninfo",
]  # fmt: skip

RV = TypeVar("RV")
#: A protocol generator on a connection's socket (a statement): yields Wait, is sent
#: Ready, returns RV. (psycopg.abc.PQGen, undocumented too.)
Gen: TypeAlias = Generator[Wait, Ready | int, RV]
#: One whose socket may change as it goes (connecting, cancelling): yields (socket,
#: Wait). (psycopg.abc.PQGenConn.)
GenConn: TypeAlias = Generator[tuple[int, Wait], Ready | int, RV]

#: `AsyncConnection.wait(gen, interval, timeout)` raises this when `timeout` expires
#: before `gen` is done; `AsyncConnection.notifies(timeout=...)` ends on it.
WaitTimeout: type[psycopg.OperationalError] = psycopg.errors._WaitTimeout

#: The method every async statement waits through, overridden by TrioConnection with
#: the same parameters.
WAIT_PARAMETERS = ("self", "gen", "interval", "timeout")

#: The attribute of AsyncConnection holding the lock its methods take
#: (`async with self.lock`), set by `AsyncConnection.__init__`.
LOCK = "lock"

#: Connection parameters split into one attempt per host (and per address a host name
#: resolves to), as `AsyncConnection.connect` tries them; blocking DNS.
conninfo_attempts: Callable[[dict[str, Any]], list[dict[str, Any]]] = (
    psycopg.conninfo.conninfo_attempts
)
#: The time bound of each connection attempt (connect_timeout, libpq's rules).
timeout_from_conninfo: Callable[[dict[str, Any]], int] = psycopg.conninfo.timeout_from_conninfo

#: The generator polling a started `PGcancelConn` until the server took the request;
#: it yields (socket, Wait) pairs, as the connect generator does.
cancel_generator: Callable[[pq.abc.PGcancelConn], GenConn[None]] = psycopg.generators.cancel


def connect_generator(
    cls: type[psycopg.AsyncConnection[Any]], conninfo: str
) -> GenConn[psycopg.AsyncConnection[Any]]:
    """The generator connecting one attempt's `conninfo` and making an instance of
    `cls` (a classmethod, `BaseConnection._connect_gen`): yields (socket, Wait)."""
    return cls._connect_gen(conninfo)


def missing() -> list[str]:
    """What of the above this psycopg lacks or has changed, one line each: empty when
    the Trio store can run on it."""
    import inspect

    problems = []
    for name in ("R", "W", "RW"):
        if not hasattr(Wait, name):
            problems.append(f"psycopg.waiting.Wait.{name} is gone")
    for name in ("NONE", "R", "W"):
        if not hasattr(Ready, name):
            problems.append(f"psycopg.waiting.Ready.{name} is gone")
    if not issubclass(WaitTimeout, psycopg.OperationalError):
        problems.append("psycopg.errors._WaitTimeout is no longer an OperationalError")
    wait = getattr(psycopg.AsyncConnection, "wait", None)
    if wait is None or tuple(inspect.signature(wait).parameters) != WAIT_PARAMETERS:
        shown = "gone" if wait is None else f"now {inspect.signature(wait)}"
        problems.append(f"AsyncConnection.wait{WAIT_PARAMETERS[1:]} changed: {shown}")
    if "_WaitTimeout" not in inspect.getsource(psycopg.AsyncConnection.notifies):
        problems.append("AsyncConnection.notifies() no longer ends on _WaitTimeout")
    if f"self.{LOCK} = " not in inspect.getsource(psycopg.AsyncConnection.__init__):
        problems.append(f"AsyncConnection.__init__ no longer sets self.{LOCK}")
    for owner, name, shown in (
        (psycopg.AsyncConnection, "_connect_gen", "psycopg.AsyncConnection._connect_gen"),
        (psycopg.conninfo, "conninfo_attempts", "psycopg.conninfo.conninfo_attempts"),
        (psycopg.conninfo, "timeout_from_conninfo", "psycopg.conninfo.timeout_from_conninfo"),
        (psycopg.generators, "cancel", "psycopg.generators.cancel"),
    ):
        if not callable(getattr(owner, name, None)):
            problems.append(f"{shown} is gone")
    return problems
