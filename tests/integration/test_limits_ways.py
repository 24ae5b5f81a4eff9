"""The three ways of setting a limit (the CLI, the Python store, plain SQL on
work_limits) agree, and a bad limit is a clear usage error that writes nothing
(issue 21, acceptance 6)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import psycopg
import pytest

from tests.integration.test_cli_edges import run
from trioworker import InvalidLimit, PostgresStore, Rate

Conn = psycopg.Connection[Any]
LEASE = 30.0

#: Each limit, as it is set the three ways.
LIMITS = [
    (["--scope", "S", "--running", "2"], {"scope": "S", "running": 2},
     "INSERT INTO work_limits (scope, running) VALUES ('S', 2)"),
    (["--kind", "K", "--running", "8"], {"kind": "K", "running": 8},
     "INSERT INTO work_limits (kind, running) VALUES ('K', 8)"),
    (["--kind", "K", "--rate", "10/s"], {"kind": "K", "rate": "10/s"},
     "INSERT INTO work_limits (kind, rate, per) VALUES ('K', 10, '1 second')"),
    (["--scope", "S", "--rate", "600/min"], {"scope": "S", "rate": Rate(600, 60.0)},
     "INSERT INTO work_limits (scope, rate, per) VALUES ('S', 600, '1 minute')"),
    (["--default", "--running", "3"], {"running": 3},
     "INSERT INTO work_limits (running) VALUES (3)"),
]  # fmt: skip

ROWS = "SELECT kind, scope, running, rate, per FROM work_limits ORDER BY id"


def cli(dsn: str, *args: str) -> Any:
    return run("--dsn", dsn, "limit", *args)


@pytest.mark.parametrize("ways", LIMITS, ids=lambda v: " ".join(v[0]))
async def test_the_cli_python_and_sql_ways_write_the_same_row(
    store: PostgresStore, pg: Conn, dsn: str, ways: tuple[list[str], dict[str, Any], str]
) -> None:
    """Each limit set by the CLI, by `PostgresStore.set_limit` and by an INSERT gives
    the same row, and all three read back alike through `limits()` and `limit --json`."""
    argv, python, sql = ways
    rows = []
    listed = []
    for way in ("cli", "python", "sql"):
        pg.execute("DELETE FROM work_limits")
        if way == "cli":
            result = cli(dsn, *argv)
            assert result.returncode == 0, result.stderr
        elif way == "python":
            await store.set_limit(**python)
        else:
            pg.execute(sql)  # type: ignore[arg-type]
        rows.append(pg.execute(ROWS).fetchall())
        [limit] = await store.limits()
        listed.append((limit.kind, limit.scope, limit.running, limit.rate))
        shown = json.loads(cli(dsn, "--json").stdout)
        assert [(s["kind"], s["scope"], s["running"], s["rate"]) for s in shown] == [
            (
                limit.kind,
                limit.scope,
                limit.running,
                None if limit.rate is None else str(limit.rate),
            )
        ]
    assert rows[0] == rows[1] == rows[2] and len(rows[0]) == 1
    assert listed[0] == listed[1] == listed[2]


async def test_a_limit_set_three_ways_holds_the_same(
    store: PostgresStore, pg: Conn, dsn: str
) -> None:
    """Scope S at 2 by SQL, then raised to 3 by the CLI, then lowered to 1 from Python:
    each time, that many of S's items can be claimed, and no more. --clear gives the
    founding rule back."""
    for _ in range(6):
        await store.enqueue("K", scope="S")

    async def claimable() -> int:
        claimed = []
        while (item := await store.claim("w", LEASE, kinds=["K"])) is not None:
            claimed.append(item)
        for item in claimed:
            assert await store.release(item.id, item.attempt)
        return len(claimed)

    assert await claimable() == 1
    pg.execute("INSERT INTO work_limits (scope, running) VALUES ('S', 2)")
    await store.settle_noted_scopes()
    assert await claimable() == 2
    assert cli(dsn, "--scope", "S", "--running", "3").returncode == 0
    await store.settle_noted_scopes()
    assert await claimable() == 3
    await store.set_limit(scope="S", running=1)
    await store.settle_noted_scopes()
    assert await claimable() == 1
    assert cli(dsn, "--scope", "S", "--running", "2").returncode == 0
    cleared = cli(dsn, "--scope", "S", "--clear")
    assert (cleared.returncode, cleared.stdout) == (0, "scope 'S' cleared\n")
    assert pg.execute(ROWS).fetchall() == []
    await store.settle_noted_scopes()
    assert await claimable() == 1


def test_setting_a_rate_keeps_the_running_limit_and_sql_can_clear_one(pg: Conn, dsn: str) -> None:
    """Setting a rate on a kind with a running limit keeps the running limit; the SQL
    function's NULL keeps and 0 clears, and a limit left with neither is removed."""
    assert cli(dsn, "--kind", "K", "--running", "4").returncode == 0
    assert cli(dsn, "--kind", "K", "--rate", "5/2s").returncode == 0
    assert pg.execute(ROWS).fetchall() == [("K", None, 4, 5, dt.timedelta(seconds=2))]
    pg.execute("SELECT work_set_limit_v1('K', NULL, 0)")
    assert pg.execute(ROWS).fetchall() == [("K", None, None, 5, dt.timedelta(seconds=2))]
    pg.execute("SELECT work_set_limit_v1('K', NULL, NULL, 0)")
    assert pg.execute(ROWS).fetchall() == []
    listed = cli(dsn)
    assert listed.stdout.startswith("no limits")


