"""The dashboard's Starlette app: its pages, their live fragments, sign-in and actions.

Every page is one snapshot read (`_views`) laid out by a Jinja template; requested
with the `X-Trioworker-Fragment: 1` header, a page answers with just its live part,
which static/dashboard.js fetches every two seconds and swaps in.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
import trio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from trioworker._core.errors import DatabaseUnavailable, InvalidWorkItem, SchemaNotReady, StoreError
from trioworker._postgres.store import PostgresStore
from trioworker.dashboard import _views
from trioworker.dashboard._actions import ACTIONS, ASCII_NUMBER, Form, Outcome, Refused
from trioworker.dashboard._format import FILTERS, finalize
from trioworker.dashboard._guardrails import Guardrails
from trioworker.dashboard._reader import Reader
from trioworker.dashboard._security import SESSION_SECONDS, Guard, same_origin

log = logging.getLogger("trioworker.dashboard")

FRAGMENT_HEADER = "x-trioworker-fragment"
#: How often the pages refresh their live part, in milliseconds.
REFRESH_MS = 2000
MAX_FORM_BYTES = 64 * 1024
MAX_SEARCH = 200
#: A wrong token, signing in or as a Bearer header, costs this long; tokens are checked
#: one at a time (the wait included), so guessing in parallel gains nothing.
WRONG_TOKEN_DELAY = 1.0
#: Past this many token checks waiting their turn, another is answered 429 at once.
MAX_WAITING_CHECKS = 16
STATIC = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}
NAV = [
    ("/", "Overview"), ("/running", "Running"), ("/scopes", "Scopes"),
    ("/failures", "Failures"), ("/workers", "Workers"), ("/schedules", "Schedules"),
    ("/pauses", "Pauses"),
]  # fmt: skip

Page = Callable[[Request], Awaitable[dict[str, Any] | None]]


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("trioworker.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=finalize,  # every value written visibly: _format's docstring
    )
    env.filters.update(FILTERS)
    return env


def _static() -> dict[str, bytes]:
    folder = resources.files("trioworker.dashboard").joinpath("static")
    return {name: folder.joinpath(name).read_bytes() for name in STATIC}


#: A path of this dashboard as a browser reads it, whatever it would first strip or
#: turn around: printable ASCII only (a browser drops tabs and line breaks from a URL,
#: so `/\t/host` is `//host`, and reads `\` as `/`), starting with one `/`.
_SAME_ORIGIN_PATH = re.compile(r"/(?![/\\])[\x21-\x5b\x5d-\x7e]*")


def safe_next(value: str | None, default: str = "/") -> str:
    """A path on this dashboard to go back to, or `default`: never another site's."""
    if not value or not _SAME_ORIGIN_PATH.fullmatch(value):
        return default
    return value


