"""Every bad input a new user tried (issue 11), through the real command line: the
message, the exit code (2 usage, 1 runtime), and never a password anywhere."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.test_cli import with_password
from tests.support.processes import ROOT

Conn = psycopg.Connection[Any]
SECRET = "S3cretPW"
APP = "tests.apps.recording:registry"
#: A server that does not answer, with a password: every command that connects fails.
UNREACHABLE = f"host=127.0.0.1 port=1 user=app password={SECRET} dbname=media connect_timeout=1"


def run(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> Any:
    environment = {k: v for k, v in os.environ.items() if k != "TRIOWORKER_DSN"}
    result = subprocess.run(
        [sys.executable, "-m", "trioworker", *args],
        cwd=ROOT,
        env={**environment, **(env or {})},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert SECRET not in result.stdout and SECRET not in result.stderr, result.stderr
    return result


COMMANDS = [
    ["run", "--app", APP, "--startup-timeout", "1"],
    ["migrate"],
    ["enqueue", "Record"],
    ["show", "1"],
    ["status"],
    ["cancel", "1"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.parametrize("where", ["before", "after", "env", "stray"])
def test_no_error_path_prints_the_password(command: list[str], where: str) -> None:
    """The DSN (with a password) before the command, after it, in $TRIOWORKER_DSN, or a
    password in a stray argument argparse rejects: every command fails on the dead
    server (or the stray argument) with one line, and the password never shows."""
    dsn = ["--dsn", UNREACHABLE]
    args, env = {
        "before": ([*dsn, "--log-level", "DEBUG", *command], None),
        "after": ([*command, *dsn, "--log-level", "DEBUG"], None),
        "env": ([*command, "--log-level", "DEBUG"], {"TRIOWORKER_DSN": UNREACHABLE}),
        "stray": ([*command, *dsn, f"password={SECRET}"], None),
    }[where]
    result = run(*args, env=env)
    if where == "stray":
        assert result.returncode == 2
        assert "unrecognized arguments: password=***" in result.stderr
    else:
        assert result.returncode == 1, result.stderr
        assert "cannot connect to PostgreSQL" in result.stderr.strip().splitlines()[-1]


#: DSNs libpq cannot parse, or reads a piece of the password from as a port or a host.
MALFORMED_DSNS = [
    f"postgresql://u:{SECRET}%zz@127.0.0.1/db",
    f"postgresql://u:{SECRET}@[::1/db",
    f"postgresql://127.0.0.1/db?password={SECRET}%zz",
    f"host=127.0.0.1 password='{SECRET} port=1",
    f"host=127.0.0.1 password={SECRET} port",
    "postgresql://u:S3cret/PW@127.0.0.1/db",
]


@pytest.mark.parametrize("bad_dsn", MALFORMED_DSNS)
@pytest.mark.parametrize("where", ["--dsn", "env", "json"])
def test_a_malformed_dsn_never_shows_its_password(bad_dsn: str, where: str) -> None:
    """A DSN libpq cannot parse (or parses wrongly) given by --dsn, by $TRIOWORKER_DSN,
    or with --log-format json: one error line (exit 1), no piece of the password in it."""
    args, env = {
        "--dsn": (["--dsn", bad_dsn, "status"], None),
        "env": (["status"], {"TRIOWORKER_DSN": bad_dsn}),
        "json": (["--log-format", "json", "--dsn", bad_dsn, "status"], None),
    }[where]
    result = run(*args, env=env)
    assert result.returncode == 1, result.stderr
    assert "S3cret" not in result.stderr and "PW" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    message = json.loads(last)["message"] if where == "json" else last
    assert "bad DSN" in message or "cannot connect to PostgreSQL" in message, message


def test_an_unknown_secret_option_is_masked_in_argparses_error() -> None:
    """`dashboard --token SECRET` (there is no --token: a value would show in `ps`) is a
    usage error whose message does not echo the value, given apart or with `=`."""
    token = "tok-Zq81xVv"  # not the DSN's password, which is masked anyway
    for args in (["--token", token], [f"--token={token}"]):
        result = run("--dsn", "host=/nonexistent", "dashboard", "--allow-actions", *args)
        assert result.returncode == 2
        assert "unrecognized arguments: --token" in result.stderr and "***" in result.stderr
        assert token not in result.stderr


def test_global_options_work_after_the_command(dsn: str) -> None:
    """`status --dsn ... --log-format json` is the same as with the options first."""
    secret_dsn = with_password(dsn, SECRET)  # trust authentication ignores it
    after = run("status", "--json", "--dsn", secret_dsn, "--log-format", "json")
    before = run("--dsn", secret_dsn, "--log-format", "json", "status", "--json")
    assert after.returncode == before.returncode == 0
    assert json.loads(after.stdout)["totals"] == json.loads(before.stdout)["totals"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", "K", "--delay", "inf"], "--delay: must be a duration such as 90s"),
        (["enqueue", "K", "--delay", "1e20s"], "--delay: must be a duration such as 90s"),
        (["enqueue", "K", "--delay", "367d"], "--delay: must be at most 366d, not 367d"),
        (["enqueue", "K", "--delay", "nan"], "--delay: must be a duration"),
        (["enqueue", "K", "--delay", "soon"], "--delay: must be a duration such as 90s, 15m"),
        (["enqueue", "K", "--priority", "1001"], "--priority: must be at least -1000 and at most"),
        (["enqueue", "K", "--payload", "{"], "--payload is not valid JSON"),
        (["enqueue", "K", "--payload", "@/no/such/file"], "cannot read --payload file"),
        (["enqueue", "K", "--scope", ""], "scope must not be empty"),
        (["run", "--app", APP, "--lease", "inf"], "--lease: must be at least 1 and at most 604800"),
        (["run", "--app", APP, "--lease", "-1"], "--lease: must be at least 1"),
        (["run", "--app", APP, "--concurrency", "0"], "--concurrency: must be at least 1"),
        (
            ["run", "--app", APP, "--metrics-port", "70000"],
            "--metrics-port: must be at least 0 and at most 65535",
        ),
        (["run", "--app", APP, "--lease", "10", "--heartbeat", "6"], "shorter than half the lease"),
        (["run", "--app", APP, "--no-unscoped"], "--no-unscoped needs --scope"),
        (["run", "--app", APP, "--scope", ""], "--scope '': scope must not be empty"),
        (["show", "x"], "show: error: argument id: must be an integer, not 'x'"),
        # Issue 18, case 9: each names its field.
        (["enqueue", "K\udcff"], "argument kind: must be UTF-8 text: byte 0xff at character 2"),
        (["enqueue", "K", "--scope", "s\udcfe"], "argument --scope: must be UTF-8 text"),
        (["enqueue", "K", "--dedup-key", "\udc80"], "argument --dedup-key: must be UTF-8 text"),
        (
            ["enqueue", "K", "--payload", '{"a": "\udcff"}'],
            "--payload holds text that is not valid Unicode: byte 0xff",
        ),
        (
            ["enqueue", "K", "--payload", '{"a": "\\ud800"}'],
            "--payload holds text that is not valid Unicode: a lone surrogate U+D800",
        ),
        (["enqueue", "K", "--payload", '{"\\udfff": 1}'], "--payload holds text that is not"),
        (["enqueue", "K", "--payload", "[1, NaN]"], "--payload holds NaN, which JSON does not"),
        (["enqueue", "K", "--payload", "[" * 65 + "]" * 65], "--payload nests deeper than 64"),
        (
            ["enqueue", "K", "--payload", "[" * 50_000 + "]" * 50_000],
            "--payload is nested too deeply: a payload nests 64 levels at most",
        ),
        (["pause", "--kind", "k\udcff"], "argument --kind: must be UTF-8 text"),
        (["quiesce", "--scope", "\udcff"], "argument --scope: must be UTF-8 text"),
        (["run", "--app", APP, "--scope", "\udcff"], "argument --scope: must be UTF-8 text"),
        (["enqueue", "K", "--priority", "\u0661\u0660"], "--priority: must be an integer"),
        (["enqueue", "K", "--priority", "1_0"], "--priority: must be an integer, not '1_0'"),
        (["enqueue", "K", "--delay", "\u0663s"], "--delay: must be a duration"),
        (["show", "\u0661"], "argument id: must be an integer"),
        (["prune", "--older-than", "\u0667d"], "--older-than: must be a duration"),
        (["run", "--app", APP, "--poll", "1e-9"], "--poll: must be at least 0.05 and at most"),
        (["run", "--app", APP, "--heartbeat", "1e-9"], "--heartbeat: must be at least 0.1"),
        (["run", "--app", APP, "--lease", "0.5"], "--lease: must be at least 1"),
        (["run", "--app", APP, "--stop-grace", "0.01"], "--stop-grace: must be at least 0.1"),
        (["run", "--app", APP, "--shutdown-grace", "0"], "--shutdown-grace: must be at least"),
        (["quiesce", "--scope", "s", "--timeout", "0.01"], "--timeout: must be at least 0.1"),
    ],
)
def test_bad_input_is_a_usage_error_before_anything_connects(args: list[str], message: str) -> None:
    """Each is refused with exit 2 and a message naming the problem, before connecting
    (the DSN points at a server that does not answer, so connecting would be exit 1)."""
    result = run("--dsn", UNREACHABLE, *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_extra_names_the_install_line(tmp_path: Path) -> None:
    """--metrics-port without prometheus_client installed: exit 1, with the pip line."""
    fake = tmp_path / "prometheus_client"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('not installed')\n")
    result = run("--dsn", UNREACHABLE, "run", "--app", APP, "--metrics-port", "9911",
                 env={"PYTHONPATH": str(tmp_path)})  # fmt: skip
    assert result.returncode == 1
    assert "pip install prometheus-client" in result.stderr


def test_payloads_from_a_file_and_from_stdin_and_the_limit(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """--payload @FILE and --payload - work (a payload too big for an argument list);
    one over 64 KiB is refused, from the CLI and from plain SQL alike."""
    path = tmp_path / "payload.json"
    path.write_text(json.dumps({"paths": ["/m/" + "x" * 100] * 500}))  # ~53 KiB
    assert run("--dsn", dsn, "enqueue", "K", "--payload", f"@{path}").returncode == 0
    assert run("--dsn", dsn, "enqueue", "K", "--payload", "-", stdin='{"a": 1}').returncode == 0
    rows = pg.execute("SELECT payload FROM work_items ORDER BY id").fetchall()
    assert len(rows[0][0]["paths"]) == 500 and rows[1][0] == {"a": 1}
    path.write_text(json.dumps({"blob": "x" * 70_000}))
    too_big = run("--dsn", dsn, "enqueue", "K", "--payload", f"@{path}")
    assert too_big.returncode == 2 and "the limit is 65536" in too_big.stderr
    with pytest.raises(psycopg.errors.CheckViolation, match="work_items_payload_fits"):
        pg.execute(
            "INSERT INTO work_items (kind, payload)"
            " VALUES ('K', jsonb_build_object('b', %s::text))",
            ["x" * 10_000_000],
        )


def test_a_payload_just_under_the_limit_is_stored(dsn: str, pg: Conn, tmp_path: Path) -> None:
    """64,007 bytes of compact JSON are 96,006 as jsonb's text (a space after each
    comma): the database's check must not refuse what the library accepts."""
    path = tmp_path / "payload.json"
    path.write_text(json.dumps({"n": [1] * 32_000}, separators=(",", ":")))
    assert run("--dsn", dsn, "enqueue", "K", "--payload", f"@{path}").returncode == 0
    assert pg.execute("SELECT jsonb_array_length(payload->'n') FROM work_items").fetchone() == (
        32_000,
    )