BAD = [
    (["--scope", "S", "--running", "0"], "running limit 0: give 1..10000"),
    (["--scope", "S", "--running", "-2"], "running limit -2: give 1..10000"),
    (["--scope", "S", "--running", "1.5"], "--running '1.5': give a whole number"),
    (["--scope", "S", "--running", "two"], "--running 'two': give a whole number"),
    (["--kind", "K", "--rate", "0/s"], "at least one start per period"),
    (["--kind", "K", "--rate=-1/s"], "give starts per period"),
    (["--kind", "K", "--rate", "1.5/s"], "give starts per period"),
    (["--kind", "K", "--rate", "10"], "give starts per period"),
    (["--kind", "K", "--rate", "10/fortnight"], "give starts per period"),
    (["--kind", "K", "--rate", "10/2d"], "at most one day"),
    (["--default", "--rate", "10/s"], "the default is a running limit only"),
    (["--running", "2"], "say whose limit"),
    (["--kind", "K"], "give --running N, --rate R/PERIOD or --clear"),
    (["--kind", "K", "--clear", "--running", "2"], "--clear removes a limit"),
    (["--kind", "K", "--scope", "S", "--running", "2"], "not allowed with argument"),
    (["--kind", " ", "--running", "2"], "kind must be a non-blank string"),
]


@pytest.mark.parametrize(
    ("argv", "message"), BAD, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_a_bad_limit_is_a_usage_error_that_writes_nothing(
    pg: Conn, dsn: str, argv: list[str], message: str
) -> None:
    """Exit 2 with a last line naming the problem (argparse's own errors come after
    its usage lines), and work_limits is untouched."""
    pg.execute("INSERT INTO work_limits (kind, running) VALUES ('K', 5)")
    before = pg.execute(ROWS).fetchall()
    result = cli(dsn, *argv)
    assert result.returncode == 2, result
    assert message in result.stderr.splitlines()[-1], result.stderr
    assert result.stdout == ""
    assert pg.execute(ROWS).fetchall() == before


@pytest.mark.parametrize(
    "bad",
    [
        {"scope": "S", "running": 0},
        {"scope": "S", "running": -1},
        {"scope": "S", "running": 1.5},
        {"scope": "S", "running": True},
        {"kind": "K", "rate": "0/s"},
        {"kind": "K", "rate": Rate(0, 1.0)},
        {"kind": "K", "rate": Rate(5, 0.0)},
        {"kind": "K", "rate": 10},
        {"kind": "K", "scope": "S", "running": 2},
        {"kind": "K"},
    ],
    ids=str,
)
async def test_a_bad_limit_from_python_raises_invalid_limit_and_writes_nothing(
    store: PostgresStore, pg: Conn, bad: dict[str, Any]
) -> None:
    """`set_limit` refuses what the CLI refuses, with InvalidLimit (a ValueError)."""
    with pytest.raises(InvalidLimit):
        await store.set_limit(**bad)
    assert pg.execute(ROWS).fetchall() == []


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO work_limits (scope, running) VALUES ('S', 0)",
        "INSERT INTO work_limits (scope, running) VALUES ('S', -1)",
        "INSERT INTO work_limits (kind, rate, per) VALUES ('K', 0, '1 second')",
        "INSERT INTO work_limits (kind, rate) VALUES ('K', 10)",
        "INSERT INTO work_limits (rate, per) VALUES (10, '1 second')",
        "INSERT INTO work_limits (kind, scope, running) VALUES ('K', 'S', 1)",
        "INSERT INTO work_limits (kind) VALUES ('K')",
        "SELECT work_set_limit_v1('K', NULL, -1)",
        "SELECT work_set_limit_v1('K', NULL, NULL, 5)",
    ],
)
def test_a_bad_limit_in_plain_sql_is_refused_by_the_schema(pg: Conn, statement: str) -> None:
    """The table's CHECKs (and the function's own checks) refuse what Python refuses."""
    with pytest.raises((psycopg.errors.CheckViolation, psycopg.errors.InvalidParameterValue)):
        pg.execute(statement)  # type: ignore[arg-type]
    assert pg.execute(ROWS).fetchall() == []
