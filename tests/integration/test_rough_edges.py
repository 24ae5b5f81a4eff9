"""The rough edges a new user met (issue 20), each through the real command line on
real PostgreSQL: durations, prune's dry run, the demo's first lines, what --help costs,
piped output and its times, and quiesce's last word."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import resource
import signal
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from tests.support.processes import ROOT, wait_for, workers

Conn = psycopg.Connection[Any]
#: A server that does not answer: a command that connects fails with exit 1, not 2.
UNREACHABLE = "host=127.0.0.1 port=1 dbname=x connect_timeout=1"


def run(*args: str, env: dict[str, str] | None = None) -> Any:
    environment = {k: v for k, v in os.environ.items() if k not in ("TRIOWORKER_DSN", "COLUMNS")}
    return subprocess.run(
        [sys.executable, "-m", "trioworker", *args],
        cwd=ROOT, env={**environment, **(env or {})}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def finished_items(pg: Conn, count: int, ago: str) -> None:
    pg.execute(
        "INSERT INTO work_items (kind, status, finished_at, reason)"
        " SELECT 'Old', 'Succeeded', now() - %s::interval, 'done'"
        " FROM generate_series(1, %s)",
        (ago, count),
    )


def count(pg: Conn) -> int:
    row = pg.execute("SELECT count(*) FROM work_items").fetchone()
    assert row is not None
    return int(row[0])


# -- one duration syntax -------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["prune", "--older-than", "5"],
        ["retry", "--failed", "--since", "5"],
        ["enqueue", "K", "--delay", "3600"],
        ["run", "--app", "tests.apps.recording:registry", "--retain", "7"],
    ],
    ids=["prune", "retry-since", "enqueue-delay", "run-retain"],
)
def test_a_bare_number_is_not_a_duration(args: list[str]) -> None:
    """`prune --older-than 5` deleted everything finished more than 5 s ago: a number
    without a unit is now a usage error (exit 2) for every duration option, refused
    before anything connects, and the message shows the spellings it means."""
    result = run("--dsn", UNREACHABLE, *args)
    assert result.returncode == 2, result.stderr
    assert re.search(r"(give '\d+' a unit: \d+s, \d+m, \d+h, \d+d or \d+w|ISO 8601)", result.stderr)
    assert "Traceback" not in result.stderr


def test_prune_with_a_bare_number_deletes_nothing(dsn: str, pg: Conn) -> None:
    """The items finished a minute ago are all still there after `--older-than 5`."""
    finished_items(pg, 3, "1 minute")
    assert run("--dsn", dsn, "prune", "--older-than", "5").returncode == 2
    assert count(pg) == 3


def test_prune_dry_run_counts_and_deletes_nothing(dsn: str, pg: Conn) -> None:
    """`prune --dry-run` says how many it would delete, of which statuses and age,
    and deletes none; the same command without it deletes exactly those."""
    finished_items(pg, 4, "10 days")
    finished_items(pg, 2, "1 hour")
    pg.execute("INSERT INTO work_items (kind) VALUES ('Queued')")
    dry = run("--dsn", dsn, "prune", "--older-than", "7d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip() == (
        "would delete 4 Succeeded/Failed/Cancelled item(s) finished more than 7d ago"
        " (dry run: none deleted)"
    )
    assert count(pg) == 7
    real = run("--dsn", dsn, "prune", "--older-than", "7d")
    assert real.stdout.startswith("deleted 4 Succeeded/Failed/Cancelled item(s)"), real.stdout
    assert count(pg) == 3


def test_enqueue_delay_takes_a_duration(dsn: str, pg: Conn) -> None:
    """`enqueue --delay 1h` (refused before: seconds only) makes the item due in an
    hour, as the database's clock counts it."""
    result = run("--dsn", dsn, "enqueue", "K", "--delay", "1h")
    assert result.returncode == 0, result.stderr
    row = pg.execute(
        "SELECT extract(epoch FROM run_after - requested_at) FROM work_items WHERE id = %s",
        (int(result.stdout),),
    ).fetchone()
    assert row is not None and 3599 <= float(row[0]) <= 3601


# -- the demo's first lines ------------------------------------------------------------


