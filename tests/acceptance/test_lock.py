"""The lock ./dev test installs from (requirements/test.txt, made by `./dev lock`): every
package pinned with its hashes, and in step with pyproject.toml, whose own ranges bound
the majors trioworker relies on."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "test.txt"
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s\\]+)")


def locked() -> dict[str, tuple[Version, int]]:
    """Each locked package: its version and how many hashes it has."""
    pins: dict[str, tuple[Version, int]] = {}
    name = None
    for line in LOCK.read_text().splitlines():
        if m := PIN.match(line):
            name = canonicalize_name(m[1])
            pins[name] = (Version(m[2]), 0)
        elif line.strip().startswith("--hash=sha256:") and name is not None:
            version, hashes = pins[name]
            pins[name] = (version, hashes + 1)
        elif line and not line.startswith((" ", "#")):
            raise AssertionError(f"not a pin: {line!r}")
    return pins


def wanted() -> list[Requirement]:
    """The project's dependencies and its test extras, the extras it names of itself
    followed."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    out = [Requirement(r) for r in project["dependencies"]]
    todo, seen = ["test"], set()
    while todo:
        extra = todo.pop()
        seen.add(extra)
        for text in extras[extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == "trioworker":
                todo += [e for e in req.extras if e not in seen]
            else:
                out.append(req)
    return out


def test_every_locked_package_is_pinned_with_hashes() -> None:
    pins = locked()
    assert len(pins) > 50
    assert [name for name, (_, hashes) in pins.items() if hashes == 0] == []


def test_the_lock_holds_every_dependency_at_a_version_pyproject_allows() -> None:
    """A dependency added to pyproject.toml, or a range moved past the locked version,
    fails here until `./dev lock` is run again."""
    pins = locked()
    missing, outside = [], []
    for req in wanted():
        pin = pins.get(canonicalize_name(req.name))
        if pin is None:
            missing.append(req.name)
        elif not req.specifier.contains(pin[0], prereleases=True):
            outside.append(f"{req} (locked {pin[0]})")
    assert (missing, outside) == ([], [])


def test_the_libraries_whose_majors_it_relies_on_are_bounded() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bounded = {
        canonicalize_name(r.name)
        for r in map(Requirement, project["dependencies"])
        if any(s.operator == "<" for s in r.specifier)
    }
    assert {"psycopg", "psycopg-pool", "yoyo-migrations", "rich", "cronsim"} <= bounded
