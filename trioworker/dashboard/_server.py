"""Serving the dashboard: Hypercorn's Trio worker, on 127.0.0.1 unless told otherwise."""

from __future__ import annotations

import logging
import os
import stat
from functools import partial
from typing import cast

import trio
from hypercorn.config import Config
from hypercorn.trio.run import worker_serve
from hypercorn.typing import ASGIFramework
from hypercorn.utils import wrap_app
from starlette.applications import Starlette

from .._errors import ConfigurationError
from .._postgres import PostgresStore
from ._app import Dashboard
from ._security import LOOPBACK_NAMES, MIN_TOKEN_LENGTH, Guard, is_loopback

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


def check_settings(*, allow_actions: bool, token: str | None) -> None:
    """Refuse, before anything starts, actions without a token or with a short one."""
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


def create_app(
    store: PostgresStore, *, host: str, allow_actions: bool, token: str | None
) -> Starlette:
    """The dashboard for `store` as an ASGI app, as served on `host` (bound to a
    loopback address, it answers only to loopback host names)."""
    check_settings(allow_actions=allow_actions, token=token)
    return Dashboard(
        store,
        allow_actions=allow_actions,
        guard=Guard(token if allow_actions else None),
        allowed_hosts=LOOPBACK_NAMES if is_loopback(host) else None,
    ).app


async def serve(
    store: PostgresStore,
    *,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    allow_actions: bool = False,
    token: str | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the dashboard until cancelled; `task_status.started(url)` once it listens
    (port 0: any free port, which the URL names). Read-only unless `allow_actions`,
    which needs `token` (see `read_token`)."""
    app = create_app(store, host=host, allow_actions=allow_actions, token=token)
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
            if not is_loopback(host):
                log.warning(
                    "the dashboard listens on %s, beyond this machine: anyone who reaches it"
                    " can read the queue; put it behind TLS and access control",
                    host,
                )
            task_status.started(url)
    finally:
        for sock in sockets.insecure_sockets:
            sock.close()
