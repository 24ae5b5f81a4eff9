"""`python -m trioworker`: run a Worker, migrate, enqueue, show, status, cancel, retry,
prune, pause, resume, quiesce, dashboard, demo.

Exit codes: 0 done; 1 a runtime error (a bad --app, an unreachable database, an
unmigrated schema); 2 a usage error (bad options or input, refused before anything
connects); 70 fail-stop (a handler would not stop); 130 interrupted twice.

The global options (--dsn, --log-level, --log-format) go before or after the command,
and no error message ever shows a password: argparse's own are redacted too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import attrs

from trioworker._cli import commands as _commands
from trioworker._cli.commands import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE
from trioworker._cli.input import UsageError
from trioworker._cli.limits import add_limit_command, cmd_limit
from trioworker._core.errors import TrioWorkerError
from trioworker._core.settings import Settings
from trioworker._core.text import not_unicode, visible
from trioworker._core.validation import MAX_PRIORITY, MAX_RUN_AFTER_DISTANCE, MIN_PRIORITY
from trioworker._postgres.dsn import DSN_ENV, describe_defaults, redact, resolve_dsn, secrets
from trioworker._store.quiesce import QUIESCE_POLL
from trioworker._worker import logging as _logging
from trioworker._worker.worker import default_worker_id

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


def duration(text: str) -> dt.timedelta:
    """An argparse type: a duration as 90, 90s, 15m, 12h, 7d or 2w (at least 0)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text, re.ASCII)
    if not match:
        raise argparse.ArgumentTypeError(
            f"must be a duration such as 90s, 15m, 12h, 7d or 2w, not {text!r}"
        )
    seconds = float(match[1]) * _UNITS[match[2] or "s"]
    if seconds > 100 * 366 * 86400:
        raise argparse.ArgumentTypeError(f"must be at most a century, not {text}")
    return dt.timedelta(seconds=seconds)


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


duration.__name__ = "duration"
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


