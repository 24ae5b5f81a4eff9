"""`python -m trioworker`: run a Worker, migrate, sql, enqueue, show, wait, status, cancel,
retry, prune, pause, resume, quiesce, dashboard, demo.

Exit codes: 0 done; 1 a runtime error (a bad --app, an unreachable database, an
unmigrated schema; `wait`: the item ended Failed or Cancelled); 2 a usage error (bad
options or input, refused before anything connects); 70 fail-stop (a handler would not
stop); 75 `run`: another Worker took over this Worker's id while it seemed gone, so it
stopped; 124 `wait` timed out; 130 interrupted twice.

The global options (--dsn, --schema, --log-level, --log-format) go before or after the
command, and no error message ever shows a password: argparse's own are redacted too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import attrs

from trioworker._cli.exits import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from trioworker._cli.input import UsageError
from trioworker._cli.limits import add_limit_command
from trioworker._core.errors import ConfigurationError, TrioWorkerError
from trioworker._core.settings import DSN_ENV, QUIESCE_POLL, Settings
from trioworker._core.text import not_unicode, short_duration, visible
from trioworker._core.validation import MAX_PRIORITY, MAX_RUN_AFTER_DISTANCE, MIN_PRIORITY
from trioworker._postgres.schema_name import SCHEMA_ENV, resolve_schema
from trioworker._worker import logging as _logging

# Each verb imports what it needs when it runs (trioworker._cli.commands: Trio
# and psycopg, about half a second of CPU), so that --help and a usage
# error cost almost nothing (tests/integration/test_cli_edges.py holds it).

log = logging.getLogger("trioworker")

#: The longest any duration option may be: a week.
MAX_SECONDS = 7 * 24 * 3600.0


# -- values ---------------------------------------------------------------------------


def number(*, integer: bool = False, minimum: float = 0, maximum: float) -> Callable[[str], float]:
    """An argparse type: a finite number in [minimum, maximum], written in ASCII
    (Python's int and float take other scripts' digits, and 1_0)."""

    def parse(text: str) -> float:
        try:
            if not text.isascii() or "_" in text:
                raise ValueError(text)
            value: float = int(text) if integer else float(text)
        except ValueError:
            kind = "an integer" if integer else "a number"
            raise argparse.ArgumentTypeError(f"must be {kind}, not {text!r}") from None
        if not math.isfinite(value) or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"must be at least {_plain(minimum)} and at most {_plain(maximum)}, not {text!r}"
            )
        return value

    parse.__name__ = "integer" if integer else "number"  # argparse's error names it
    return parse


def _plain(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


#: The least each duration option of `run` takes, so that no setting turns a Worker
#: into a flood of transactions or log lines (docs/guide/operating.md#settings).
MINIMUM_SECONDS = {
    "lease": 1.0,  # a claim's hold: at least twice the heartbeat, past a slow commit
    "heartbeat": 0.1,  # a transaction and a log line's chance per running item
    "poll": 0.05,  # an idle Worker's claim transaction: at most 20 a second
    "shutdown_grace": 0.1,
    "stop_grace": 0.1,  # time for a cancelled handler to notice
}
COUNT = number(integer=True, minimum=1, maximum=100_000)
ITEM_ID = number(integer=True, minimum=1, maximum=2**63 - 1)

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", re.ASCII)


def duration_within(maximum: dt.timedelta) -> Callable[[str], dt.timedelta]:
    """An argparse type: a duration with its unit, 90s, 15m, 12h, 7d or 2w, up to
    `maximum`. A bare number is refused: `prune --older-than 5` must not mean five
    seconds to one reader and five days to another. Every duration option takes it."""

    def parse(text: str) -> dt.timedelta:
        match = _DURATION.fullmatch(text)
        if not match:
            raise argparse.ArgumentTypeError(
                f"must be a duration such as 90s, 15m, 12h, 7d or 2w, not {text!r}"
            )
        if not match[2]:
            raise argparse.ArgumentTypeError(
                f"give {text!r} a unit: {match[1]}s, {match[1]}m, {match[1]}h, {match[1]}d"
                f" or {match[1]}w"
            )
        span = dt.timedelta(seconds=float(match[1]) * _UNITS[match[2]])
        if span > maximum:
            raise argparse.ArgumentTypeError(
                f"must be at most {short_duration(maximum)}, not {text}"
            )
        return span

    parse.__name__ = "duration"  # argparse's error names it
    return parse


#: --older-than, --retain, --since: at most a century.
duration = duration_within(dt.timedelta(days=100 * 365))


def since(text: str) -> dt.datetime:
    """An argparse type: a time, as a duration ago (12h) or an ISO 8601 time with its
    timezone (2026-11-30T08:00Z)."""
    try:
        return dt.datetime.now(dt.UTC) - duration(text)
    except argparse.ArgumentTypeError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a duration ago (12h, 7d) or an ISO 8601 time, not {text!r}"
        ) from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"give {text!r} a timezone (such as Z or +01:00)")
    return when


def utf8(value: str) -> str:
    """An argparse type: text as given, refused unless valid UTF-8 (Python hands a
    command line's other bytes over as lone surrogates, which no database takes)."""
    why = not_unicode(value)
    if why is not None:
        raise argparse.ArgumentTypeError(f"must be UTF-8 text: {why}")
    return value


since.__name__ = "time"
utf8.__name__ = "text"


def _seconds(field: str) -> Callable[[str], float]:
    return number(minimum=MINIMUM_SECONDS[field], maximum=MAX_SECONDS)


#: The `run` options that set a Worker's Settings: (option, field, type, help). Their
#: defaults are Settings' own.
SETTINGS_OPTIONS = [
    ("--concurrency", "concurrency", COUNT, "items at once"),
    ("--lease", "lease", _seconds("lease"), "seconds"),
    ("--heartbeat", "heartbeat", _seconds("heartbeat"), "seconds"),
    ("--poll", "poll", _seconds("poll"), "seconds"),
    ("--max-stalls", "max_stalls", COUNT, "stalls before an item fails as stalled"),
    ("--max-concurrent-files", "max_concurrent_files", COUNT, "parallel file work"),
    ("--shutdown-grace", "shutdown_grace", _seconds("shutdown_grace"),
     "seconds running items get after SIGTERM"),
    ("--stop-grace", "stop_grace", _seconds("stop_grace"),
     "seconds a cancelled handler gets before fail-stop"),
]  # fmt: skip


def _setting_default(field: str) -> str:
    default = attrs.fields_dict(Settings)[field].default
    shown = "a quarter lease" if isinstance(default, attrs.Factory) else f"{default:g}"  # type: ignore[arg-type]
    least = MINIMUM_SECONDS.get(field)
    return shown if least is None else f"{shown}; at least {least:g}"


# -- the parser -------------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse, whose error messages never show a password from the command line."""

    secrets: tuple[str, ...] = ()

    def error(self, message: str) -> NoReturn:
        for secret in self.secrets:
            message = message.replace(secret, "***")
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {visible(message)}\n")


#: Options no command has, whose value is a secret all the same: argparse's error for
#: `dashboard --token SECRET` would show it.
SECRET_OPTION = re.compile(r"--?[\w-]*(?:token|passw|secret)[\w-]*", re.IGNORECASE)
NOT_SECRET = {"--token-file"}  # a path


#: What a text holding a libpq password has in it: a `password` keyword (libpq's
#: keywords are lower case; the shapes `secrets` guesses at are any case) or a URI.
MAY_HOLD_PASSWORD = re.compile(r"password|://", re.IGNORECASE)


def secrets_in(argv: Sequence[str]) -> tuple[str, ...]:
    """Passwords anywhere on a command line (in a DSN or a URI of any shape, PGPASSWORD,
    the value of an option named like a token or a password)."""
    found = {os.environ.get("PGPASSWORD", "")}
    for index, arg in enumerate(argv):
        if MAY_HOLD_PASSWORD.search(arg):  # libpq (psycopg) is imported only for these
            from trioworker._postgres.dsn import secrets

            found.update(secrets(arg.split("=", 1)[1] if arg.startswith("--dsn=") else arg))
        name, eq, value = arg.partition("=")
        if SECRET_OPTION.fullmatch(name) and name not in NOT_SECRET:
            found.add(value if eq else "".join(argv[index + 1 : index + 2]))
    return tuple(sorted((s for s in found if s), key=len, reverse=True))


def _globals(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The options every command takes, before or after it (after, they are given
    with SUPPRESS defaults, so they override only when actually given)."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    if not suppress:  # before the command only
        version = f"trioworker {_installed_version()}"
        parser.add_argument("--version", action="version", version=version)
    parser.add_argument(
        "--dsn", type=utf8, default=default(None), help="libpq connection string or URI"
    )
    parser.add_argument(
        "--schema",
        type=utf8,
        default=default(None),
        help=f"the PostgreSQL schema that holds the queue (default: ${SCHEMA_ENV}, else public)",
    )
    parser.add_argument(
        "--log-level", default=default("INFO"), choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument("--log-format", default=default("text"), choices=["text", "json"])


def _installed_version() -> str:
    try:
        return importlib.metadata.version("trioworker")
    except importlib.metadata.PackageNotFoundError:  # run from a tree nobody installed
        return "(not installed)"


def program_name(argv0: str) -> str:
    """How the user ran us, for the usage line: the console script by its name, else
    `python -m trioworker`."""
    name = os.path.basename(argv0)
    return "python -m trioworker" if name in ("__main__.py", "-m", "") else name


def build_parser(secrets: tuple[str, ...] = (), prog: str = "python -m trioworker") -> Parser:
    Parser.secrets = secrets
    parser = Parser(
        prog=prog,
        description="A PostgreSQL-backed work queue with Trio Workers.",
        epilog=f"DSN: --dsn, else ${DSN_ENV}, else libpq's PG* variables. Schema: --schema,"
        f" else ${SCHEMA_ENV}, else public. Exit codes: 0 done,"
        " 1 runtime error (wait: Failed or Cancelled), 2 usage error, 70 fail-stop,"
        " 75 id taken over (run), 124 wait timed out, 130 interrupted twice.",
    )
    _globals(parser, suppress=False)
    common = Parser(add_help=False)
    _globals(common, suppress=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, parents=[common])

    run = command("run", "run a Worker until SIGTERM/SIGINT")
    run.add_argument(
        "--app", type=utf8, required=True, metavar="MODULE:ATTR", help="a trioworker.Registry"
    )
    run.add_argument("--worker-id", type=utf8, help="default: HOST-PID")
    run.add_argument(
        "--scope",
        type=utf8,
        action="append",
        metavar="S",
        help="serve only this scope (repeat for more); default: every scope",
    )
    run.add_argument(
        "--unscoped",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also take unscoped items (default: yes without --scope, no with it)",
    )
    for option, field, type_, help in SETTINGS_OPTIONS:
        run.add_argument(option, dest=field, type=type_, default=None,
                         metavar="N" if type_ is COUNT else "SECONDS",
                         help=f"{help} ({_setting_default(field)})")  # fmt: skip
    run.add_argument(
        "--startup-timeout",
        type=number(maximum=MAX_SECONDS),
        default=60.0,
        metavar="SECONDS",
        help="give up if PostgreSQL cannot be reached at start for this long; 0: wait forever (60)",
    )
    run.add_argument("--listen-dsn", type=utf8, metavar="DSN",
                     help="a direct DSN for LISTEN when --dsn goes through PgBouncer in"
                     " transaction mode (default: --dsn; without notifications the Worker"
                     " polls)")  # fmt: skip
    run.add_argument("--processes", type=number(integer=True, minimum=1, maximum=1024),
                     default=1, metavar="N",
                     help="run N Worker processes (ids ID-1 .. ID-N) under the supervisor"
                     " every run has, which passes signals to them all and exits with 70"
                     " if any fail-stops (1)")  # fmt: skip
    # A Worker the supervisor started: the write end of its watchdog pipe.
    run.add_argument("--watchdog-fd", type=int, help=argparse.SUPPRESS)
    run.add_argument("--migrate", action="store_true", help="apply migrations first")
    run.add_argument("--retain", type=duration, metavar="DURATION",
                     help="delete finished items older than this (such as 7d), hourly, as one"
                     " periodic item that one Worker at a time runs")  # fmt: skip
    run.add_argument("--metrics-port", type=number(integer=True, minimum=0, maximum=65535),
                     metavar="PORT", help="serve Prometheus metrics on this port (0: any free"
                     " one, logged); needs the metrics extra (prometheus-client)")  # fmt: skip
    run.add_argument("--otel", action="store_true",
                     help="trace each attempt with OpenTelemetry, set up by the OTEL_*"
                     " variables; needs the otel extra (opentelemetry-sdk)")  # fmt: skip

    migrate = command("migrate", "apply database migrations (safe to run concurrently)")
    migrate.add_argument(
        "--app",
        type=utf8,
        metavar="MODULE:ATTR",
        help="also apply the migrations of this app's Registry(migrations=...)",
    )

    sql = command("sql", "print the queue's migrations as one SQL script, for an application's"
                  " own migration tool (Alembic, Django, Flyway); connects to nothing")  # fmt: skip
    sql.add_argument("--from", dest="from_migration", metavar="ID",
                     help="start at this migration (such as 0002.x): those the database"
                     " lacks; default: all")  # fmt: skip

    _enqueue(command)

    show = command("show", "one item: its fields, payload, attempts and traceback")
    show.add_argument("id", type=ITEM_ID)
    show.add_argument("--json", action="store_true", help="machine-readable output")

    wait = command(
        "wait",
        "wait until an item has ended and print its result (exit 0 Succeeded, 1 Failed or"
        " Cancelled, 124 timed out)",
    )
    wait.add_argument("id", type=ITEM_ID)
    wait.add_argument("--timeout", type=duration_within(dt.timedelta(seconds=MAX_SECONDS)),
                      metavar="DURATION", help="give up after this long (such as 30s;"
                      " default: wait as long as it takes)")  # fmt: skip

    status = command("status", "items by kind and status, Workers, running items, failures")
    status.add_argument("--json", action="store_true", help="machine-readable output")

    cancel = command("cancel", "cancel a queued item, or ask a running one to stop")
    cancel.add_argument("id", type=ITEM_ID)

    _operating(command)
    add_limit_command(command)
    _dashboard(command)

    demo = command("demo", "the media-library demo, on a private PostgreSQL")
    demo.add_argument("--duration", type=number(minimum=1, maximum=MAX_SECONDS), default=40.0,
                      help="seconds of load (40; at least 1)")  # fmt: skip
    demo.add_argument("--users", type=number(integer=True, minimum=1, maximum=8), default=3)
    return parser


def _enqueue(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """`enqueue`: one item from its options, or many `--from` a JSON Lines file."""
    enqueue = command(
        "enqueue", "queue a work item (or many, --from a JSON Lines file); prints the ids"
    )
    enqueue.add_argument("kind", type=utf8, nargs="?", help="the item's kind (not with --from)")
    enqueue.add_argument("--from", dest="from_file", metavar="FILE.jsonl|-",
                         help="one item per line: a JSON object with kind and any of scope,"
                         " payload, dedup_key, delay, priority, after (a list of ids); all"
                         " queued or none")  # fmt: skip
    enqueue.add_argument("--scope", type=utf8)
    enqueue.add_argument("--payload", metavar="JSON|@FILE|-",
                         help="the payload: JSON, @FILE to read it from a file, - for stdin"
                         " (64 KiB at most)")  # fmt: skip
    enqueue.add_argument("--dedup-key", type=utf8)
    enqueue.add_argument(
        "--delay",
        type=duration_within(MAX_RUN_AFTER_DISTANCE),
        metavar="DURATION",
        help="due this long from now (such as 90s, 15m or 1h); due at once by default",
    )
    enqueue.add_argument(
        "--priority",
        type=number(integer=True, minimum=MIN_PRIORITY, maximum=MAX_PRIORITY),
        default=0,
        metavar="N",
        help=f"{MIN_PRIORITY}..{MAX_PRIORITY}; higher is claimed sooner (0)",
    )
    enqueue.add_argument("--after", type=ITEM_ID, action="append", metavar="ID",
                         help="run only after item ID has Succeeded (repeat for more): the"
                         " item waits until then, and is cancelled if ID fails or is"
                         " cancelled")  # fmt: skip
    enqueue.add_argument(
        "--app", type=utf8, metavar="MODULE:ATTR", help="reject kinds it has no handler for"
    )


def _operating(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """The commands that operate on a running queue: retry, prune, pause, resume, quiesce."""
    retry = command("retry", "put failed or cancelled items back in the queue, fresh budget")
    retry.add_argument("ids", nargs="*", type=ITEM_ID, metavar="ID")
    retry.add_argument("--failed", action="store_true", help="every Failed item (of --kind)")
    retry.add_argument("--kind", type=utf8, help="with --failed: only items of this kind")
    retry.add_argument("--since", type=since, metavar="TIME",
                       help="with --failed: failed since then (12h, or ISO 8601)")  # fmt: skip

    prune = command("prune", "delete old finished items, in short batches")
    prune.add_argument("--older-than", type=duration, required=True, metavar="DURATION",
                       help="finished longer ago than this (such as 7d)")  # fmt: skip
    prune.add_argument(
        "--status",
        action="append",
        choices=["Succeeded", "Failed", "Cancelled"],
        help="only items of this status (repeat for more; default: all three)",
    )
    prune.add_argument("--batch", type=COUNT, default=1000, metavar="N", help="rows per batch")
    prune.add_argument("--dry-run", action="store_true",
                       help="only count the items it would delete")  # fmt: skip

    for verb, help in (("pause", "stop claiming a kind's or a scope's items (running ones go"
                        " on)"), ("resume", "lift a pause")):  # fmt: skip
        parser = command(verb, help)
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--kind", type=utf8)
        target.add_argument("--scope", type=utf8)
        parser.add_argument("--app", type=utf8, metavar="MODULE:ATTR",
                            help="with --kind: refuse a kind it has no handler for (without"
                            " it, a kind no item or Worker ever had is warned of)")  # fmt: skip

    quiesce = command(
        "quiesce",
        "pause a scope and wait until nothing can still be writing for it (exit 0), or"
        " time out (exit 1) saying what holds it",
    )
    quiesce.add_argument("--scope", type=utf8, required=True)
    quiesce.add_argument("--timeout", type=number(minimum=QUIESCE_POLL, maximum=MAX_SECONDS),
                         default=300.0, metavar="SECONDS",
                         help=f"give up after this long (300; at least {QUIESCE_POLL:g})",
                         )  # fmt: skip


def _dashboard(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """`dashboard`: the web dashboard (docs/dashboard.md); its extra is imported only
    when it runs."""
    dashboard = command(
        "dashboard",
        "serve the web dashboard (read-only unless --allow-actions); needs the dashboard"
        " extra (starlette, hypercorn, jinja2)",
    )
    dashboard.allow_abbrev = False  # `--token SECRET` must not pass for --token-file
    dashboard.add_argument(
        "--host",
        type=utf8,
        default="127.0.0.1",
        help="listen on this address (127.0.0.1: this machine)",
    )
    dashboard.add_argument(
        "--allowed-host", action="append", default=[], metavar="NAME",
        help="a host name it answers to (repeat for more); needed with a --host beyond"
        " loopback, so no other site's page can read it (DNS rebinding)",
    )  # fmt: skip
    dashboard.add_argument(
        "--port", type=number(integer=True, minimum=0, maximum=65535), default=8080,
        metavar="PORT", help="0: any free one, logged (8080)",
    )  # fmt: skip
    dashboard.add_argument(
        "--allow-actions", action="store_true",
        help="offer retry, cancel, pause, resume and quiesce to whoever signs in with the token",
    )  # fmt: skip
    dashboard.add_argument(
        "--token-file", metavar="PATH",
        help="read the actions' token from this file (default: $TRIOWORKER_DASHBOARD_TOKEN)",
    )  # fmt: skip


def run_command(args: argparse.Namespace) -> int:
    """Run the verb: `trioworker._cli.commands.cmd_<verb>`, imported only now."""
    from trioworker._cli import commands

    if args.command == "run":
        fields = [field for _, field, _, _ in SETTINGS_OPTIONS]
        return commands.cmd_run(args, commands.worker_settings(args, fields))
    command: Callable[[argparse.Namespace], int] = getattr(commands, f"cmd_{args.command}")
    return command(args)


# -- main -------------------------------------------------------------------------------


#: Commands that use no database given by the DSN: `sql` connects to nothing, the demo
#: starts a PostgreSQL of its own.
NO_DATABASE = {"sql", "demo"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(secrets_in(argv), program_name(sys.argv[0])).parse_args(argv)
    args.argv = argv  # `run --processes N` starts its Workers with it
    args.dsn_given = args.dsn is not None or DSN_ENV in os.environ
    raw_dsn = args.dsn if args.dsn is not None else os.environ.get(DSN_ENV, "")
    from trioworker._postgres.dsn import secrets

    listen_dsn = getattr(args, "listen_dsn", None) or ""
    _logging.configure(
        args.log_level, args.log_format, secrets=secrets(raw_dsn) + secrets(listen_dsn)
    )
    if args.log_level != "DEBUG":  # yoyo tells every step it applies
        logging.getLogger("yoyo").setLevel(logging.WARNING)
    try:
        return _run_reporting_one_error(args, raw_dsn)
    except BrokenPipeError:  # `status --json | head`: the reader has all it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _run_reporting_one_error(args: argparse.Namespace, raw_dsn: str) -> int:
    """Run the verb; a usage or operating error it raises, alone or as the one error of
    a Trio nursery's group, is the one line it ends with."""
    from trioworker._postgres.dsn import describe_defaults, resolve_dsn

    try:
        args.dsn = resolve_dsn(args.dsn)
        try:
            args.schema = resolve_schema(args.schema)
        except ConfigurationError as exc:  # refused before anything connects
            raise UsageError(f"--schema or ${SCHEMA_ENV}: {exc}") from None
        if not args.dsn and args.command not in NO_DATABASE:
            log.info("no DSN given (--dsn or $%s): %s", DSN_ENV, describe_defaults())
        return run_command(args)
    except BaseExceptionGroup as group:
        error = _sole(group)
        if not isinstance(error, (TrioWorkerError, ValueError)):
            raise
        return _report_error(error, raw_dsn, args.log_format)
    except (TrioWorkerError, ValueError) as exc:
        return _report_error(exc, raw_dsn, args.log_format)


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception `group` holds through groups of one, or `group` itself."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def _report_error(error: BaseException, dsn: str, log_format: str) -> int:
    code = EXIT_USAGE if isinstance(error, UsageError) else EXIT_ERROR
    return report(f"{error}", dsn, log_format, code)


def report(message: str, dsn: str, log_format: str, code: int) -> int:
    """The one line a failed command ends with: as a log line in JSON mode; in text,
    what it quotes (a kind, a database's message) shown `visible`."""
    from trioworker._postgres.dsn import redact

    message = redact(message, dsn)
    if log_format == "json":
        log.error("%s", message)
    else:
        print(f"trioworker: error: {visible(message, lines=True)}", file=sys.stderr)
    return code


__all__ = ["main"]