class Dashboard:
    """The app and what it holds: the store, the guard, templates and static files."""

    def __init__(self, store: PostgresStore, *, allow_actions: bool, guard: Guard,
                 allowed_hosts: frozenset[str]) -> None:  # fmt: skip
        self.store = store
        self.reader = Reader(store)
        self.allow_actions = allow_actions
        self.guard = guard
        self.token_turn = trio.Lock()  # one token check at a time, wrong ones' wait included
        self.waiting_checks = 0
        self.templates = _environment()
        self.static = _static()
        pages: list[tuple[str, str, Page]] = [
            ("/", "overview", lambda r: _views.overview(self.reader)),
            ("/running", "running", lambda r: _views.running(self.reader)),
            ("/scopes", "scopes", lambda r: _views.scopes(self.reader, _search(r))),
            ("/failures", "failures", self._failures),
            ("/items/{id:int}", "item", lambda r: _views.item(self.reader, r.path_params["id"])),
            ("/workers", "workers", lambda r: _views.workers(self.reader)),
            ("/schedules", "schedules", lambda r: _views.schedules(self.reader)),
            ("/pauses", "pauses", lambda r: _views.pauses(self.reader)),
        ]
        routes = [Route(path, self._page(name, read), name=name) for path, name, read in pages]
        routes += [
            Route("/items", self.find_item),
            Route("/static/{name}", self.static_file),
            Route("/healthz", self.healthz),
            Route("/login", self.login, methods=["GET", "POST"]),
            Route("/logout", self.logout, methods=["POST"]),
            Route("/actions/{action}", self.act, methods=["POST"]),
        ]
        self.app = Starlette(
            routes=routes,
            middleware=[Middleware(Guardrails, allowed_hosts=allowed_hosts)],
            exception_handlers={StoreError: self.store_error, Refused: self.refused},
        )

    # -- pages ------------------------------------------------------------------------

    def _page(self, name: str, read: Page) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            begun = time.perf_counter()
            data = await read(request)
            read_ms = (time.perf_counter() - begun) * 1000
            if data is None:
                return self.render(request, "missing", {"what": request.url.path}, status=404)
            response = self.render(request, name, data)
            total_ms = (time.perf_counter() - begun) * 1000
            response.headers["Server-Timing"] = f"db;dur={read_ms:.1f}, total;dur={total_ms:.1f}"
            return response

        return endpoint

    async def _failures(self, request: Request) -> dict[str, Any]:
        kind = request.query_params.get("kind") or None
        if kind is not None and len(kind) > MAX_SEARCH:
            raise Refused(400, "kind is too long")
        offset = request.query_params.get("offset") or "0"
        if not ASCII_NUMBER.fullmatch(offset):
            raise Refused(400, f"offset must be a whole number, not {offset[:40]!r}")
        return await _views.failures(self.reader, kind, min(int(offset), 10**7))

    def render(self, request: Request, name: str, data: dict[str, Any], status: int = 200
               ) -> HTMLResponse:  # fmt: skip
        fragment = request.headers.get(FRAGMENT_HEADER) == "1"
        session = self.session(request)
        context = {
            **data,
            "page": name,
            "path": request.url.path,
            "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            "nav": NAV,
            "actions": self.allow_actions and session is not None,
            "allow_actions": self.allow_actions,
            "csrf": self.guard.csrf_token(session) if session else "",
            "refresh_ms": REFRESH_MS,
            "qs": urlencode,
        }
        template = f"_{name}.html" if fragment else f"{name}.html"
        html = self.templates.get_template(template).render(context)
        return HTMLResponse(html, status_code=status, headers={"Vary": "X-Trioworker-Fragment"})

    async def find_item(self, request: Request) -> Response:
        text = request.query_params.get("id", "").strip().lstrip("#")
        if not ASCII_NUMBER.fullmatch(text) or not 1 <= int(text) <= 2**63 - 1:
            return self.render(request, "missing", {"what": f"item {text[:40]!r}"}, status=404)
        return RedirectResponse(f"/items/{int(text)}", status_code=303)

    async def static_file(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in self.static:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(self.static[name], media_type=STATIC[name],
                        headers={"Cache-Control": "max-age=300"})  # fmt: skip

    async def healthz(self, request: Request) -> Response:
        await self.reader.snapshot(clock={})
        return Response("ok\n", media_type="text/plain")

    async def refused(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Refused)
        return self.render(request, "missing", {"what": exc.message}, status=exc.status)

    async def store_error(self, request: Request, exc: Exception) -> Response:
        log.warning("dashboard: %s", exc)
        if request.url.path.startswith("/actions/") or _wants_json(request):
            return JSONResponse({"ok": False, "message": str(exc)}, status_code=503)
        return self.render(request, "unavailable", {"error": str(exc)}, status=503)

    # -- who may act ------------------------------------------------------------------

    def cookie_name(self, request: Request) -> str:
        # Cookies are per host, not per port: two dashboards on one machine keep theirs
        # apart by the port each listens on.
        server = request.scope.get("server") or ("", 0)
        return f"trioworker_dashboard_{server[1]}"

    def session(self, request: Request) -> str | None:
        """The request's valid session cookie, if it has one (and actions are on)."""
        if not self.allow_actions:
            return None
        value = request.cookies.get(self.cookie_name(request))
        return value if self.guard.session_valid(value) else None

    async def token_matches(self, candidate: str | None, request: Request, how: str) -> bool:
        """Whether `candidate` is the token. Checks take turns, and a wrong one holds
        its turn for WRONG_TOKEN_DELAY: a second per guess, however many are sent at
        once, and the same for a sign-in and a Bearer header."""
        if self.waiting_checks >= MAX_WAITING_CHECKS:
            raise Refused(429, "too many token checks at once: try again later")
        self.waiting_checks += 1
        try:
            async with self.token_turn:
                if self.guard.token_matches(candidate):
                    return True
                log.warning("dashboard: %s with a wrong token from %s", how, _client(request))
                await trio.sleep(WRONG_TOKEN_DELAY)
                return False
        finally:
            self.waiting_checks -= 1

    async def authorize(self, request: Request, form: Form) -> None:
        """Let an action through, or raise Refused (see docs/dashboard.md)."""
        if not self.allow_actions:
            raise Refused(403, "actions are disabled: this dashboard is read-only"
                          " (start it with --allow-actions)")  # fmt: skip
        if not same_origin(request.headers, request.url.scheme):
            raise Refused(403, "refused: the request comes from another site")
        header = request.headers.get("authorization")
        if header is not None:
            scheme, _, credential = header.partition(" ")
            token = credential.strip() if scheme.lower() == "bearer" else None
            if not await self.token_matches(token, request, "a Bearer header"):
                raise Refused(401, "wrong token")
            return  # a header no browser adds by itself: nothing to forge across sites
        session = self.session(request)
        if session is None:
            raise Refused(401, "sign in with the dashboard's token first")
        if not self.guard.csrf_valid(session, _first(form, "csrf")):
            raise Refused(403, "refused: the form's CSRF token is missing or wrong")

    async def login(self, request: Request) -> Response:
        if not self.allow_actions:
            return self.render(request, "login", {"error": "actions are disabled: this"
                               " dashboard is read-only", "next": "/"}, status=403)  # fmt: skip
        if request.method == "GET":
            nxt = safe_next(request.query_params.get("next"))
            return self.render(request, "login", {"error": None, "next": nxt})
        nxt = "/"
        try:
            form = await read_form(request)
            nxt = safe_next(_first(form, "next"))
            if not same_origin(request.headers, request.url.scheme):
                raise Refused(403, "refused: the request comes from another site")
            if not await self.token_matches(_first(form, "token"), request, "a sign-in"):
                raise Refused(401, "wrong token")
        except Refused as refused:
            return self.render(request, "login", {"error": refused.message, "next": nxt},
                               status=refused.status)  # fmt: skip
        log.info("dashboard: signed in from %s", _client(request))
        response = RedirectResponse(nxt, status_code=303)
        response.set_cookie(
            self.cookie_name(request), self.guard.new_session(), max_age=int(SESSION_SECONDS),
            httponly=True, samesite="strict", secure=request.url.scheme == "https",
        )  # fmt: skip
        return response

    async def logout(self, request: Request) -> Response:
        """End the request's session on the server (no copy of its cookie acts again)
        and drop its cookie; like an action, from the dashboard's own page with the
        session's CSRF token."""
        try:
            form = await read_form(request)
            if not same_origin(request.headers, request.url.scheme):
                raise Refused(403, "refused: the request comes from another site")
            session = self.session(request)
            if session is not None:
                if not self.guard.csrf_valid(session, _first(form, "csrf")):
                    raise Refused(403, "refused: the form's CSRF token is missing or wrong")
                self.guard.end_session(session)
                log.info("dashboard: signed out from %s", _client(request))
        except Refused as refused:
            log.warning("dashboard: sign-out refused (%d: %s) for %s", refused.status,
                        refused.message, _client(request))  # fmt: skip
            data = {"message": refused.message, "ok": False, "next": "/"}
            return self.render(request, "outcome", data, status=refused.status)
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(self.cookie_name(request), httponly=True, samesite="strict")
        return response

    # -- actions ----------------------------------------------------------------------

    async def act(self, request: Request) -> Response:
        name = request.path_params["action"]
        try:
            if name not in ACTIONS:
                raise Refused(404, f"no action {name!r}")
            form = await read_form(request)
            await self.authorize(request, form)
            outcome = await _carried_out(ACTIONS[name](self.store, form))
        except Refused as refused:
            log.warning("dashboard: %s refused (%d: %s) for %s", name, refused.status,
                        refused.message, _client(request))  # fmt: skip
            outcome = Outcome(refused.message, refused.status)
            form = {}
        else:
            log.info("dashboard: %s by %s: %s", name, _client(request), outcome.message)
        ok = outcome.status < HTTPStatus.MULTIPLE_CHOICES
        if _wants_json(request):
            body = {"ok": ok, "message": outcome.message, **outcome.details}
            challenge = outcome.status == HTTPStatus.UNAUTHORIZED
            headers = {"WWW-Authenticate": 'Bearer realm="trioworker"'} if challenge else None
            return JSONResponse(body, status_code=outcome.status, headers=headers)
        data = {"message": outcome.message, "ok": ok, "next": safe_next(_first(form, "next"))}
        return self.render(request, "outcome", data, status=outcome.status)


async def _carried_out(action: Awaitable[Outcome]) -> Outcome:
    """The action's outcome; what the database or the queue's rules refused, as a
    Refused with its reason (never an error page with a traceback)."""
    try:
        return await action
    except InvalidWorkItem as exc:
        raise Refused(400, str(exc)) from None
    except DatabaseUnavailable as exc:
        raise Refused(503, f"the database did not answer: {exc}") from None
    except SchemaNotReady as exc:
        raise Refused(503, f"the database is not migrated: {exc}") from None
    except StoreError as exc:
        # The store names the driver's error class in its message; a role without the
        # privilege (the read-only role of docs/roles.md) is the case worth explaining.
        if any(name in str(exc) for name in ("InsufficientPrivilege", "ReadOnlySqlTransaction")):
            raise Refused(403, "the dashboard's database role may not change the queue"
                          f" (a read-only role?): {exc}") from None  # fmt: skip
        raise Refused(500, f"the database refused it: {exc}") from None


async def read_form(request: Request) -> Form:
    """An HTML form's fields (application/x-www-form-urlencoded, 64 KiB at most)."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise Refused(415, "send the fields as application/x-www-form-urlencoded")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise Refused(413, "the form is too large")
    try:  # strict: a value that is not UTF-8 is refused, never read with U+FFFD in it
        return parse_qs(body.decode(), keep_blank_values=True, max_num_fields=2000,
                        errors="strict")  # fmt: skip
    except ValueError:  # UnicodeDecodeError is one
        raise Refused(400, "the form could not be read") from None


def _first(form: Form, field: str) -> str | None:
    values = form.get(field)
    return values[0] if values else None


def _search(request: Request) -> str | None:
    search = request.query_params.get("q", "")  # as typed: `' ws '` finds no `'ws'`
    if len(search) > MAX_SEARCH:
        raise Refused(400, "the search is too long")
    return search or None


def _wants_json(request: Request) -> bool:
    return "application/json" in request.headers.get("accept", "")


def _client(request: Request) -> str:
    return request.client.host if request.client else "?"
