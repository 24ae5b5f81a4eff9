"""The psycopg names the Trio store relies on that psycopg does not document
(trioworker/_postgres/psycopg_internals.py): each is checked by name, so a psycopg
release that changes one fails here, saying which, before anything else runs."""

from __future__ import annotations

import importlib.metadata
import inspect
import re
from pathlib import Path

import psycopg
import psycopg.generators
import pytest

from trioworker._postgres import psycopg_internals
from trioworker._postgres.trio_connection import TrioConnection, TrioLock


def test_this_psycopg_has_every_internal_the_trio_store_uses() -> None:
    """Empty, or the list of what psycopg changed (psycopg_internals.py says why each
    is needed and where psycopg would reach for asyncio instead)."""
    missing = psycopg_internals.missing()
    assert missing == [], (
        f"psycopg {psycopg.__version__} changed what the Trio store relies on: "
        + "; ".join(missing)
    )


def test_a_missing_internal_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(psycopg.generators, "cancel")
    monkeypatch.setattr(psycopg.AsyncConnection, "_connect_gen", None)
    assert psycopg_internals.missing() == [
        "psycopg.AsyncConnection._connect_gen is gone",
        "psycopg.generators.cancel is gone",
    ]


def test_a_changed_wait_signature_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    async def wait(self: object, gen: object, deadline: float = 0.0) -> None: ...

    monkeypatch.setattr(psycopg.AsyncConnection, "wait", wait)
    [problem] = psycopg_internals.missing()
    assert problem.startswith("AsyncConnection.wait('gen', 'interval', 'timeout') changed")


def test_the_trio_connection_overrides_each_asyncio_path() -> None:
    """connect, wait and cancel_safe are TrioConnection's own, and its lock is Trio's."""
    for name in ("connect", "wait", "cancel_safe", "close"):
        assert name in vars(TrioConnection), name
    assert psycopg_internals.LOCK == "lock"
    assert "self.lock = TrioLock()" in inspect.getsource(TrioConnection.__init__)
    assert TrioLock().locked() is False


def test_the_installed_psycopg_is_within_the_tested_bound() -> None:
    """pyproject.toml bounds psycopg to the releases these tests ran on."""
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    bound = re.search(r'"psycopg\[binary\]>=([\d.]+),<([\d.]+)"', pyproject)
    assert bound is not None, "pyproject.toml must bound psycopg from above"
    low, high = (tuple(map(int, v.split("."))) for v in bound.groups())
    installed = tuple(map(int, importlib.metadata.version("psycopg").split(".")[:2]))
    assert low[:2] <= installed < high[:2]