def secrets_in(argv: Sequence[str]) -> tuple[str, ...]:
    """Passwords anywhere on a command line (in a DSN or a URI of any shape, PGPASSWORD,
    the value of an option named like a token or a password)."""
    found = {os.environ.get("PGPASSWORD", "")}
    for index, arg in enumerate(argv):
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

    parser.add_argument(
        "--dsn", type=utf8, default=default(None), help="libpq connection string or URI"
    )
    parser.add_argument(
        "--log-level", default=default("INFO"), choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument("--log-format", default=default("text"), choices=["text", "json"])


def build_parser(secrets: tuple[str, ...] = ()) -> Parser:
    Parser.secrets = secrets
    parser = Parser(
        prog="python -m trioworker",
        description="A PostgreSQL-backed work queue with Trio Workers.",
        epilog=f"DSN: --dsn, else ${DSN_ENV}, else libpq's PG* variables. Exit codes: 0 done,"
        " 1 runtime error, 2 usage error, 70 fail-stop, 130 interrupted twice.",
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
    run.add_argument(
        "--worker-id", type=utf8, default=default_worker_id(), help="default: HOST-PID"
    )
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
    run.add_argument("--migrate", action="store_true", help="apply migrations first")
    run.add_argument("--retain", type=duration, metavar="DURATION",
                     help="delete finished items older than this (such as 7d), hourly, as one"
                     " periodic item that one Worker at a time runs")  # fmt: skip
    run.add_argument("--metrics-port", type=number(integer=True, minimum=0, maximum=65535),
                     metavar="PORT", help="serve Prometheus metrics on this port (0: any free"
                     " one, logged); needs pip install 'trioworker[metrics]'")  # fmt: skip
    run.add_argument("--otel", action="store_true",
                     help="trace each attempt with OpenTelemetry, set up by the OTEL_*"
                     " variables; needs pip install 'trioworker[otel]'")  # fmt: skip

    migrate = command("migrate", "apply database migrations (safe to run concurrently)")
    migrate.add_argument(
        "--app",
        type=utf8,
        metavar="MODULE:ATTR",
        help="also apply the migrations of this app's Registry(migrations=...)",
    )

    enqueue = command(
        "enqueue", "queue a work item (or many, --from a JSON Lines file); prints the ids"
    )
    enqueue.add_argument("kind", type=utf8, nargs="?", help="the item's kind (not with --from)")
    enqueue.add_argument("--from", dest="from_file", metavar="FILE.jsonl|-",
                         help="one item per line: a JSON object with kind and any of scope,"
                         " payload, dedup_key, delay, priority; all queued or none")  # fmt: skip
    enqueue.add_argument("--scope", type=utf8)
    enqueue.add_argument("--payload", metavar="JSON|@FILE|-",
                         help="the payload: JSON, @FILE to read it from a file, - for stdin"
                         " (64 KiB at most)")  # fmt: skip
    enqueue.add_argument("--dedup-key", type=utf8)
    enqueue.add_argument(
        "--delay",
        type=number(maximum=MAX_RUN_AFTER_DISTANCE.total_seconds()),
        default=0.0,
        metavar="SECONDS",
        help="due this many seconds from now (0)",
    )
    enqueue.add_argument(
        "--priority",
        type=number(integer=True, minimum=MIN_PRIORITY, maximum=MAX_PRIORITY),
        default=0,
        metavar="N",
        help=f"{MIN_PRIORITY}..{MAX_PRIORITY}; higher is claimed sooner (0)",
    )
    enqueue.add_argument(
        "--app", type=utf8, metavar="MODULE:ATTR", help="reject kinds it has no handler for"
    )

    show = command("show", "one item: its fields, payload, attempts and traceback")
    show.add_argument("id", type=ITEM_ID)
    show.add_argument("--json", action="store_true", help="machine-readable output")

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

    for verb, help in (("pause", "stop claiming a kind's or a scope's items (running ones go"
                        " on)"), ("resume", "lift a pause")):  # fmt: skip
        target = command(verb, help).add_mutually_exclusive_group(required=True)
        target.add_argument("--kind", type=utf8)
        target.add_argument("--scope", type=utf8)

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
        "serve the web dashboard (read-only unless --allow-actions); needs pip install"
        " 'trioworker[dashboard]'",
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


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "migrate": _commands.cmd_migrate,
    "enqueue": _commands.cmd_enqueue,
    "show": _commands.cmd_show,
    "status": _commands.cmd_status,
    "cancel": _commands.cmd_cancel,
    "retry": _commands.cmd_retry,
    "prune": _commands.cmd_prune,
    "pause": _commands.cmd_pause,
    "resume": _commands.cmd_resume,
    "quiesce": _commands.cmd_quiesce,
    "limit": cmd_limit,
    "dashboard": _commands.cmd_dashboard,
    "demo": _commands.cmd_demo,
}


def run_command(args: argparse.Namespace) -> int:
    if args.command == "run":
        fields = [field for _, field, _, _ in SETTINGS_OPTIONS]
        return _commands.cmd_run(args, _commands.worker_settings(args, fields))
    return COMMANDS[args.command](args)


# -- main -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(secrets_in(argv)).parse_args(argv)
    args.dsn_given = args.dsn is not None or DSN_ENV in os.environ
    raw_dsn = args.dsn if args.dsn is not None else os.environ.get(DSN_ENV, "")
    _logging.configure(args.log_level, args.log_format, secrets=secrets(raw_dsn))
    if args.log_level != "DEBUG":  # yoyo tells every step it applies
        logging.getLogger("yoyo").setLevel(logging.WARNING)
    try:
        args.dsn = resolve_dsn(args.dsn)
        if not args.dsn:
            log.info("no DSN given (--dsn or $%s): %s", DSN_ENV, describe_defaults())
        return run_command(args)
    except UsageError as exc:
        return report(f"{exc}", raw_dsn, args.log_format, EXIT_USAGE)
    except (TrioWorkerError, ValueError) as exc:
        return report(f"{exc}", raw_dsn, args.log_format, EXIT_ERROR)
    except BrokenPipeError:  # `status --json | head`: the reader has all it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def report(message: str, dsn: str, log_format: str, code: int) -> int:
    """The one line a failed command ends with: as a log line in JSON mode; in text,
    what it quotes (a kind, a database's message) shown `visible`."""
    message = redact(message, dsn)
    if log_format == "json":
        log.error("%s", message)
    else:
        print(f"trioworker: error: {visible(message, lines=True)}", file=sys.stderr)
    return code


__all__ = ["main"]