def test_a_broken_pipe_is_quiet(dsn: str) -> None:
    """`status --json | head -c 10`: no traceback when the reader stops reading."""
    for _ in range(30):
        assert run("--dsn", dsn, "enqueue", "K").returncode == 0
    result = subprocess.run(
        f"{sys.executable} -m trioworker --dsn '{dsn}' status --json | head -c 10",
        shell=True, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert len(result.stdout) == 10 and result.stderr == ""


def test_in_json_log_mode_the_final_error_is_a_json_line() -> None:
    """With --log-format json, even the line a failed command ends with is JSON."""
    result = run("--dsn", UNREACHABLE, "--log-format", "json", "status")
    assert result.returncode == 1
    last = json.loads(result.stderr.strip().splitlines()[-1])
    assert last["level"] == "ERROR" and "cannot connect to PostgreSQL" in last["message"]


def test_with_no_dsn_the_error_names_where_libpq_went() -> None:
    """No --dsn and no $TRIOWORKER_DSN: the error says so, and names libpq's target."""
    env = {"PGHOST": "127.0.0.1", "PGPORT": "1", "PGCONNECT_TIMEOUT": "1", "PGUSER": "nobody"}
    result = run("status", env=env)
    assert result.returncode == 1
    assert "no DSN given, so libpq connects as user nobody" in result.stderr
    assert "on 127.0.0.1, port 1" in result.stderr


def test_migrate_says_one_line_per_migration(databases: Any) -> None:
    """migrate is quiet: one line per migration applied, none of yoyo's steps."""
    with databases.database(migrated=False) as dsn:
        first = run("--dsn", dsn, "migrate")
        again = run("--dsn", dsn, "migrate")
    assert first.returncode == 0 and first.stderr == ""
    assert first.stdout.splitlines() == [
        "applied 0001.queue",
        "applied 0002.results-steps",
        "applied 0003.dependencies",
        "applied 0004.claim-kind-room",
        "applied 0005.spent-scopes",
    ]  # fmt: skip
    assert again.stdout == "schema is up to date\n"


def test_status_fits_80_columns(dsn: str, pg: Conn) -> None:
    """The status tables, rendered 80 columns wide, wrap no line; the counts have a
    Waiting column (items enqueued after others), before Queued."""
    pg.execute("INSERT INTO work_items (kind, scope) VALUES ('Crawl', 'cfg-7')")
    pg.execute("INSERT INTO work_items (kind, after) SELECT 'Thumbnail', ARRAY[min(id)]"
               " FROM work_items")  # fmt: skip
    pg.execute(
        "INSERT INTO work_items (kind, scope, status, finished_at, reason, error) VALUES"
        " ('Thumbnail', 'cfg-7', 'Failed', now(), 'failed 5 of 5 attempts',"
        " 'KeyError: ''path''')"
    )
    result = run("--dsn", dsn, "status", env={"COLUMNS": "80"})
    assert result.returncode == 0
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    assert "2026" in result.stdout or "20" in result.stdout  # the timestamp, whole
    lines = [line.split() for line in result.stdout.splitlines()]
    assert ["kind", "Waiting", "Queued", "Running", "Succeeded", "Failed", "Cancelled"] in lines
    assert ["Thumbnail", "1", "·", "·", "·", "1", "·"] in lines


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"kind": "K", "delay": 1e18}', "line 2: delay must be seconds from 0 to 31622400"),
        ('{"kind": "K", "delay": Infinity}', "line 2: delay must be seconds from 0 to"),
        ('{"kind": "K", "delay": NaN}', "line 2: delay must be seconds from 0 to"),
        ('{"kind": "K", "priority": Infinity}', "line 2: priority must be an integer"),
        ('{"kind": "K", "payload": {"a": "\\ud800"}}',
         "line 2: payload holds text that is not valid Unicode: a lone surrogate U+D800"),
        ('{"kind": "K\\udcff"}', "line 2: kind is not valid Unicode"),
        ('{"kind": "K", "scope": "\\ud800"}', "line 2: scope is not valid Unicode"),
        ('{"kind": "K", "dedup_key": "\\udfff"}', "line 2: dedup_key is not valid Unicode"),
        ('{"kind": "K", "payload": [-Infinity]}', "line 2: payload holds -Infinity"),
        ('{"kind": "K", "payload": ' + "[" * 65 + "]" * 65 + "}",
         "line 2: payload nests deeper than 64 levels"),
        ('{"kind": "K", "payload": ' + "[" * 980 + "]" * 980 + "}",
         "line 2: payload nests deeper than 64 levels"),
        ('{"kind": "K", "payload": ' + "[" * 100_000 + "]" * 100_000 + "}",
         "line 2 is nested too deeply: a payload nests 64 levels at most"),
    ],
)  # fmt: skip
def test_a_bad_from_line_is_a_usage_error_naming_it(
    dsn: str, pg: Conn, tmp_path: Path, line: str, message: str
) -> None:
    """A line whose delay no timedelta holds, whose text is not Unicode (a JSON escape
    of a lone surrogate), or whose payload nests too deeply: exit 2 naming the line and
    the field, one line of error, and nothing written (the good line 1 neither)."""
    path = tmp_path / "items.jsonl"
    path.write_text('{"kind": "K"}\n' + line + "\n", encoding="utf-8")
    result = run("--dsn", dsn, "enqueue", "--from", str(path))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert pg.execute("SELECT count(*) FROM work_items").fetchone() == (0,)


