# trio_asyncio before psycopg, or psycopg's async calls find no running event loop.
import trio_asyncio  # noqa: F401  isort: skip

import logging
import os
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

from tests.support.alone import turn
from tests.support.clients import through_async_client, through_sync_client
from tests.support.database import Databases, server_dsn
from tests.support.harness import Harness, MemoryHarness, PostgresHarness
from trioworker import PostgresStore, open_store


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", help="run the long soak tests too")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        return
    deselected = [item for item in items if "slow" in item.keywords]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if "slow" not in item.keywords]


@pytest.hookimpl(wrapper=True)
def pytest_report_to_serializable(report: pytest.TestReport) -> Iterator[object]:
    """Reports cross from pytest-xdist's workers to its controller as UTF-8. The hostile-
    input tests log and assert on lone surrogates (text that is not valid Unicode), which
    execnet cannot encode and which would end the whole run: send them escaped."""
    data = yield
    return _escape_surrogates(data)


def _escape_surrogates(value: object) -> object:
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_escape_surrogates(k): _escape_surrogates(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_escape_surrogates(v) for v in value)
    return value


@pytest.fixture(autouse=True)
def _alone(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Under pytest-xdist, a test marked `alone` runs while no other test does
    (tests/support/alone.py); its workers share their base temp directory's parent."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    run_dir = tmp_path_factory.getbasetemp().parent
    with turn(run_dir, alone=request.node.get_closest_marker("alone") is not None):
        yield


@pytest.fixture(scope="session")
def databases() -> Iterator[Databases]:
    """PostgreSQL for the session. Never skips: no database is a failure."""
    with server_dsn() as (admin_dsn, source):
        logging.getLogger(__name__).info("test database server: %s", source)
        databases = Databases(admin_dsn)
        try:
            yield databases
        finally:
            databases.close()


@pytest.fixture
def dsn(databases: Databases) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    with databases.database() as dsn:
        yield dsn


@pytest.fixture
def pg(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain autocommit connection to the test database, for setting up and checking."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[PostgresStore]:
    async with open_store(dsn, call_timeout=10.0) as store:
        yield store


@pytest.fixture(params=["memory", "postgres", "client", "async-client"])
async def harness(request: pytest.FixtureRequest, databases: Databases) -> AsyncIterator["Harness"]:
    """Each contract test runs against the in-memory store and against PostgreSQL: the
    Trio store, and its client operations through `Client` and through `AsyncClient`."""
    if request.param == "memory":
        yield MemoryHarness()
        return
    with databases.database() as dsn, psycopg.connect(dsn, autocommit=True) as pg:
        async with open_store(dsn) as store:
            if request.param == "postgres":
                yield PostgresHarness(store, pg)
                return
            through = through_sync_client if request.param == "client" else through_async_client
            with through(store) as client_store:
                yield PostgresHarness(client_store, pg, name=request.param)
