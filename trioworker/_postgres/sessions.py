"""How long the server keeps a transaction whose client is gone.

A client host that loses its link and dies sends no FIN and no RST: its backend waits
for the next statement, "idle in transaction", holding its row locks (a fenced
transaction's: the item's, so lease recovery passes over it and the scope stays held),
until the server's own TCP keepalives give up on it: 2 h 11 min with Linux's
defaults. The client's keepalives (connection.py `_LINK_DEFAULTS`) cannot help: they
are the client's, and the client is gone.

So every transaction the store opens sets, in its BEGIN's round trip, how long the
server keeps it once its client is silent (`Bounds`):

- the server's TCP keepalives on its socket (`tcp_keepalives_idle`, `_interval`,
  `_count`) and `tcp_user_timeout`, which give up on a client that answers nothing
  (the same figures as the client's keepalives, so each side gives up on the other
  alike), and `client_connection_check_interval`, which makes a running statement
  notice: a direct connection's backend ends about 11 s after its client's link died,
  whatever it was doing;
- for a fenced transaction, the longest it may legitimately sit idle or run one
  statement (`idle_in_transaction_session_timeout`, `statement_timeout`, and on
  PostgreSQL 17 and later `transaction_timeout`): its attempt's self-stop ends it by
  then (`Settings.fenced_server_timeout`). This bound holds behind PgBouncer too, where
  the server's socket is PgBouncer's and keepalives see nothing.

All are `SET LOCAL`, so none outlives its transaction: nothing leaks to the next client
of a server connection that PgBouncer (transaction pooling) shares. PgBouncer 1.18
refuses the startup parameter `options`, which could have set them for the session.
Single statements on pooled connections hold their locks only while they run and
commit on their own; the sessions between them hold nothing, and are the server's
keepalives' to end (docs/reliability.md, "A vanished host").
"""

from __future__ import annotations

import math
from typing import LiteralString

import attrs
from psycopg import sql

#: A statement setting one server parameter for the transaction; its value a literal.
_SET_LOCAL: LiteralString = "SET LOCAL {} = {}"
_SET_SESSION: LiteralString = "SET SESSION {} = {}"


@attrs.frozen
class Bounds:
    """How long the server keeps a transaction whose client is silent: the keepalives
    and the user timeout in every one, and for a fenced one the longest it may sit idle
    or run one statement (`fenced_within`, seconds; None: unbounded)."""

    #: Seconds of silence before the first keepalive probe, between probes, and probes
    #: unanswered before the server gives up (PostgreSQL's own units: seconds).
    keepalives_idle: int = 5
    keepalives_interval: int = 2
    keepalives_count: int = 3
    #: How long data the server sent may stay unacknowledged (ms): a backend writing to
    #: a vanished client gives up after this, not after 15 minutes of retransmissions.
    #: With keepalives, Linux also ends a probed connection this long after it last
    #: heard from the client.
    user_timeout_ms: int = 10_000
    #: How often a running statement checks that its client is still there (ms).
    check_interval_ms: int = 2_000
    fenced_within: float | None = None

    def fenced(self, within: float) -> Bounds:
        """These bounds for a fenced transaction whose idle times and statements are
        never legitimately longer than `within` seconds."""
        return attrs.evolve(self, fenced_within=within)


#: Every transaction's, unless it is fenced.
LINK = Bounds()


#: The parameters a server knows only from a release on (libpq's number: 120000).
_SINCE = {
    "tcp_user_timeout": 120000,
    "client_connection_check_interval": 140000,
    "transaction_timeout": 170000,
}


def settings(bounds: Bounds, server_version: int) -> tuple[tuple[str, int], ...]:
    """(parameter, value in its own unit) for each of `bounds` that a server of
    `server_version` (libpq's number: 150004) knows."""
    values = [
        ("tcp_keepalives_idle", bounds.keepalives_idle),
        ("tcp_keepalives_interval", bounds.keepalives_interval),
        ("tcp_keepalives_count", bounds.keepalives_count),
        ("tcp_user_timeout", bounds.user_timeout_ms),
        ("client_connection_check_interval", bounds.check_interval_ms),
    ]
    if bounds.fenced_within is not None:
        within = math.ceil(bounds.fenced_within * 1000)
        values += [
            ("idle_in_transaction_session_timeout", within),
            ("statement_timeout", within),
            ("transaction_timeout", within),
        ]
    return tuple(
        (name, v) for name, v in values if name not in _SINCE or server_version >= _SINCE[name]
    )


def set_local(bounds: Bounds, server_version: int) -> sql.Composed:
    """`SET LOCAL` of each of `bounds`' settings, `;`-separated: sent after a BEGIN in
    the same simple query, so they cost no round trip of their own. (Rendering it takes
    about 80 us: connection.py keeps each BEGIN it has rendered.)"""
    return _statements(_SET_LOCAL, bounds, server_version)


def set_session(bounds: Bounds, server_version: int) -> sql.Composed:
    """The same for the whole session: only on a connection known to be a session of
    its own (the listener's, once a notification has reached it), never on one a
    transaction pooler may hand to another client next."""
    return _statements(_SET_SESSION, bounds, server_version)


def _statements(template: LiteralString, bounds: Bounds, server_version: int) -> sql.Composed:
    return sql.SQL("; ").join(
        sql.SQL(template).format(sql.Identifier(name), sql.Literal(value))
        for name, value in settings(bounds, server_version)
    )
