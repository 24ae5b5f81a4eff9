"""Who may act, and from where: the token, sessions, CSRF tokens, Origin and Host.

Pure: no I/O and no framework, so each rule is unit-tested on its own. The model
(docs/dashboard.md): actions exist only with --allow-actions; a request acts only with
the operator's token, either as `Authorization: Bearer TOKEN` (a header no browser sends
by itself, so a page of another site cannot forge it) or through a session cookie from
signing in with the token, in which case the form must also carry the session's CSRF
token and the request must come from the dashboard's own origin. Sessions are kept
here too, so signing out ends one for good, whoever holds a copy of its cookie.
A request names the dashboard in its Host header: a loopback name or address, or one
of the names the operator allowed (DNS rebinding: another site's name is refused).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Mapping

#: A token shorter than this is refused at start: it could be guessed.
MIN_TOKEN_LENGTH = 16
#: How long a sign-in lasts (the process's restart also ends every session).
SESSION_SECONDS = 12 * 3600.0
#: How far ahead of this process's clock a session's issue time may be (a clock step).
CLOCK_SLACK = 60.0
#: The loopback host names (every loopback address is accepted too, however spelled).
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
#: The most sessions kept at once; past it, the oldest ends.
MAX_SESSIONS = 1000
#: IPv4 in the forms inet_aton reads (and so the socket a dashboard binds): 127.1,
#: 0x7f.0.0.1, 2130706433.
_NUMERIC_V4 = re.compile(r"[0-9a-fx.]+")
#: What a host name may hold: DNS labels, an IPv4 or IPv6 address.
_HOST_NAME = re.compile(r"[a-z0-9._:-]+|\[[0-9a-f:.]+\]")


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` as an IP address (IPv4-mapped IPv6 as its IPv4), if it spells one."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        if not _NUMERIC_V4.fullmatch(host.lower()):
            return None
        try:
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine's loopback, however spelled: `localhost`, any
    address of 127.0.0.0/8 (`127.1` too), `::1`, or an IPv4-mapped one of those."""
    if host.lower().removesuffix(".") == "localhost":
        return True
    ip = _address(host)
    return ip is not None and ip.is_loopback


def host_name(header: str) -> str:
    """The name part of a Host header (`[::1]:8080` -> `::1`), lower case, without a
    trailing dot (`Example.COM.` -> `example.com`)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    name = header.rpartition(":")[0] if header.count(":") == 1 else header
    return name.removesuffix(".")


def allowed_host(value: str) -> str:
    """A host name the operator allows in the Host header, as host_name writes it
    (ValueError for what no Host header could name)."""
    name = host_name(value)
    if not name or not _HOST_NAME.fullmatch(name) or not value.isascii():
        raise ValueError(
            f"not a host name: {value!r} (give a name such as queue.example.com, or an"
            " address; an international name in its xn-- form)"
        )
    return name


def allowed_hosts(values: Iterable[str]) -> frozenset[str]:
    return frozenset(allowed_host(v) for v in values)


def host_allowed(header: str, allowed: frozenset[str]) -> bool:
    """Whether a Host header names this dashboard: a loopback name or address, or one
    of `allowed` (as allowed_hosts writes them)."""
    name = host_name(header)
    return name in allowed or is_loopback(name)


class Guard:
    """The dashboard's secrets: the operator's token, and a random key of this process
    that signs session cookies and derives their CSRF tokens."""

    def __init__(
        self,
        token: str | None,
        *,
        key: bytes | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)
        self._token = self._mac("token", token) if token else None
        self._clock = clock
        self._sessions: dict[str, None] = {}  # the live ones, oldest first

    def _mac(self, purpose: str, value: str) -> bytes:
        return hmac.new(self._key, f"{purpose}\0{value}".encode(), hashlib.sha256).digest()

    def token_matches(self, candidate: str | None) -> bool:
        """Whether `candidate` is the token (compared as keyed digests of equal length,
        in constant time, so neither its content nor its length leaks)."""
        if self._token is None or not candidate:
            return False
        return hmac.compare_digest(self._mac("token", candidate), self._token)

    def new_session(self) -> str:
        """A session cookie's value: when it was issued, a nonce, and their signature.
        It is valid until it expires or `end_session` ends it."""
        issued = f"{int(self._clock())}.{secrets.token_urlsafe(16)}"
        value = f"{issued}.{self._mac('session', issued).hex()}"
        self._sessions[value] = None
        while len(self._sessions) > MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        return value

    def session_valid(self, value: str | None) -> bool:
        """Whether `value` is a session this process issued, not ended nor expired."""
        if not value or value.count(".") != 2:  # noqa: PLR2004  issued.nonce.mac
            return False
        issued, _, mac = value.rpartition(".")
        if not hmac.compare_digest(self._mac("session", issued).hex(), mac):
            return False
        if value not in self._sessions:  # ended (signed out), or forgotten
            return False
        try:
            age = self._clock() - int(issued.partition(".")[0])
        except ValueError:  # pragma: no cover  (signed by us, so it parses)
            return False
        if age >= SESSION_SECONDS:
            del self._sessions[value]
            return False
        return age >= -CLOCK_SLACK

    def end_session(self, value: str) -> None:
        """Sign `value` out: no copy of its cookie acts again."""
        self._sessions.pop(value, None)

    def csrf_token(self, session: str) -> str:
        """The CSRF token of a session: what its forms carry."""
        return self._mac("csrf", session).hex()

    def csrf_valid(self, session: str, candidate: str | None) -> bool:
        return bool(candidate) and hmac.compare_digest(self.csrf_token(session), str(candidate))


def same_origin(headers: Mapping[str, str], scheme: str) -> bool:
    """Whether a state-changing request comes from the dashboard's own pages (or from
    no browser at all). A browser says where a request comes from in Sec-Fetch-Site
    and Origin; either one naming another site refuses it."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = headers.get("origin")
    if origin is None:
        return True
    host = headers.get("host", "")
    return bool(host) and origin.lower() == f"{scheme}://{host}".lower()