def test_the_demo_does_not_say_where_libpq_would_go_without_a_dsn() -> None:
    """`python -m trioworker demo` with no DSN starts a PostgreSQL of its own: it
    printed "no DSN given: libpq connects as user root to database root" first, which
    was never where it went. (Without the examples, it stops at its usage error.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIOWORKER", "PG"))}
    script = (
        "import sys; sys.modules['examples'] = None; from trioworker._cli.main import main;"
        " sys.exit(main(['demo', '--duration', '1']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "./dev demo" in result.stderr
    assert "no DSN given" not in result.stderr and "libpq connects" not in result.stderr


# -- what --help costs -----------------------------------------------------------------

HEAVY = ("trio", "trio_asyncio", "psycopg", "psycopg_pool", "yoyo", "rich")


def loaded_after(argv: list[str]) -> list[str]:
    """The heavy modules `python -m trioworker ARGV` has imported when it exits."""
    script = (
        "import sys, json, runpy\n"
        f"sys.argv = ['trioworker', *{argv!r}]\n"
        "try:\n    runpy.run_module('trioworker', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    loaded: list[str] = json.loads(result.stdout.splitlines()[-1])
    return loaded


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--help"],
        ["prune", "--older-than", "5"],
        ["enqueue", "K", "--priority", "5000"],
        ["frobnicate"],
    ],
)
def test_help_and_usage_errors_import_neither_trio_nor_psycopg(argv: list[str]) -> None:
    """--help and argparse's usage errors end before any verb imports what it needs
    (Trio, trio-asyncio, psycopg: most of the 0.9 s of CPU every command cost). (Only an
    argument that may hold a password brings in libpq, to mask it.)"""
    assert loaded_after(argv) == []


def cpu_seconds(args: list[str]) -> float:
    """User + system CPU time of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(args, cwd=ROOT, capture_output=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def test_help_costs_a_fraction_of_what_a_verb_imports() -> None:
    """Measured side by side (best of 3, CPU time, so a loaded machine matters less):
    `--help` and a usage error cost well under what importing a verb's modules costs.
    Both include the interpreter's own start, so the quiet ratio is 0.4-0.5; a CLI that
    imported the verb's modules first would be above 1. (Three quarters, not half: a
    fresh clone's CI under load measured 0.52 for the usage error.)"""
    verb = min(cpu_seconds([sys.executable, "-c", "import trioworker._cli.commands"])
               for _ in range(3))  # fmt: skip
    help_ = min(cpu_seconds([sys.executable, "-m", "trioworker", "--help"]) for _ in range(3))
    usage = min(cpu_seconds([sys.executable, "-m", "trioworker", "prune", "--older-than", "5"])
                for _ in range(3))  # fmt: skip
    assert help_ < verb * 0.75 and usage < verb * 0.75, (help_, usage, verb)


# -- piped output and its times --------------------------------------------------------


def test_piped_status_and_show_do_not_wrap_and_times_are_utc(dsn: str, pg: Conn) -> None:
    """Piped (no terminal, no $COLUMNS) rich wrapped at 80 columns and split the
    timestamps; now a line is as long as it needs. Every time shown is UTC, marked Z,
    even when the session's time zone is not."""
    long_error = "KeyError: " + "p" * 150
    row = pg.execute(
        "INSERT INTO work_items (kind, scope, status, finished_at, reason, error)"
        " VALUES ('Thumbnail', 'cfg-7-a-rather-long-scope-name', 'Failed',"
        " '2026-12-02 15:04:05+00', 'failed 5 of 5 attempts', %s) RETURNING id",
        (long_error,),
    ).fetchone()
    assert row is not None
    env = {"PGTZ": "America/New_York"}  # libpq sets the session's TimeZone from it
    status = run("--dsn", dsn, "status", env=env)
    assert status.returncode == 0, status.stderr
    failure = next(line for line in status.stdout.splitlines() if "Thumbnail" in line
                   and "failed 5 of 5" in line)  # fmt: skip
    assert "2026-12-02 15:04:05Z" in failure and long_error[:120] in failure
    show = run("--dsn", dsn, "show", str(row[0]), env=env)
    assert show.returncode == 0, show.stderr
    finished = r"^finished\s+2026-12-02 15:04:05Z\s*$"
    assert re.search(finished, show.stdout, re.MULTILINE), show.stdout
    assert long_error in show.stdout.replace("\n", "") and f"error: {long_error}" in show.stdout


def test_piped_status_keeps_columns_when_columns_is_set(dsn: str, pg: Conn) -> None:
    """$COLUMNS still rules piped output (scripts that want 80 columns say so)."""
    pg.execute("INSERT INTO work_items (kind, scope) VALUES ('Crawl', 'cfg-7')")
    result = run("--dsn", dsn, "status", env={"COLUMNS": "80"})
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_the_cli_times_are_iso_utc_in_json_too(dsn: str, pg: Conn) -> None:
    """`show --json` keeps exact ISO 8601 times with their offset (as the database
    gave them), which parse to the same instant as the table's Z time."""
    row = pg.execute(
        "INSERT INTO work_items (kind, status, finished_at, reason) VALUES"
        " ('K', 'Succeeded', '2026-12-02 15:04:05+00', 'done') RETURNING id"
    ).fetchone()
    assert row is not None
    shown = run("--dsn", dsn, "show", "--json", str(row[0]), env={"PGTZ": "Asia/Tokyo"})
    finished = json.loads(shown.stdout)["item"]["finished_at"]
    assert dt.datetime.fromisoformat(finished) == dt.datetime(2026, 12, 2, 15, 4, 5, tzinfo=dt.UTC)


# -- pause --kind with a typo ----------------------------------------------------------


def test_pause_kind_with_app_refuses_a_kind_it_has_no_handler_for(dsn: str, pg: Conn) -> None:
    """`pause --kind Thumbnial --app ...` is a usage error as `enqueue --app` gives it,
    naming the kinds the app has; nothing is paused. A kind it has is paused."""
    app = "tests.apps.recording:registry"
    typo = run("--dsn", dsn, "pause", "--kind", "Recrod", "--app", app)
    assert typo.returncode == 2, typo.stderr
    assert "unknown kind 'Recrod' (known kinds: " in typo.stderr and "Record" in typo.stderr
    assert pg.execute("SELECT count(*) FROM work_pauses").fetchone() == (0,)
    good = run("--dsn", dsn, "pause", "--kind", "Record", "--app", app)
    assert good.returncode == 0 and good.stdout == "kind 'Record' paused\n", good.stderr
    assert run("--dsn", dsn, "pause", "--scope", "s", "--app", app).returncode == 2


def test_pause_kind_warns_of_a_kind_no_item_or_worker_ever_had(dsn: str, pg: Conn) -> None:
    """Without --app, a kind that no item, schedule or Worker has ever had is paused
    (an operator may pause ahead) with a warning that it may be a typo; a kind an item
    has, or a stopped Worker served, gets no warning."""
    pg.execute("INSERT INTO work_items (kind, status, finished_at, reason) VALUES"
               " ('Thumbnail', 'Succeeded', now(), 'done')")  # fmt: skip
    pg.execute(
        "INSERT INTO work_workers (id, host, pid, kinds, scopes, unscoped, concurrency,"
        " stopped_at) VALUES ('gone', 'h', 1, '{Transcode}', NULL, true, 1, now())"
    )
    typo = run("--dsn", dsn, "pause", "--kind", "Thumbnial")
    assert typo.returncode == 0 and typo.stdout == "kind 'Thumbnial' paused\n"
    assert "warning: no item, schedule or Worker has ever had kind 'Thumbnial': a typo?" in (
        typo.stderr
    )
    for kind in ("Thumbnail", "Transcode"):
        known = run("--dsn", dsn, "pause", "--kind", kind)
        assert known.returncode == 0 and "warning" not in known.stderr, known.stderr


def test_enqueue_warns_of_a_kind_no_live_worker_serves(dsn: str, pg: Conn, tmp_path: Any) -> None:
    """`enqueue Crawll` while a live Worker serves Crawl queues the item (exit 0, its id
    on stdout) and warns on stderr that it looks like a typo for 'Crawl'; a kind only a
    stopped Worker served is named as such; `enqueue --from` warns once a kind; a kind a
    live Worker serves gets no warning."""
    pg.execute(
        "INSERT INTO work_workers (id, host, pid, kinds, scopes, unscoped, concurrency)"
        " VALUES ('live', 'h', 1, '{Crawl,Thumbnail}', NULL, true, 1)"
    )
    pg.execute(
        "INSERT INTO work_workers (id, host, pid, kinds, scopes, unscoped, concurrency,"
        " stopped_at) VALUES ('gone', 'h', 2, '{Transcode}', NULL, true, 1, now())"
    )
    typo = run("--dsn", dsn, "enqueue", "Crawll")
    assert typo.returncode == 0 and re.fullmatch(r"\d+\n", typo.stdout), typo.stderr
    assert typo.stderr == (
        "warning: no live Worker serves kind 'Crawll': a typo for 'Crawl'?;"
        " its items wait until one does\n"
    )
    stopped = run("--dsn", dsn, "enqueue", "Transcode")
    assert "no live Worker serves kind 'Transcode' now (Workers served it before)" in (
        stopped.stderr
    )
    unknown = run("--dsn", dsn, "enqueue", "Zebra")
    assert "kind 'Zebra' (live Workers serve: Crawl, Thumbnail)" in unknown.stderr
    served = run("--dsn", dsn, "enqueue", "Crawl")
    assert served.returncode == 0 and served.stderr == "", served.stderr
    lines = tmp_path / "items.jsonl"
    lines.write_text('{"kind": "Thumbnial"}\n{"kind": "Thumbnial"}\n{"kind": "Crawl"}\n')
    batch = run("--dsn", dsn, "enqueue", "--from", str(lines))
    assert batch.returncode == 0, batch.stderr
    assert batch.stderr.count("warning:") == 1 and "a typo for 'Thumbnail'?" in batch.stderr
    assert pg.execute("SELECT count(*) FROM work_items WHERE status = 'Queued'").fetchone() == (7,)


# -- Workers: alive by their own interval, one per id ----------------------------------


def workers_of(dsn: str) -> list[dict[str, Any]]:
    result = run("--dsn", dsn, "status", "--json")
    assert result.returncode == 0, result.stderr
    found: list[dict[str, Any]] = json.loads(result.stdout)["workers"]
    return found


def test_a_sigkilled_worker_is_gone_from_status_within_three_of_its_intervals(
    dsn: str, tmp_path: Any
) -> None:
    """A Worker with a 4 s lease advertises every second; killed with SIGKILL (no stop
    recorded), `status` counts it alive for about three seconds more, not 180 (the
    default's three intervals): gone well inside 90 s."""
    with workers(tmp_path) as start:
        worker = start(dsn, "--lease", "4", "--heartbeat", "1", name="w1")
        wait_for(lambda: [w["alive"] for w in workers_of(dsn)] == [True], 60,
                 f"w1 to be alive:\n{worker.output()}")  # fmt: skip
        worker.signal(signal.SIGKILL)
        wait_for(lambda: [w["alive"] for w in workers_of(dsn)] == [False], 90, "w1 gone")
        [gone] = workers_of(dsn)
        assert gone["stopped_at"] is None  # killed: it never said it stopped


def test_a_worker_restarted_on_its_host_after_a_crash_takes_its_id_back_at_once(
    dsn: str, tmp_path: Any
) -> None:
    """A supervisor restarting a SIGKILLed w1 on the same host is not refused while the
    dead one's advertisement is still fresh: its process is gone, so the id is free."""
    with workers(tmp_path) as start:
        first = start(dsn, "--lease", "60", "--heartbeat", "5", name="w1")
        wait_for(lambda: [w["alive"] for w in workers_of(dsn)] == [True], 60,
                 f"w1 to be alive:\n{first.output()}")  # fmt: skip
        [before] = workers_of(dsn)
        first.signal(signal.SIGKILL)
        first.wait(timeout=30)  # reaped, as a supervisor does before it restarts
        second = start(dsn, "--lease", "60", "--heartbeat", "5", name="w1")
        wait_for(lambda: workers_of(dsn)[0]["pid"] != before["pid"], 30,
                 f"the new w1 to take the id:\n{second.output()}")  # fmt: skip
        [restarted] = workers_of(dsn)
        assert restarted["alive"] and second.proc.poll() is None, second.output()
        assert "in use by a live Worker" not in second.output()


def test_a_second_worker_with_a_live_workers_id_is_refused(dsn: str, tmp_path: Any) -> None:
    """`run --worker-id w1` beside a live w1 exits 1 naming it, and leaves the live one
    alive, not marked stopped; once w1 is killed and gone, a new w1 starts with a
    fresh started_at."""
    with workers(tmp_path) as start:
        first = start(dsn, "--lease", "4", "--heartbeat", "1", name="w1")
        wait_for(lambda: [w["alive"] for w in workers_of(dsn)] == [True], 60,
                 f"w1 to be alive:\n{first.output()}")  # fmt: skip
        [before] = workers_of(dsn)
        second = start(dsn, "--lease", "4", "--heartbeat", "1", name="w1")
        assert second.wait(timeout=60) == 1, second.output()
        assert "worker id 'w1' is in use by a live Worker" in second.output()
        [after] = workers_of(dsn)
        assert after["alive"] and after["stopped_at"] is None and after["pid"] == before["pid"]
        first.signal(signal.SIGKILL)
        wait_for(lambda: [w["alive"] for w in workers_of(dsn)] == [False], 30, "w1 gone")
        third = start(dsn, "--lease", "4", "--heartbeat", "1", name="w1")
        wait_for(lambda: [w["alive"] for w in workers_of(dsn)] == [True], 60,
                 f"the new w1 to be alive:\n{third.output()}")  # fmt: skip
        [restarted] = workers_of(dsn)
        assert restarted["pid"] != before["pid"]
        assert restarted["started_at"] > before["last_seen"]  # afresh
