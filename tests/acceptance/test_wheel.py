"""The wheel users install: built from this checkout as `pip` builds it, it carries the
package, its SQL, migrations, dashboard files and type marker, and nothing of the
example applications (the media demo lives in examples/, outside the package). Installed
in a fresh venv, from the wheel or from the checkout, it works as the guide says."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
import tomllib
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.database import Databases
from tests.support.docblocks import install_commands, pip_install
from tests.support.processes import ROOT


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", out,
         str(ROOT)],
        check=True, timeout=300,
    )  # fmt: skip
    [built] = out.glob("trioworker-*.whl")
    yield built


def test_the_wheel_holds_the_package_and_none_of_the_examples(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if "media" in n or n.startswith("examples/")]
    tops = {n.split("/")[0] for n in names}
    assert tops == {"trioworker", next(t for t in tops if t.endswith(".dist-info"))}
    for needed in [
        "trioworker/py.typed",
        "trioworker/_postgres/queries.sql",
        "trioworker/dashboard/queries.sql",
        "trioworker/dashboard/templates/base.html",
        "trioworker/_migrations/",
    ]:
        assert any(n.startswith(needed) for n in names), needed


# -- installed, as the guide says (issue 20) ---------------------------------------------

#: What a fresh environment lacks that the guide's commands need: nothing. The venv is
#: made without the checkout on its path, and pip uses this machine's configuration
#: (its package index and the local ones set up for it), as a user's pip would.
PIP = ["-m", "pip", "install", "--quiet", "--disable-pip-version-check"]


def fresh_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    return where / "bin" / "python"


def outside(python: Path, *args: str, cwd: Path, dsn: str) -> subprocess.CompletedProcess[str]:
    """Run the venv's `python ARGS` in a directory that is not the checkout, with only
    the DSN set for trioworker (no PYTHONPATH: what is imported is what was installed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TRIOWORKER_DSN"] = dsn
    return subprocess.run(
        [str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture(scope="session")
def wheel_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the built wheel installed, and its dependencies from the index."""
    python = fresh_venv(tmp_path_factory.mktemp("venv") / "wheel")
    subprocess.run([str(python), *PIP, str(wheel)], check=True, timeout=600)
    return python


def test_the_guide_names_the_wheel_that_is_built(wheel: Path) -> None:
    """The install step's `pip install dist/NAME.whl` is the name pip gives the wheel."""
    guide = (ROOT / "docs" / "guide" / "getting-started.md").read_text()
    assert f"pip install dist/{wheel.name}\n" in guide


def test_the_installed_wheel_migrates_enqueues_and_reports(
    wheel_venv: Path, databases: Databases, tmp_path: Path
) -> None:
    """From the wheel, outside the checkout: `trioworker migrate` (the console script),
    `python -m trioworker enqueue` and `status --json` work on an empty database, and
    what ran is the installed package, with its migrations shipped inside it."""
    where = outside(wheel_venv, "-c", "import trioworker; print(trioworker.__file__)",
                    cwd=tmp_path, dsn="")  # fmt: skip
    assert "site-packages" in where.stdout and str(ROOT) not in where.stdout, where
    with databases.database(migrated=False) as dsn:
        script = wheel_venv.parent / "trioworker"
        migrated = subprocess.run(
            [str(script), "migrate"], cwd=tmp_path, env={**os.environ, "TRIOWORKER_DSN": dsn},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert migrated.returncode == 0, migrated.stderr
        assert migrated.stdout.splitlines()[0] == "applied 0001.queue"
        enqueued = outside(wheel_venv, "-m", "trioworker", "enqueue", "Crawl", "--scope", "7",
                           cwd=tmp_path, dsn=dsn)  # fmt: skip
        assert enqueued.returncode == 0 and enqueued.stdout.strip().isdigit(), enqueued.stderr
        status = outside(wheel_venv, "-m", "trioworker", "status", "--json",
                         cwd=tmp_path, dsn=dsn)  # fmt: skip
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["counts"] == {
            "Crawl": {
                "Waiting": 0,
                "Queued": 1,
                "Running": 0,
                "Succeeded": 0,
                "Failed": 0,
                "Cancelled": 0,
            }
        }
        table = outside(wheel_venv, "-m", "trioworker", "status", cwd=tmp_path, dsn=dsn)
        assert table.returncode == 0 and "Crawl" in table.stdout, table.stderr


def test_the_checkout_installs_with_the_dashboard_extra(
    databases: Databases, tmp_path: Path
) -> None:
    """`pip install '.[dashboard]'` from the checkout (the guide's other way) gives a
    package whose dashboard serves its overview page."""
    python = fresh_venv(tmp_path / "venv")
    subprocess.run([str(python), *PIP, f"{ROOT}[dashboard]"], check=True, timeout=600)
    with databases.database() as dsn:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        log = (tmp_path / "dashboard.log").open("w")
        proc = subprocess.Popen(
            [str(python), "-m", "trioworker", "--dsn", dsn, "dashboard", "--port", "0"],
            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            url = None
            while url is None and time.monotonic() < deadline and proc.poll() is None:
                found = re.search(r"dashboard listening on (http://\S+)",
                                  (tmp_path / "dashboard.log").read_text())  # fmt: skip
                url = found[1] if found else None
                time.sleep(0.1)
            assert url, (tmp_path / "dashboard.log").read_text()
            with urllib.request.urlopen(url, timeout=30) as page:
                assert page.status == 200 and b"trioworker" in page.read()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()


# -- every install command the docs show (issue 35, item 1) ------------------------------


def _documented_installs() -> dict[str, str]:
    """Each distinct `pip install ...` of README.md and docs/, and where it is first shown."""
    found: dict[str, str] = {}
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for where, command in install_commands(path):
            found.setdefault(command, f"{path.relative_to(ROOT).parent}/{where}")
    return found


DOCUMENTED_INSTALLS = _documented_installs()


def requirements_of(name: str, extras: list[str]) -> list[Requirement]:
    """What installing NAME[EXTRAS] must bring: for trioworker, its dependencies and those
    of each extra named (from pyproject.toml, as the wheel declares them); for another
    package, that package."""
    if name != "trioworker":
        return [Requirement(name)]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        assert extra in project["optional-dependencies"], f"trioworker has no extra {extra!r}"
        for text in project["optional-dependencies"][extra]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == "trioworker":
                wanted += requirements_of("trioworker", sorted(requirement.extras))
            else:
                wanted.append(requirement)
    return wanted


def test_the_docs_show_install_commands_and_none_names_an_unpublished_package() -> None:
    """The collection below sees the guide's install lines (so an empty list cannot pass),
    and trioworker is installed from its checkout or its wheel, never by a name an index
    would be asked for (nothing is published under it, and something else could be)."""
    assert "pip install ." in DOCUMENTED_INSTALLS
    assert any(".whl" in command for command in DOCUMENTED_INSTALLS)
    by_name = [c for c in DOCUMENTED_INSTALLS if re.search(r"(?<![\w/.-])trioworker\b(?!-)", c)]
    assert not by_name, [(c, DOCUMENTED_INSTALLS[c]) for c in by_name]


@attrs.frozen
class Installed:
    """What one documented install command did in its own fresh venv."""

    where: str
    returncode: int
    stderr: str
    installed: dict[str, str]  # canonical name -> version


def run_documented_install(command: str, where: Path, wheel: Path) -> Installed:
    """COMMAND, run by bash as written with a fresh venv's `pip` first on PATH: in the
    checkout, or, for a `dist/...whl` one, where `dist/` holds the wheel the guide builds."""
    cwd = ROOT
    if "dist/" in command:
        cwd = where / "app"
        (cwd / "dist").mkdir(parents=True)
        (cwd / "dist" / wheel.name).symlink_to(wheel)
    python = fresh_venv(where / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(python.parent.parent)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    ran = subprocess.run(["bash", "-c", command], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], env=env,
                            capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    installed = {canonicalize_name(d["name"]): d["version"] for d in json.loads(listed.stdout)}
    return Installed(DOCUMENTED_INSTALLS[command], ran.returncode, ran.stderr, installed)


@pytest.fixture(scope="session")
def documented_installs(
    wheel: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Installed]:
    """Every documented install command, each in its own fresh venv, four at a time (most
    of an install is waiting on the indexes and the disk): about a minute in all."""
    base = tmp_path_factory.mktemp("installs")
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            command: pool.submit(run_documented_install, command, base / str(i), wheel)
            for i, command in enumerate(sorted(DOCUMENTED_INSTALLS))
        }
        return {command: future.result() for command, future in futures.items()}


@pytest.mark.parametrize("command", sorted(DOCUMENTED_INSTALLS))
def test_each_documented_install_command_works_as_written_in_a_fresh_venv(
    command: str, documented_installs: dict[str, Installed]
) -> None:
    """The command exits 0 in a fresh venv and leaves installed everything the packages
    and extras it names require (trioworker's own from pyproject.toml)."""
    ran = documented_installs[command]
    assert ran.returncode == 0, f"{ran.where}: `{command}` exited {ran.returncode}:\n{ran.stderr}"
    packages = pip_install(command)
    assert packages, command
    for name, extras in packages:
        assert canonicalize_name(name) in ran.installed, (ran.where, command, name)
        for requirement in requirements_of(name, extras):
            if requirement.marker is not None and not requirement.marker.evaluate():
                continue
            version = ran.installed.get(canonicalize_name(requirement.name))
            assert version is not None, f"{ran.where}: `{command}` left {requirement} out"
            ok = requirement.specifier.contains(version, prereleases=True)
            assert ok, f"{ran.where}: `{command}` installed {version}, not {requirement}"