def test_a_payload_file_nested_980_deep_is_a_usage_error(
    dsn: str, pg: Conn, tmp_path: Path
) -> None:
    """`enqueue K --payload @deep.json` nested 980 deep (a RecursionError traceback
    once): exit 2 saying how deep a payload may nest, nothing written; so is a file
    that never ends (/dev/zero), read no further than a bound."""
    path = tmp_path / "deep.json"
    path.write_text("[" * 980 + "]" * 980)
    deep = run("--dsn", dsn, "enqueue", "K", "--payload", f"@{path}")
    assert deep.returncode == 2, deep.stderr
    assert f"--payload file '{path}' nests deeper than 64 levels" in deep.stderr
    endless = run("--dsn", dsn, "enqueue", "K", "--payload", "@/dev/zero")
    assert endless.returncode == 2 and "is longer than 1048576 bytes" in endless.stderr
    assert pg.execute("SELECT count(*) FROM work_items").fetchone() == (0,)


def test_from_splits_lines_at_newlines_only(dsn: str, pg: Conn, tmp_path: Path) -> None:
    """JSON Lines whose strings hold U+2028, U+0085 (NEL), a raw \\x1e and a \\r, with
    \\r\\n line ends: each line is one item, its payload stored exactly."""
    texts = ["a\u2028b", "c\u0085d", "e\x1ef", "g\rh"]
    lines = [f'{{"kind": "K", "payload": "{t}"}}' for t in texts]
    path = tmp_path / "items.jsonl"
    path.write_bytes("\r\n".join(lines).encode() + b"\r\n")
    result = run("--dsn", dsn, "enqueue", "--from", str(path))
    assert result.returncode == 0, result.stderr
    rows = pg.execute("SELECT payload FROM work_items ORDER BY id").fetchall()
    assert [r[0] for r in rows] == texts


