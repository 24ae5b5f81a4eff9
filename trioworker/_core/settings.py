"""A Worker's timing and capacity settings, checked together."""

from __future__ import annotations

from typing import Any

import attrs

from trioworker._core.errors import ConfigurationError

#: The environment variable the DSN is read from when `--dsn` is not given.
DSN_ENV = "TRIOWORKER_DSN"

#: How often an operator's quiesce looks at the scope's Running item.
QUIESCE_POLL = 0.1


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ConfigurationError(f"{attribute.name} must be positive, not {value!r}")


@attrs.frozen
class Settings:
    """Defaults: lease 60 s, heartbeat every 10 s, self-stop at 30 s, poll 5 s, 3 stalls."""

    lease: float = attrs.field(default=60.0, validator=_positive)
    heartbeat: float = attrs.field(default=10.0, validator=_positive)
    poll: float = attrs.field(default=5.0, validator=_positive)
    max_stalls: int = attrs.field(default=3, validator=_positive)
    concurrency: int = attrs.field(default=1, validator=_positive)
    #: Parallel file work across the Worker's items (the handler context's limiter).
    max_concurrent_files: int = attrs.field(default=4, validator=_positive)
    #: How long running items may finish after SIGTERM before they are cancelled.
    shutdown_grace: float = attrs.field(default=30.0, validator=_positive)
    #: How long a cancelled handler may take to stop before the process fail-stops.
    #: Default: a quarter lease, so a stopped attempt is gone before its lease expires.
    stop_grace: float = attrs.field(
        default=attrs.Factory(lambda self: self.lease / 4, takes_self=True), validator=_positive
    )
    #: How often this Worker runs lease recovery. Default: a quarter lease.
    recovery_every: float = attrs.field(
        default=attrs.Factory(lambda self: self.lease / 4, takes_self=True), validator=_positive
    )

    def __attrs_post_init__(self) -> None:
        if self.heartbeat >= self.self_stop_after:
            raise ConfigurationError(
                f"heartbeat ({self.heartbeat:g}s) must be shorter than half the lease"
                f" ({self.self_stop_after:g}s), or every attempt would self-stop"
            )
        if self.self_stop_after + self.stop_grace >= self.lease:
            raise ConfigurationError(
                f"stop grace ({self.stop_grace:g}s) must end before the lease does:"
                f" half the lease + grace < lease ({self.lease:g}s)"
            )

    @property
    def self_stop_after(self) -> float:
        """An attempt cancels its own handler this long after its last good heartbeat."""
        return self.lease / 2

    @property
    def fenced_server_timeout(self) -> float:
        """How long the database lets a handler's fenced transaction sit idle, or run one
        statement, before it ends its session (docs/reliability.md, "A vanished host").

        None of an attempt's legitimate waits is longer than the self-stop: while its
        transaction holds the item's row, no heartbeat can renew the attempt, so its
        self-stop deadline, half a lease after a heartbeat sent before the row was
        locked, ends the transaction by then. A quarter of it more is the margin for
        the way the commit takes to the server. Past it, the transaction's client has
        gone without a word (a host lost with its link): the server rolls it back and
        releases the item for lease recovery, rather than holding it for hours.
        """
        return self.self_stop_after * 1.25

    @property
    def kill_margin(self) -> float:
        """How long after a cancelled handler's stop grace the Worker's supervisor kills
        the process (docs/reliability.md, "The fail-stop from outside").

        The Worker's own fail-stop comes first whenever its event loop runs; the
        supervisor is the backstop for an interpreter that cannot act (C code holding the
        GIL, a blocked log write), so it waits this much longer: half of what the lease
        leaves after the self-stop and the grace, at most a second. That is always more
        than 0 (half the lease + grace < lease), and the process is dead by half the
        lease + grace + margin, still before the lease ends.
        """
        return min(1.0, (self.lease - self.self_stop_after - self.stop_grace) / 2)
