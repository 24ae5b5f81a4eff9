"""An ASGI middleware for every response: the Host check and the security headers."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._security import host_name

#: Pages load only the dashboard's own script and stylesheet; nothing may frame them.
HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
     b" connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]  # fmt: skip


class Guardrails:
    """Refuses a request whose Host is not one of `allowed_hosts` (None: any), and adds
    the security headers (and `Cache-Control: no-store` unless set) to every answer."""

    def __init__(self, app: ASGIApp, allowed_hosts: frozenset[str] | None) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.allowed_hosts is not None:
            host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host_name(host) not in self.allowed_hosts:
                await _refuse(send, f"unexpected Host {host[:100]!r}")
                return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                headers += [(n, v) for n, v in HEADERS if n not in names]
                if b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _refuse(send: Send, why: str) -> None:
    body = f"{why}: this dashboard answers on its own address only\n".encode()
    await send({
        "type": "http.response.start",
        "status": 400,
        "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()), *HEADERS],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})
