"""Blocking file work, run in threads through the handler context's limiter.

Originals live under a storage config's root; the proxies of a content live in a folder
derived from the config's proxy root and the content hash alone:
`<proxy_root>/<hash[:2]>/<hash>/<kind>.proxy`. Proxies are written to a temporary name
and renamed into place, so a killed Worker leaves no half-written proxy behind.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import shutil
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

#: The proxies every active asset has, by kind: how many bytes each one derives.
PROXY_KINDS: dict[str, int] = {"thumb": 256, "preview": 2048}

HEADER = b"TWPROXY"


@attrs.frozen
class Scanned:
    """One original as a crawl saw it."""

    path: str  # relative to the config's root
    content_hash: str
    size: int
    captured_at: dt.datetime
    wrote_proxies: bool  # its content was not active, so its proxies were (re)written


PREFIX = 2  # characters of the hash that name the folder above the content's


def proxy_dir(proxy_root: Path, content_hash: str) -> Path:
    return proxy_root / content_hash[:PREFIX] / content_hash


def proxy_relpath(content_hash: str, kind: str) -> str:
    return f"{content_hash[:PREFIX]}/{content_hash}/{kind}.proxy"


def list_originals(root: Path) -> list[str]:
    """Every original under `root`, relative and sorted; hidden files are skipped."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in files:
            if not name.startswith("."):
                found.append(os.path.relpath(os.path.join(folder, name), root))
    return sorted(found)


def by_folder(originals: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The originals (relative paths, sorted) grouped by their folder ("" for the
    root's own files), folders in order."""
    folders: dict[str, list[str]] = {}
    for relpath in originals:
        folders.setdefault(os.path.dirname(relpath), []).append(relpath)
    return sorted(folders.items())


#: A step's name is at most 200 characters; a longer folder is named by its hash.
STEP_NAME_LIMIT = 200


def folder_step(folder: str) -> str:
    """The name of the crawl's step that scans `folder`."""
    name = f"scan folder {folder or '.'}"
    if len(name) <= STEP_NAME_LIMIT:
        return name
    return f"scan folder #{hashlib.blake2b(folder.encode(), digest_size=16).hexdigest()}"


def content_hash(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def render_proxy(data: bytes, kind: str, digest: str) -> bytes:
    """A thumbnail-like derivative: one byte per block of the original."""
    size = PROXY_KINDS[kind]
    step = max(1, len(data) // size)
    body = bytes(
        hashlib.blake2b(data[i : i + step], digest_size=1).digest()[0]
        for i in range(0, step * size, step)
    )
    return HEADER + f" {kind} {digest}\n".encode() + body


def proxy_is_sound(path: Path, kind: str, digest: str) -> bool:
    """Whether the proxy file exists and was rendered from this content, whole."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    header = HEADER + f" {kind} {digest}\n".encode()
    return data.startswith(header) and len(data) == len(header) + PROXY_KINDS[kind]


def _write_atomically(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)


def scan(root: Path, relpath: str, proxy_root: Path, active: frozenset[str]) -> Scanned:
    """Hash one original; write its proxies unless its content is already active."""
    path = root / relpath
    data = path.read_bytes()
    digest = content_hash(data)
    captured = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.UTC)
    new = digest not in active
    if new:
        for kind in PROXY_KINDS:
            proxy = render_proxy(data, kind, digest)
            _write_atomically(proxy_root / proxy_relpath(digest, kind), proxy)
    return Scanned(relpath, digest, len(data), captured, new)


def delete_proxies(proxy_root: Path, content_hash: str) -> bool:
    """Delete one content's proxy folder; whether there was one."""
    folder = proxy_dir(proxy_root, content_hash)
    if not folder.exists():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def _newest_mtime(folder: Path) -> float | None:
    try:
        times = [folder.stat().st_mtime] + [p.stat().st_mtime for p in folder.iterdir()]
    except OSError:
        return None
    return max(times)


def proxy_folders(proxy_root: Path) -> list[str]:
    """The content hashes that have a proxy folder under `proxy_root`."""
    if not proxy_root.is_dir():
        return []
    return sorted(
        h.name
        for prefix in proxy_root.iterdir()
        if prefix.is_dir() and len(prefix.name) == PREFIX
        for h in prefix.iterdir()
        if h.is_dir() and h.name.startswith(prefix.name)
    )


def older_than(proxy_root: Path, content_hash: str, min_age: float) -> bool:
    """Whether nothing in the content's proxy folder changed for `min_age` seconds."""
    newest = _newest_mtime(proxy_dir(proxy_root, content_hash))
    return newest is not None and time.time() - newest >= min_age


def delete_if_still_old(proxy_root: Path, content_hash: str, min_age: float) -> bool:
    """Check the age again, then delete: a crawl writing there just now keeps it."""
    if not older_than(proxy_root, content_hash, min_age):
        return False
    return delete_proxies(proxy_root, content_hash)


def delete_tree(folder: Path) -> bool:
    if not folder.exists():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True
