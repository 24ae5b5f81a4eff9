"""Serving the dashboard: Hypercorn's Trio worker, on 127.0.0.1 unless told otherwise."""

from __future__ import annotations

import logging
import os
import socket
import stat
from collections.abc import Collection
from functools import partial
from typing import cast

import trio
from hypercorn.config import Config
from hypercorn.trio.run import worker_serve
from hypercorn.typing import ASGIFramework
from hypercorn.utils import wrap_app
from starlette.applications import Starlette

from trioworker._core.errors import ConfigurationError
from trioworker._postgres.store import PostgresStore
from trioworker.dashboard._app import Dashboard
from trioworker.dashboard._security import MIN_TOKEN_LENGTH, Guard, allowed_hosts, is_loopback

log = logging.getLogger("trioworker.dashboard")

#: Where the token comes from when no --token-file is given.
TOKEN_ENV = "TRIOWORKER_DASHBOARD_TOKEN"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def read_token(token_file: str | None = None) -> str | None:
    """The actions' token: the contents of `token_file` (surrounding whitespace
    stripped), else $TRIOWORKER_DASHBOARD_TOKEN, else None. Never a command-line value:
    other users of the machine see those in `ps`. A file longer than 4 KiB is refused,
    read no further (`--token-file /dev/zero` would be read until memory ran out)."""
    if token_file is None:
        token = os.environ.get(TOKEN_ENV, "").strip()
        return token or None
    most = 4096  # bytes: far more than a token needs
    try:
        with open(token_file, "rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            data = file.read(most + 1)
        if len(data) > most:
            raise ConfigurationError(
                f"--token-file {token_file!r} is longer than {most} bytes: not a token file?"
            )
        token = data.decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read --token-file {token_file!r}: {exc}") from None
    if not token:
        raise ConfigurationError(f"--token-file {token_file!r} is empty")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("the token file %s can be read by other users (chmod 600 it)", token_file)
    return token


def listens_beyond_loopback(host: str) -> bool:
    """Whether a dashboard bound to `host` is reachable from other machines: `host` is
    neither a loopback address however spelled nor a name whose every address is one.
    A name that does not resolve is not (the bind will say it cannot listen there)."""
    if is_loopback(host):
        return False
    if not host.strip():  # the socket binds every address
        return True
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError):
        return False
    return not all(is_loopback(str(info[4][0])) for info in found)


def check_settings(
    *,
    allow_actions: bool,
    token: str | None,
    host: str | None = None,
    allowed_hosts: Collection[str] = (),
) -> None:
    """Refuse, before anything starts, actions without a token or with a short one, a
    bad --allowed-host, and (given `host`) a bind beyond loopback with no allowed host
    names: any site could read the queue through DNS rebinding."""
    try:
        _allowed_names(allowed_hosts)
    except ValueError as exc:
        raise ConfigurationError(f"--allowed-host: {exc}") from None
    if host is not None and not allowed_hosts and listens_beyond_loopback(host):
        raise _beyond_loopback(host)
    if not allow_actions:
        return
    if token is None:
        raise ConfigurationError(
            f"--allow-actions needs a token: set ${TOKEN_ENV} or give --token-file PATH"
        )
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"the dashboard's token is too short: use at least {MIN_TOKEN_LENGTH} characters"
            " (for example: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )


def _beyond_loopback(host: str) -> ConfigurationError:
    return ConfigurationError(
        f"the dashboard would listen on {host!r}, beyond this machine: name the host names"
        " it answers to with --allowed-host NAME (repeat for more), so that no other"
        " site's page can read the queue through it (DNS rebinding)"
    )


def _allowed_names(values: Collection[str]) -> frozenset[str]:
    if isinstance(values, str):  # one name, not its characters
        values = [values]
    return allowed_hosts(values)


def create_app(
    store: PostgresStore,
    *,
    host: str,
    allow_actions: bool,
    token: str | None,
    allowed_hosts: Collection[str] = (),
) -> Starlette:
    """The dashboard for `store` as an ASGI app, as served on `host`: it answers to
    loopback names and addresses, and to `allowed_hosts` (which a `host` beyond
    loopback needs)."""
    check_settings(allow_actions=allow_actions, token=token, host=host, allowed_hosts=allowed_hosts)
    return Dashboard(
        store,
        allow_actions=allow_actions,
        guard=Guard(token if allow_actions else None),
        allowed_hosts=_allowed_names(allowed_hosts),
    ).app


async def serve(
    store: PostgresStore,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    allow_actions: bool = False,
    token: str | None = None,
    allowed_hosts: Collection[str] = (),
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the dashboard until cancelled; `task_status.started(url)` once it listens
    (port 0: any free port, which the URL names). Read-only unless `allow_actions`,
    which needs `token` (see `read_token`). Beyond loopback, `allowed_hosts` names the
    host names it answers to (see `create_app`)."""
    app = create_app(store, host=host, allow_actions=allow_actions, token=token,
                     allowed_hosts=allowed_hosts)  # fmt: skip
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("trioworker.dashboard.http")
    config.graceful_timeout = 2.0
    config.include_server_header = False
    # The sockets are made here, before any task starts, so a port in use or an unknown
    # host is one plain error (hypercorn.trio.serve would raise it from a nursery).
    try:
        sockets = config.create_sockets()
        for sock in sockets.insecure_sockets:
            sock.listen(config.backlog)
    except OSError as exc:
        raise ConfigurationError(
            f"the dashboard cannot listen on {host} port {port}: {exc.strerror or exc}"
        ) from None
    # What the sockets are bound to decides, whatever `host` looked like.
    bound = [str(sock.getsockname()[0]) for sock in sockets.insecure_sockets]
    beyond = not all(is_loopback(address) for address in bound)
    if beyond and not allowed_hosts:
        for sock in sockets.insecure_sockets:
            sock.close()
        raise _beyond_loopback(host)
    # Starlette is an ASGI app; it types its calls with its own (equivalent) aliases.
    asgi = cast("ASGIFramework", app)
    try:
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(
                partial(
                    worker_serve,
                    wrap_app(asgi, config.wsgi_max_body_size, "asgi"),
                    config,
                    sockets=sockets,
                )
            )
            url = binds[0]
            mode = "actions allowed with the token" if allow_actions else "read-only"
            log.info("dashboard listening on %s (%s)", url, mode)
            if beyond:
                log.warning(
                    "the dashboard listens on %s, beyond this machine, answering to %s:"
                    " anyone who reaches it can read the queue; put it behind TLS and"
                    " access control",
                    host,
                    ", ".join(sorted(_allowed_names(allowed_hosts))),
                )
            task_status.started(url)
    finally:
        for sock in sockets.insecure_sockets:
            sock.close()
