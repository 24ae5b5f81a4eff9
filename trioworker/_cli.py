"""`python -m trioworker`: run a Worker, migrate, enqueue, status, cancel, demo.

Exit codes: 0 done; 1 error (bad input, bad settings, database unreachable);
2 usage; 70 fail-stop (a handler would not stop); 130 interrupted twice.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import attrs
import trio

from . import _logging
from ._dsn import DSN_ENV, _password, redact, resolve_dsn
from ._errors import ConfigurationError, DatabaseUnavailable, SchemaNotReady, TrioWorkerError
from ._migrate import check_schema, migrate
from ._postgres import open_store
from ._registry import Registry
from ._retry import Backoff
from ._settings import Settings
from ._validation import validate_enqueue
from ._worker import Worker, default_worker_id

log = logging.getLogger("trioworker")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_FAIL_STOP = 70
EXIT_INTERRUPTED = 130


def fail_stop(message: str) -> NoReturn:
    """End the process now, so the operating system ends the handler's side effects."""
    log.critical("fail-stop: %s", message)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(EXIT_FAIL_STOP)


def load_registry(spec: str) -> Registry:
    """Import `MODULE:ATTR` and check that it is a Registry."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"--app must look like MODULE:ATTR, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigurationError(f"--app {spec}: cannot import {module_name!r}: {exc}") from None
    try:
        registry = getattr(module, attr)
    except AttributeError:
        raise ConfigurationError(f"--app {spec}: module {module_name!r} has no {attr!r}") from None
    if not isinstance(registry, Registry):
        raise ConfigurationError(
            f"--app {spec} is a {type(registry).__name__}, not a trioworker.Registry"
        )
    return registry


# -- commands ----------------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    apps = [load_registry(args.app)] if args.app else []
    applied = migrate(args.dsn, *apps)
    print("applied: " + ", ".join(applied) if applied else "schema is up to date")
    return EXIT_OK


def cmd_enqueue(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload) if args.payload is not None else None
    except ValueError as exc:
        raise ConfigurationError(f"--payload is not valid JSON: {exc}") from None
    kinds = load_registry(args.app).kinds if args.app else None
    run_after = dt.timedelta(seconds=args.delay) if args.delay else None
    validate_enqueue(  # bad input is reported before anything connects
        args.kind, args.scope, payload, args.dedup_key, run_after, priority=args.priority,
        now=dt.datetime.now(dt.UTC), known_kinds=kinds,
    )  # fmt: skip
    check_schema(args.dsn)

    async def main() -> None:
        async with open_store(args.dsn, max_connections=1, known_kinds=kinds) as store:
            enqueued = await store.enqueue(
                args.kind,
                scope=args.scope,
                payload=payload,
                dedup_key=args.dedup_key,
                run_after=run_after,
                priority=args.priority,
            )
        print(enqueued.id)
        if enqueued.deduplicated:
            print(f"(already queued with dedup key {args.dedup_key!r})", file=sys.stderr)

    trio.run(main)
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    check_schema(args.dsn)

    async def main() -> str:
        async with open_store(args.dsn, max_connections=1) as store:
            return (await store.request_cancel(args.id)).value

    outcome = trio.run(main)
    messages = {
        "cancelled": f"item {args.id} cancelled (it had not started)",
        "requested": f"item {args.id} is running; asked it to stop at its next heartbeat",
        "already-finished": f"item {args.id} had already finished",
        "not-found": f"no item {args.id}",
    }
    print(messages[outcome])
    return EXIT_OK if outcome != "not-found" else EXIT_ERROR


def cmd_status(args: argparse.Namespace) -> int:
    from ._status import gather, print_status

    check_schema(args.dsn)

    async def main() -> dict[str, Any]:
        async with open_store(args.dsn, max_connections=1) as store:
            return await gather(store)

    status = trio.run(main)
    if args.json:
        print(json.dumps(status, indent=2, default=str))
    else:
        print_status(status)
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    registry = load_registry(args.app)
    given = {f: getattr(args, f) for _, f, _, _ in SETTINGS_OPTIONS if getattr(args, f) is not None}
    settings = Settings(**given)
    if args.migrate:
        migrate(args.dsn, registry)
    _wait_for_schema(args.dsn, args.startup_timeout, registry)
    interrupted = trio.Event()

    async def main() -> None:
        async with open_store(
            args.dsn,
            max_connections=2 * settings.concurrency + 4,
            application_name=f"trioworker {args.worker_id}"[:63],
        ) as store:
            metrics = None
            if args.metrics_port is not None:
                from ._metrics import serve_metrics

                metrics = serve_metrics(args.metrics_port, store)
            worker = Worker(
                store,
                registry,
                settings,
                worker_id=args.worker_id,
                scopes=args.scope,
                unscoped=args.unscoped,
                fail_stop=fail_stop,
                watchdog=True,
                metrics=metrics,
            )
            if metrics is not None:
                metrics.attach(worker)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_on_signals, worker, nursery.cancel_scope, interrupted)
                if metrics is not None:
                    nursery.start_soon(metrics.run)  # the queue-depth refresh
                await worker.run()
                nursery.cancel_scope.cancel()

    trio.run(main)
    return EXIT_INTERRUPTED if interrupted.is_set() else EXIT_OK


async def _on_signals(worker: Worker, scope: trio.CancelScope, interrupted: trio.Event) -> None:
    """First SIGTERM/SIGINT: graceful stop. Second: stop at once."""
    # When the receiver closes, Trio re-raises signals it received but nobody read, with
    # the handlers it found. A signal that lands as the Worker finishes stopping would
    # then kill the process on its way out (exit -15 instead of 0): by then the Worker
    # is stopping anyway, so let those be ignored.
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, signal.SIG_IGN)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        first = True
        async for signum in signals:
            name = signal.Signals(signum).name
            if first:
                log.info("%s: stopping gracefully (send it again to stop at once)", name)
                worker.stop()
                first = False
            else:
                log.warning(
                    "%s again: stopping at once; running items are left to lease recovery", name
                )
                interrupted.set()
                scope.cancel()
                return


def _wait_for_schema(dsn: str, timeout: float, registry: Registry) -> None:
    """Check the schema (the queue's and the app's migrations), retrying while
    PostgreSQL is unreachable (up to `timeout`)."""
    deadline = time.monotonic() + timeout if timeout > 0 else float("inf")
    backoff = Backoff(initial=0.5, maximum=10.0)
    while True:
        try:
            check_schema(dsn, registry)
            return
        except DatabaseUnavailable as exc:
            delay = backoff.next()
            if time.monotonic() + delay > deadline:
                raise DatabaseUnavailable(f"{exc} (gave up after {timeout:g}s)") from None
            log.warning("%s; retrying in %.1fs", exc, delay)
            time.sleep(delay)


def cmd_demo(args: argparse.Namespace) -> int:
    from .media.demo import run_demo

    return run_demo(args.dsn if args.dsn_given else None, args)


# -- parsing -------------------------------------------------------------------------------


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


#: The `run` options that set a Worker's Settings: (option, field, type, help). Their
#: defaults are Settings' own.
SETTINGS_OPTIONS = [
    ("--concurrency", "concurrency", _positive_int, "items at once"),
    ("--lease", "lease", _positive_float, "seconds"),
    ("--heartbeat", "heartbeat", _positive_float, "seconds"),
    ("--poll", "poll", _positive_float, "seconds"),
    ("--max-stalls", "max_stalls", _positive_int, "stalls before an item fails as stalled"),
    ("--max-concurrent-files", "max_concurrent_files", _positive_int, "parallel file work"),
    ("--shutdown-grace", "shutdown_grace", _positive_float,
     "seconds running items get after SIGTERM"),
    ("--stop-grace", "stop_grace", _positive_float,
     "seconds a cancelled handler gets before fail-stop"),
]  # fmt: skip


def _setting_default(field: str) -> str:
    default = attrs.fields_dict(Settings)[field].default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return "a quarter lease"
    return f"{default:g}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trioworker",
        description="A PostgreSQL-backed work queue with Trio Workers.",
        epilog=f"DSN: --dsn, else ${DSN_ENV}, else libpq's PG* variables. Exit codes:"
        " 0 done, 1 error, 2 usage, 70 fail-stop, 130 interrupted twice.",
    )
    parser.add_argument("--dsn", help="libpq connection string or URI")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument("--log-format", default="text", choices=["text", "json"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a Worker until SIGTERM/SIGINT")
    run.add_argument("--app", required=True, metavar="MODULE:ATTR", help="a trioworker.Registry")
    run.add_argument("--worker-id", default=default_worker_id(), help="default: HOST-PID")
    run.add_argument(
        "--scope",
        action="append",
        metavar="S",
        help="serve only this scope (repeat for more); default: all scopes",
    )
    run.add_argument(
        "--unscoped",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also take unscoped items (default: yes without --scope, no with it)",
    )
    for option, field, type_, help in SETTINGS_OPTIONS:
        run.add_argument(
            option,
            dest=field,
            type=type_,
            default=None,
            metavar="N" if type_ is _positive_int else "SECONDS",
            help=f"{help} ({_setting_default(field)})",
        )
    run.add_argument(
        "--startup-timeout",
        type=float,
        default=60.0,
        help="give up if PostgreSQL cannot be reached at start for this long; 0: wait forever (60)",
    )
    run.add_argument("--migrate", action="store_true", help="apply migrations first")
    run.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port"
    )
    run.set_defaults(func=cmd_run)

    migrate_ = sub.add_parser(
        "migrate", help="apply database migrations (safe to run concurrently)"
    )
    migrate_.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        help="also apply the migrations of this app's Registry(migrations=...)",
    )
    migrate_.set_defaults(func=cmd_migrate)

    enqueue = sub.add_parser("enqueue", help="queue a work item; prints its id")
    enqueue.add_argument("kind")
    enqueue.add_argument("--scope")
    enqueue.add_argument("--payload", metavar="JSON")
    enqueue.add_argument("--dedup-key")
    enqueue.add_argument("--delay", type=float, default=0.0, metavar="SECONDS")
    enqueue.add_argument(
        "--priority",
        type=int,
        default=0,
        metavar="N",
        help="-1000..1000; higher is claimed sooner (0)",
    )
    enqueue.add_argument("--app", metavar="MODULE:ATTR", help="reject kinds it has no handler for")
    enqueue.set_defaults(func=cmd_enqueue)

    status = sub.add_parser("status", help="items by kind and status, running items, failures")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    cancel = sub.add_parser("cancel", help="cancel a queued item, or ask a running one to stop")
    cancel.add_argument("id", type=int)
    cancel.set_defaults(func=cmd_cancel)

    demo = sub.add_parser("demo", help="the media-library demo, on a private PostgreSQL")
    demo.add_argument("--duration", type=float, default=40.0, help="seconds of load (40)")
    demo.add_argument("--users", type=_positive_int, default=3)
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.dsn_given = args.dsn is not None or DSN_ENV in os.environ
    raw_dsn = args.dsn if args.dsn is not None else os.environ.get(DSN_ENV, "")
    _logging.configure(args.log_level, args.log_format, secret=_password(raw_dsn))
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        args.dsn = resolve_dsn(args.dsn)
        return func(args)
    except (TrioWorkerError, ValueError) as exc:
        print(f"trioworker: error: {redact(str(exc), raw_dsn)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


__all__ = ["SchemaNotReady", "main"]
