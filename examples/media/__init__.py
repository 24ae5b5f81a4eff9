"""The media library: storage configs are folders on disk, and their work runs on
trioworker, one item per config at a time.

    python -m trioworker run --app examples.media:registry ...

Handlers reach PostgreSQL through the Worker (`ctx.transaction()`, fenced by the
attempt) and everything else through the storage config's row: its originals folder
and its proxy folder. Its tables come from its own migrations (`python -m trioworker
migrate --app examples.media:registry`). See `examples.media._handlers` for what
each kind does and why Purge needs the rule.
"""

from pathlib import Path

from examples.media._files import PROXY_KINDS, proxy_dir
from examples.media._handlers import HANDLERS, register
from examples.media._library import Audit, Library, MissingProxies
from examples.media._observer import OBSERVER_ENV, Span, overlaps, read_spans
from examples.media._plan import Burst, group_bursts
from examples.media._sample import make_originals, make_orphan_proxies
from trioworker import Registry

#: Every media kind, ready for `--app examples.media:registry`; its tables come from
#: its own migrations (`python -m trioworker migrate --app examples.media:registry`).
registry = Registry(migrations=Path(__file__).parent / "migrations")
register(registry)

__all__ = [
    "HANDLERS",
    "OBSERVER_ENV",
    "PROXY_KINDS",
    "Audit",
    "Burst",
    "Library",
    "MissingProxies",
    "Span",
    "group_bursts",
    "make_originals",
    "make_orphan_proxies",
    "overlaps",
    "proxy_dir",
    "read_spans",
    "register",
    "registry",
]
