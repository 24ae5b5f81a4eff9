"""The media library: storage configs are folders on disk, and their work runs on
trioworker, one item per config at a time.

    python -m trioworker run --app trioworker.media:registry ...

Handlers reach PostgreSQL through the Worker (`ctx.transaction()`, fenced by the
attempt) and everything else through the storage config's row: its originals folder
and its proxy folder. Its tables come from its own migrations (`python -m trioworker
migrate --app trioworker.media:registry`). See `trioworker.media._handlers` for what
each kind does and why Purge needs the rule.
"""

from pathlib import Path

from trioworker import Registry
from trioworker.media._files import PROXY_KINDS, proxy_dir
from trioworker.media._handlers import HANDLERS, register
from trioworker.media._library import Audit, Library, MissingProxies
from trioworker.media._observer import OBSERVER_ENV, Span, overlaps, read_spans
from trioworker.media._plan import Burst, group_bursts
from trioworker.media._sample import make_originals, make_orphan_proxies

#: Every media kind, ready for `--app trioworker.media:registry`; its tables come from
#: its own migrations (`python -m trioworker migrate --app trioworker.media:registry`).
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
