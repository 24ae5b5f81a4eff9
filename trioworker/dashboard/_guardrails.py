"""An ASGI middleware for every request: the Host and query string checks, and the
security headers on every response."""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trioworker.dashboard._security import host_allowed

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


def query_problem(query: bytes) -> str | None:
    """Why a query string cannot be read as text (None: it can). Each value must be
    UTF-8 once percent-decoded, without NUL: what a page or the database would read
    otherwise is not what was sent (U+FFFD in its place, or a refusal)."""
    try:
        text = query.decode("ascii")  # a browser percent-encodes everything else
        fields = parse_qsl(text, keep_blank_values=True, errors="strict")
    except ValueError:  # UnicodeDecodeError is one
        return "the query string is not percent-encoded UTF-8"
    if any("\x00" in name or "\x00" in value for name, value in fields):
        return "a query value holds a NUL"
    return None


class Guardrails:
    """Refuses a request whose Host does not name the dashboard (a loopback name or
    address, or one of `allowed_hosts`) or whose query string cannot be read, and adds
    the security headers (and `Cache-Control: no-store` unless set) to every answer."""

    def __init__(self, app: ASGIApp, allowed_hosts: frozenset[str]) -> None:
        self.app = app
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        if not host_allowed(host, self.allowed_hosts):
            await _refuse(send, f"unexpected Host {host[:100]!r}: this dashboard answers on"
                          " its own address only")  # fmt: skip
            return
        problem = query_problem(scope.get("query_string", b""))
        if problem is not None:
            await _refuse(send, f"bad request: {problem}")
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
    body = f"{why}\n".encode()
    await send({
        "type": "http.response.start",
        "status": 400,
        "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()), *HEADERS],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})