def test_a_token_file_longer_than_4_kib_is_refused(tmp_path: Path) -> None:
    """--token-file naming a file of more than 4 KiB, or /dev/zero (once read until
    about 1.9 GB): a usage error, exit 2, before anything connects."""
    long = tmp_path / "token"
    long.write_text("t" * 4097)
    long.chmod(0o600)
    for path in (str(long), "/dev/zero"):
        result = run("--dsn", UNREACHABLE, "dashboard", "--allow-actions", "--token-file", path)
        assert result.returncode == 2, result.stderr
        assert f"--token-file '{path}' is longer than 4096 bytes" in result.stderr


@pytest.mark.parametrize("scope", [" ws ", "it's $(x) ; y", "disk\x1b]0;t\x07-7\u0085"])
def test_the_resume_command_quiesce_suggests_resumes_that_scope(dsn: str, scope: str) -> None:
    """`quiesce` of a scope with spaces, quotes, shell syntax or control characters
    prints a resume command quoted for a shell (no raw control character in it); run
    as printed by bash, it resumes exactly that scope."""
    quiet = run("--dsn", dsn, "quiesce", "--scope", scope, "--timeout", "10")
    assert quiet.returncode == 0, quiet.stderr
    assert "\x1b" not in quiet.stdout and "\x85" not in quiet.stdout
    command = quiet.stdout.split("(it stays paused: ", 1)[1].removesuffix(")\n")
    assert command.startswith("python -m trioworker resume --scope ")
    resumed = subprocess.run(
        ["bash", "-c", command.replace("python", shlex.quote(sys.executable), 1)],
        cwd=ROOT, env={**os.environ, "TRIOWORKER_DSN": dsn},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == f"scope {scope!r} resumed\n"


def test_the_console_script_names_itself_and_tells_its_version() -> None:
    """Installed as `trioworker`, the usage line says `trioworker`, not `python -m
    trioworker`; `--version` prints the version pyproject.toml gives."""
    script = Path(sys.executable).parent / "trioworker"
    usage = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: trioworker "), usage.stdout
    version = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    declared = next(
        line.split('"')[1]
        for line in (ROOT / "pyproject.toml").read_text().splitlines()
        if line.startswith("version = ")
    )
    assert version.returncode == 0 and version.stdout == f"trioworker {declared}\n"
    module = run("--help")
    assert module.stdout.startswith("usage: python -m trioworker "), module.stdout
