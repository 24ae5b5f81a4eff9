"""Sample media for the demo and the tests: originals with bursts of captures, some
with the same content, and orphan proxy folders old enough for the sweep."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from examples.media import _files


def make_originals(
    folder: Path,
    *,
    files: int,
    seed: int,
    size: int = 96 * 1024,
    duplicates: int = 2,
    start: float | None = None,
) -> list[Path]:
    """`files` originals in `folder` (the last `duplicates` copy earlier content),
    captured in bursts: 2 to 5 shots a second apart, bursts minutes apart."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    captured = start if start is not None else time.time() - 86400 * 30
    made: list[Path] = []
    left_in_burst = 0
    for n in range(files):
        if left_in_burst == 0:
            captured += rng.uniform(120, 3600)
            left_in_burst = rng.randint(1, 5)
        else:
            captured += rng.uniform(0.2, 1.0)
        left_in_burst -= 1
        path = folder / f"IMG_{n:04d}.raw"
        if made and n >= files - duplicates:
            data = made[rng.randrange(len(made) - (files - n) + 1)].read_bytes()
        else:
            data = rng.randbytes(size + rng.randrange(size))
        path.write_bytes(data)
        os.utime(path, (captured, captured))
        made.append(path)
    return made


def make_orphan_proxies(proxy_root: Path, *, count: int, seed: int, age: float) -> list[str]:
    """Proxy folders of content no asset has, last touched `age` seconds ago."""
    rng = random.Random(seed)
    hashes = []
    then = time.time() - age
    for _ in range(count):
        data = rng.randbytes(4096)
        digest = _files.content_hash(data)
        for kind in _files.PROXY_KINDS:
            path = proxy_root / _files.proxy_relpath(digest, kind)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_files.render_proxy(data, kind, digest))
            os.utime(path, (then, then))
        os.utime(_files.proxy_dir(proxy_root, digest), (then, then))
        hashes.append(digest)
    return hashes
