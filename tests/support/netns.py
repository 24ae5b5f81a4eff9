"""A host of its own for a test's processes: a network namespace joined to ours by a
veth pair, whose link the test takes down so that nothing they send afterwards (no
FIN, no RST, no keepalive answer) ever reaches this host: a machine lost with its link.

Needs root and iproute2's `ip` (CI runs as root: .ci/run). Without them it raises,
never skips: a test of a vanished host that cannot make one has proved nothing.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Sequence

import attrs

#: Where the pairs' addresses come from: a /30 each (ours .1, theirs .2), picked at
#: random among those no interface of this host uses.
_POOL = ipaddress.ip_network("10.213.0.0/16")


class NetnsError(RuntimeError):
    """The namespace, or its link, could not be made: the test cannot run."""


@attrs.frozen
class IsolatedHost:
    """Namespace `name`, reached from here at `address`; it reaches us at
    `host_address` (ours, on the veth's near end)."""

    name: str
    address: str
    host_address: str
    device: str  # the veth's end inside the namespace

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the namespace (`ip netns exec` execs it: same pid)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self) -> None:
        """Take the link down from inside: nothing the namespace sends leaves it."""
        _ip("-n", self.name, "link", "set", self.device, "down")

    def pids(self) -> list[int]:
        """The processes still running in the namespace."""
        out = subprocess.run(
            ["ip", "netns", "pids", self.name], capture_output=True, text=True, check=False
        )
        return [int(pid) for pid in out.stdout.split()]


@contextlib.contextmanager
def isolated_host() -> Iterator[IsolatedHost]:
    """A namespace with a veth link to this host, up; removed (with anything left
    running in it) when the block ends."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise NetnsError(
            "a network namespace needs root and iproute2's `ip` (CI runs as root);"
            f" euid {os.geteuid()}, ip at {shutil.which('ip')}"
        )
    tag = secrets.token_hex(4)
    name, near, far = f"tw-vanish-{tag}", f"twh{tag}", f"twn{tag}"
    ours, theirs = _free_pair()
    _ip("netns", "add", name)
    try:
        _ip("link", "add", near, "type", "veth", "peer", "name", far, "netns", name)
        _ip("addr", "add", f"{ours}/30", "dev", near)
        _ip("link", "set", near, "up")
        _ip("-n", name, "addr", "add", f"{theirs}/30", "dev", far)
        _ip("-n", name, "link", "set", far, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield IsolatedHost(name=name, address=theirs, host_address=ours, device=far)
    finally:
        host = IsolatedHost(name=name, address=theirs, host_address=ours, device=far)
        for pid in host.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        subprocess.run(["ip", "link", "del", near], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def _free_pair() -> tuple[str, str]:
    """(ours, theirs): the first two hosts of a /30 of _POOL no interface here is in."""
    used = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    taken = [ipaddress.ip_interface(word).network for word in used.split() if "/" in word]
    while True:
        index = secrets.randbelow(_POOL.num_addresses // 4)
        subnet = ipaddress.ip_network(f"{_POOL.network_address + 4 * index}/30")
        if not any(subnet.overlaps(net) for net in taken):
            ours, theirs = list(subnet.hosts())
            return str(ours), str(theirs)


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
