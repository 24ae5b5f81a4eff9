"""The web dashboard: `python -m trioworker dashboard` (docs/dashboard.md).

A Starlette app served by Hypercorn's Trio worker, reading through a PostgresStore.
Read-only unless started with actions allowed, which then need the operator's token.
Needs the dashboard extra (Starlette, Hypercorn, Jinja2).
"""

try:
    import hypercorn  # noqa: F401
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover  (the test environment has the extra)
    raise ImportError(
        "the dashboard needs its extra: pip install starlette hypercorn jinja2"
        f" (or install trioworker with [dashboard]) ({exc})"
    ) from exc

from trioworker._core.public import public_names as _public_names
from trioworker.dashboard._server import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    TOKEN_ENV,
    check_settings,
    create_app,
    read_token,
    serve,
)

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "TOKEN_ENV",
    "check_settings",
    "create_app",
    "read_token",
    "serve",
]

_public_names(__name__, globals(), __all__)
