"""The media library: storage configs are folders on disk, and their work runs on
trioworker, one item per config at a time.

    python -m trioworker run --app trioworker.media:registry ...

Handlers find PostgreSQL through $TRIOWORKER_MEDIA_DSN, else $TRIOWORKER_DSN (so a
Worker started with the DSN in its environment shares it), and everything else through
the storage config's row: its originals folder and its proxy folder. See
`trioworker.media._handlers` for what each kind does and why Purge needs the rule.
"""

from .. import Registry
from ._db import DSN_ENV, AttemptLost, media_dsn
from ._files import PROXY_KINDS, proxy_dir
from ._handlers import HANDLERS, register
from ._library import Audit, Library, MissingProxies
from ._observer import OBSERVER_ENV, Span, overlaps, read_spans
from ._plan import Burst, group_bursts
from ._sample import make_originals, make_orphan_proxies

#: Every media kind, ready for `--app trioworker.media:registry`.
registry = Registry()
register(registry)

__all__ = [
    "DSN_ENV",
    "HANDLERS",
    "OBSERVER_ENV",
    "PROXY_KINDS",
    "AttemptLost",
    "Audit",
    "Burst",
    "Library",
    "MissingProxies",
    "Span",
    "group_bursts",
    "make_originals",
    "make_orphan_proxies",
    "media_dsn",
    "overlaps",
    "proxy_dir",
    "read_spans",
    "register",
    "registry",
]
