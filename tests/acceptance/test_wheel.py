"""The wheel users install: built from this checkout as `pip` builds it, it carries the
package, its SQL, migrations, dashboard files and type marker, and nothing of the
example applications (the media demo lives in examples/, outside the package)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

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
