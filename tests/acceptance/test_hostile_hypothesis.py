"""Whatever callers store and handlers raise, through every enqueue path, the Worker goes
on and every reader renders it (issue 18, acceptance 2).

Hypothesis draws batches of items with arbitrary kinds, scopes, payloads and error
texts (surrogates, NULs, rich markup, HTML, control and bidirectional characters, deep
nesting), each enqueued through the Python store, plain SQL or the command line, and
each told by its payload how its handler ends (returns, or raises an exception, a
DoNotRetry, KeyboardInterrupt, SystemExit, a bare BaseException, one whose __str__
raises). A path may refuse an item, with a clean error and nothing written; whatever
it takes, one real Worker (on real PostgreSQL, in real time) runs to an end matching
the handler, the Worker stays up, and `show`, `status` and the dashboard's pages
render every item.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import trio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.browser.support import dashboards, request
from tests.support.database import Databases
from tests.support.processes import ROOT
from trioworker import (
    Context,
    DoNotRetry,
    InvalidWorkItem,
    Registry,
    RetryPolicy,
    Settings,
    Status,
    Worker,
    WorkItem,
    open_store,
)
from trioworker._cli.main import main as cli

ENDINGS = ["ok", "Exception", "DoNotRetry", "KeyboardInterrupt", "SystemExit", "BaseException",
           "BrokenStr"]  # fmt: skip
NASTY = [
    "[/bold]", "[link=https://evil.example/]L[/link]", "expected [int] got [str]",
    "\x1b]0;PWNED\x07", "\x1b[31mred", "<script>alert(1)</script>", "{{ 7*7 }}", "\u202eevil",
    " ws ", "a\x00b", "caf\udce9", "\ud800", "line\nbreak", "tab\there", "\u2028", "\x85",
]  # fmt: skip
CHARACTERS = st.characters(categories=["L", "M", "N", "P", "S", "Z", "C"])
TEXT = st.one_of(st.sampled_from(NASTY), st.text(CHARACTERS, min_size=1, max_size=24))
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False,
                    allow_infinity=False), TEXT)  # fmt: skip
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=12,
)
DEEP = st.integers(60, 70).map(lambda n: json.loads("[" * n + "]" * n))
ITEM = st.fixed_dictionaries(
    {
        "path": st.sampled_from(["python", "python", "sql", "cli"]),
        "kind": TEXT,
        "scope": st.none() | TEXT,
        "data": JSON | DEEP,
        "ending": st.sampled_from(ENDINGS),
        "error": TEXT,
    }
)
ONCE = RetryPolicy(max_attempts=1)
SHORT = Settings(lease=4, heartbeat=1, poll=0.2, stop_grace=1, recovery_every=0.5)


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


async def hostile(item: WorkItem, ctx: Context) -> None:
    ending, text = item.payload["ending"], item.payload["error"]
    raised: dict[str, BaseException] = {
        "Exception": ValueError(text),
        "DoNotRetry": DoNotRetry(text),
        "KeyboardInterrupt": KeyboardInterrupt(text),
        "SystemExit": SystemExit(text),
        "BaseException": BaseException(text),
        "BrokenStr": BrokenStr(),
    }
    await trio.lowlevel.checkpoint()
    if ending != "ok":
        raise raised[ending]


@pytest.fixture(scope="module")
def queue(
    databases: Databases, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """One database and one dashboard over it for every example (the DSN, its URL)."""
    with databases.database() as dsn, dashboards(tmp_path_factory.mktemp("dash")) as start:
        yield dsn, start(dsn).url


def enqueue_by_sql(dsn: str, item: dict[str, Any]) -> int | None:
    payload = json.dumps({k: item[k] for k in ("data", "ending", "error")})
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "INSERT INTO work_items (kind, scope, payload) VALUES (%s, %s, %s::jsonb)"
                " RETURNING id",
                (item["kind"], item["scope"], payload),
            ).fetchone()
    except (psycopg.DataError, psycopg.IntegrityError, UnicodeEncodeError):
        return None  # refused: a NUL, a lone surrogate, an empty or long name, too deep
    assert row is not None
    return int(row[0])


def enqueue_by_cli(dsn: str, item: dict[str, Any]) -> int | None:
    payload = json.dumps({k: item[k] for k in ("data", "ending", "error")})
    args = [item["kind"], *(["--scope", item["scope"]] if item["scope"] is not None else [])]
    try:
        argv = [os.fsencode(a) for a in [*args, "--payload", payload]]
    except UnicodeEncodeError:
        return None  # a surrogate no command line can carry
    if any(b"\x00" in a for a in argv):
        return None  # nor a NUL
    result = subprocess.run(
        [sys.executable, "-m", "trioworker", "--dsn", dsn, "enqueue", *argv],
        cwd=ROOT, capture_output=True, timeout=60,
    )  # fmt: skip
    assert result.returncode in (0, 2), result.stderr
    if result.returncode == 2:
        assert b"Traceback" not in result.stderr, result.stderr
        return None
    return int(result.stdout)


async def enqueue_by_python(store: Any, item: dict[str, Any]) -> int | None:
    payload = {k: item[k] for k in ("data", "ending", "error")}
    try:
        return int((await store.enqueue(item["kind"], scope=item["scope"], payload=payload)).id)
    except InvalidWorkItem:
        return None


async def finished(store: Any, id: int) -> Any:
    with trio.fail_after(60):
        while True:
            state = await store.get_item(id)
            if state is not None and state.status.is_terminal:
                return state
            await trio.sleep(0.1)


async def run_batch(dsn: str, batch: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Enqueue the batch, run one Worker over it until every item is finished (and one
    more after them, to show the Worker still works); the items written, by id."""
    written: dict[int, dict[str, Any]] = {}
    async with open_store(dsn) as store:
        for item in batch:
            if item["path"] == "python":
                id = await enqueue_by_python(store, item)
            elif item["path"] == "sql":
                id = enqueue_by_sql(dsn, item)
            else:
                id = await trio.to_thread.run_sync(enqueue_by_cli, dsn, item)
            event(f"{item['path']}: {'written' if id is not None else 'refused'}")
            if id is not None:
                written[id] = item
        registry = Registry()
        for kind in {item["kind"] for item in written.values()} | {"After"}:
            registry.handler(kind, retry=ONCE)(hostile)
        worker = Worker(store, registry, SHORT, worker_id="hypothesis", fail_stop=pytest.fail)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            states = {id: await finished(store, id) for id in written}
            after = await store.enqueue("After", payload={"ending": "ok", "error": ""})
            assert (await finished(store, after.id)).status is Status.SUCCEEDED
            worker.stop()
    for id, item in written.items():
        expected = Status.SUCCEEDED if item["ending"] == "ok" else Status.FAILED
        assert states[id].status is expected, (item, states[id])
        assert states[id].stalls == 0
        if expected is Status.FAILED:
            assert states[id].error
    return written


@settings(
    max_examples=int(os.environ.get("TRIOWORKER_HYPOTHESIS_EXAMPLES", "20")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(ITEM, min_size=1, max_size=5))
def test_any_item_any_path_any_error_the_worker_goes_on_and_every_reader_renders_it(
    queue: tuple[str, str], batch: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    dsn, url = queue
    written = trio.run(run_batch, dsn, batch)
    for id in written:
        for args in (["show", str(id)], ["show", str(id), "--json"]):
            capsys.readouterr()
            assert cli(["--dsn", dsn, *args]) == 0
            shown = capsys.readouterr()
            assert f"{id}" in shown.out and "Traceback" not in shown.err
        answer = request(f"{url}/items/{id}")
        assert answer.status == 200, answer.body[:500]
    for args in (["status"], ["status", "--json"]):
        capsys.readouterr()
        assert cli(["--dsn", dsn, *args]) == 0
        assert "Traceback" not in capsys.readouterr().err
    for page in ("/", "/running", "/scopes", "/failures", "/workers", "/pauses"):
        answer = request(f"{url}{page}")
        assert answer.status == 200, (page, answer.body[:500])
