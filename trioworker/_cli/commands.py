"""What each `python -m trioworker` command does, once its arguments are parsed."""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import importlib
import json
import logging
import os
import signal
import stat
import sys
import time
from collections.abc import Collection, Mapping
from functools import partial
from typing import Any

import trio

from trioworker._cli.exits import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TAKEN_OVER,
    EXIT_TIMEOUT,
)
from trioworker._cli.input import (
    UsageError,
    on_its_line,
    read_items,
    read_lines,
    read_payload,
)
from trioworker._core.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    IdTakenOver,
    InvalidWorkItem,
    ItemNotSucceeded,
)
from trioworker._core.jsontext import pretty
from trioworker._core.model import FINISHED, Enqueued, Status
from trioworker._core.registry import Registry
from trioworker._core.retry import Backoff
from trioworker._core.settings import Settings
from trioworker._core.text import shell_word, short_duration, visible
from trioworker._core.validation import pause_target, validate_enqueue, validate_scope
from trioworker._postgres.dsn import resolve_dsn
from trioworker._postgres.migrate import check_schema, migrate
from trioworker._postgres.queries import queries_in
from trioworker._postgres.store import PostgresStore, open_store
from trioworker._postgres.sync_client import Client
from trioworker._store.reads import ALIVE_BEATS, ALIVE_WITHIN
from trioworker._worker.executor import Tracer
from trioworker._worker.watchdog import WatchdogLink
from trioworker._worker.worker import Worker, default_worker_id

log = logging.getLogger("trioworker")


def load_registry(spec: str) -> Registry:
    """Import `MODULE:ATTR` and check that it is a Registry."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--app must look like MODULE:ATTR, not {spec!r}")
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


def with_store(dsn: str, schema: str | None, body: Any, **options: Any) -> Any:
    """Run `await body(store)` on a one-connection store on the queue in `schema`, from
    synchronous code."""

    async def main() -> Any:
        async with open_store(dsn, max_connections=1, schema=schema, **options) as store:
            return await body(store)

    return trio.run(main)


# -- the commands ---------------------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    apps = [load_registry(args.app)] if args.app else []
    applied = migrate(args.dsn, *apps, schema=args.schema)
    for migration in applied:
        print(f"applied {migration}")
    if not applied:
        print("schema is up to date")
    return EXIT_OK


def cmd_sql(args: argparse.Namespace) -> int:
    """Print the queue's migrations as one script (trioworker._postgres.script)."""
    from trioworker._postgres.script import queue_script

    try:
        script = queue_script(args.from_migration)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    sys.stdout.write(script)
    return EXIT_OK


def cmd_enqueue(args: argparse.Namespace) -> int:
    kinds = load_registry(args.app).kinds if args.app else None
    if args.from_file is not None:
        return _enqueue_from(args, kinds)
    if args.kind is None:
        raise UsageError("enqueue needs a KIND, or --from FILE.jsonl")
    payload = read_payload(args.payload)
    run_after = args.delay or None
    try:  # bad input is reported before anything connects
        validate_enqueue(
            args.kind, args.scope, payload, args.dedup_key, run_after, priority=args.priority,
            now=dt.datetime.now(dt.UTC), known_kinds=kinds, after=args.after,
        )  # fmt: skip
    except InvalidWorkItem as exc:
        raise UsageError(str(exc)) from None
    check_schema(args.dsn, schema=args.schema)

    async def enqueue(store: PostgresStore) -> None:
        enqueued = await store.enqueue(
            args.kind,
            scope=args.scope,
            payload=payload,
            dedup_key=args.dedup_key,
            run_after=run_after,
            priority=args.priority,
            after=args.after,
        )
        print(enqueued.id)
        if enqueued.deduplicated:
            print(f"(already queued with dedup key {args.dedup_key!r})", file=sys.stderr)
        _warn_unserved([args.kind], await _kinds_served(store))

    with_store(args.dsn, args.schema, enqueue, known_kinds=kinds)
    return EXIT_OK


async def _kinds_served(store: PostgresStore) -> dict[str, bool]:
    """Each kind any Worker has served: whether a live one serves it now."""
    alive = {"alive_beats": ALIVE_BEATS, "alive_within": ALIVE_WITHIN}
    async with store.transaction() as tx:
        rows = await tx.execute(queries_in(store.schema)["kinds_served"], alive)
    return {kind: live for kind, live in rows}


def unserved_warnings(kinds: Collection[str], served: Mapping[str, bool]) -> list[str]:
    """A warning for each of `kinds` (in order, once) that no live Worker serves, naming
    the close matches among the kinds Workers serve when it looks like a typo."""
    live = sorted(k for k, is_live in served.items() if is_live)
    warnings = []
    for kind in dict.fromkeys(kinds):
        if served.get(kind):
            continue
        if kind in served:
            hint = " now (Workers served it before)"
        elif close := difflib.get_close_matches(kind, sorted(served), n=3, cutoff=0.75):
            hint = f": a typo for {' or '.join(repr(c) for c in close)}?"
        else:
            hint = f" (live Workers serve: {', '.join(live) or 'nothing'})"
        warnings.append(
            f"warning: no live Worker serves kind {kind!r}{hint}; its items wait until one does"
        )
    return warnings


def _warn_unserved(kinds: Collection[str], served: Mapping[str, bool]) -> None:
    for warning in unserved_warnings(kinds, served):
        print(warning, file=sys.stderr)


def _enqueue_from(args: argparse.Namespace, kinds: Collection[str] | None) -> int:
    given = [o for o, v in (("KIND", args.kind), ("--scope", args.scope),
             ("--payload", args.payload), ("--dedup-key", args.dedup_key),
             ("--delay", args.delay), ("--priority", args.priority),
             ("--after", args.after)) if v]  # fmt: skip
    if given:
        raise UsageError(f"--from takes each item from its line: not with {', '.join(given)}")
    numbered = read_items(read_lines(args.from_file), known_kinds=kinds)
    items = [item for _, item in numbered]
    check_schema(args.dsn, schema=args.schema)

    async def enqueue(store: PostgresStore) -> list[Enqueued]:
        async with store.transaction() as tx:
            try:
                enqueued = await store.enqueue_many(items, tx=tx)
            except InvalidWorkItem as exc:  # an unknown parent: its line, nothing written
                raise on_its_line(exc, [number for number, _ in numbered]) from None
        _warn_unserved([item.kind for item in items], await _kinds_served(store))
        return enqueued

    results: list[Enqueued] = with_store(args.dsn, args.schema, enqueue, known_kinds=kinds)
    for enqueued in results:
        print(enqueued.id)
    merged = sum(e.deduplicated for e in results)
    print(
        f"queued {len(results) - merged} item(s)"
        + (f"; {merged} merged onto items already queued with their dedup key" if merged else ""),
        file=sys.stderr,
    )
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    check_schema(args.dsn, schema=args.schema)
    outcome = with_store(args.dsn, args.schema, lambda store: store.cancel(args.id)).value
    messages = {
        "cancelled": f"item {args.id} cancelled (it had not started)",
        "requested": f"item {args.id} is running; asked it to stop at its next heartbeat",
        "already-finished": f"item {args.id} had already finished",
        "not-found": f"no item {args.id}",
    }
    print(messages[outcome])
    return EXIT_OK if outcome != "not-found" else EXIT_ERROR


def cmd_status(args: argparse.Namespace) -> int:
    from trioworker._cli.status import gather, print_status

    check_schema(args.dsn, schema=args.schema)
    status = with_store(args.dsn, args.schema, gather)
    if args.json:
        print(json.dumps(status, indent=2, default=str))
    else:
        print_status(status)
    return EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    if args.failed == bool(args.ids):
        raise UsageError("retry takes item IDs, or --failed [--kind K] [--since TIME]")
    if not args.failed and (args.kind or args.since):
        raise UsageError("--kind and --since go with --failed")
    check_schema(args.dsn, schema=args.schema)

    async def retry(store: PostgresStore) -> tuple[list[int], list[int]]:
        ids = args.ids or await store.failed_items(kind=args.kind, since=args.since)
        return ids, await store.retry(ids) if ids else []

    asked, retried = with_store(args.dsn, args.schema, retry)
    print(f"retried {len(retried)} item(s)" + (f": {_ids(retried)}" if retried else ""))
    left = sorted(set(asked) - set(retried))
    if left:
        print(
            f"not retried (not Failed or Cancelled, unknown, or their dedup key is queued"
            f" again): {_ids(left)}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return EXIT_OK


def _ids(ids: list[int], most: int = 20) -> str:
    shown = " ".join(map(str, ids[:most]))
    return shown + (f" ... ({len(ids) - most} more)" if len(ids) > most else "")


def cmd_prune(args: argparse.Namespace) -> int:
    statuses = [Status(s) for s in args.status] if args.status else list(FINISHED)
    what = f"{'/'.join(s.value for s in statuses)} item(s) finished more than"
    ago = f"{short_duration(args.older_than)} ago"
    check_schema(args.dsn, schema=args.schema)
    if args.dry_run:
        params = {
            "statuses": [s.value for s in statuses],
            "older_than": args.older_than.total_seconds(),
        }

        async def count(store: PostgresStore) -> int:
            async with store.transaction() as tx:
                [(n,)] = await tx.execute(queries_in(store.schema)["count_finished"], params)
                return int(n)

        n = with_store(args.dsn, args.schema, count)
        print(f"would delete {n} {what} {ago} (dry run: none deleted)")
        return EXIT_OK
    longest = 0.0
    batches = 0

    def note(rows: int, seconds: float) -> None:
        nonlocal longest, batches
        longest, batches = max(longest, seconds), batches + 1

    deleted = with_store(
        args.dsn,
        args.schema,
        lambda store: store.delete_finished(
            args.older_than, statuses=statuses, batch=args.batch, on_batch=note
        ),
    )
    print(f"deleted {deleted} {what} {ago}, in {batches} batch(es) (longest {longest:.3f}s)")
    return EXIT_OK


def _target(args: argparse.Namespace) -> str:
    return f"kind {args.kind!r}" if args.kind is not None else f"scope {args.scope!r}"


def _pause_or_resume(args: argparse.Namespace, verb: str) -> int:
    try:
        pause_target(args.kind, args.scope)
    except InvalidWorkItem as exc:
        raise UsageError(str(exc)) from None
    if args.app is not None:
        if args.kind is None:
            raise UsageError("--app goes with --kind: it checks the kind")
        kinds = load_registry(args.app).kinds
        if args.kind not in kinds:  # as enqueue --app refuses it
            known = ", ".join(sorted(kinds)) or "none"
            raise UsageError(f"unknown kind {args.kind!r} (known kinds: {known})")
    check_schema(args.dsn, schema=args.schema)

    async def act(store: PostgresStore) -> tuple[bool, bool]:
        method = store.pause if verb == "pause" else store.resume
        changed: bool = await method(kind=args.kind, scope=args.scope)
        seen = True
        if args.kind is not None and args.app is None:
            async with store.transaction() as tx:
                [(seen,)] = await tx.execute(
                    queries_in(store.schema)["kind_seen"], {"kind": args.kind}
                )
        return changed, seen

    changed, seen = with_store(args.dsn, args.schema, act)
    done = {"pause": "paused", "resume": "resumed"}[verb]
    was = {"pause": "was paused already", "resume": "was not paused"}[verb]
    print(f"{_target(args)} {done if changed else was}")
    if not seen:
        print(
            f"warning: no item, schedule or Worker has ever had kind {args.kind!r}: a typo?"
            " (--app MODULE:ATTR checks a kind against the application's handlers)",
            file=sys.stderr,
        )
    return EXIT_OK


def cmd_pause(args: argparse.Namespace) -> int:
    return _pause_or_resume(args, "pause")


def cmd_resume(args: argparse.Namespace) -> int:
    return _pause_or_resume(args, "resume")


def cmd_quiesce(args: argparse.Namespace) -> int:
    from trioworker._store.quiesce import quiesce

    try:
        validate_scope(args.scope)
    except InvalidWorkItem as exc:
        raise UsageError(f"--scope {args.scope!r}: {exc}") from None
    check_schema(args.dsn, schema=args.schema)
    result = with_store(
        args.dsn, args.schema, lambda store: quiesce(store, args.scope, timeout=args.timeout)
    )
    resume = f"(it stays paused: python -m trioworker resume --scope {shell_word(args.scope)})"
    if result.done:
        ended = f"; last held by {result.holder}" if result.holder else ""
        print(f"scope {args.scope!r} is quiet after {result.waited:.1f}s{ended} {resume}")
        return EXIT_OK
    print(
        f"trioworker: error: scope {args.scope!r} not quiet after {result.waited:.1f}s:"
        f" held by {result.holder or 'nothing seen'} {resume}",
        file=sys.stderr,
    )
    return EXIT_ERROR


def cmd_show(args: argparse.Namespace) -> int:
    from trioworker._cli.show import item_details, print_item, to_json

    check_schema(args.dsn, schema=args.schema)
    details = with_store(args.dsn, args.schema, lambda store: item_details(store, args.id))
    if details is None:
        print(f"no item {args.id}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(to_json(details))
    else:
        print_item(details)
    return EXIT_OK


def cmd_wait(args: argparse.Namespace) -> int:
    """Wait for the item's end: its result as JSON on stdout (exit 0), or why it did not
    succeed (exit 1) or that it had not ended within --timeout (exit 124), on stderr."""
    check_schema(args.dsn, schema=args.schema)
    timeout = None if args.timeout is None else args.timeout.total_seconds()
    with Client(args.dsn, schema=args.schema, max_connections=1) as client:
        try:
            result = client.result(args.id, timeout=timeout)
        except ItemNotSucceeded as exc:
            print(f"trioworker: {visible(str(exc), lines=True)}", file=sys.stderr)
            return EXIT_ERROR
        except TimeoutError as exc:
            print(f"trioworker: {exc}", file=sys.stderr)
            return EXIT_TIMEOUT
    print(pretty(result))
    return EXIT_OK


def worker_settings(args: argparse.Namespace, fields: list[str]) -> Settings:
    """The Settings the `run` options give (their defaults are Settings' own)."""
    given = {f: getattr(args, f) for f in fields if getattr(args, f) is not None}
    try:
        return Settings(**given)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None


def check_run_arguments(args: argparse.Namespace) -> None:
    """What `run` can refuse before it imports or connects anything."""
    if args.unscoped is False and not args.scope:
        raise UsageError(
            "--no-unscoped needs --scope: a Worker serving every scope serves unscoped items"
        )
    for scope in args.scope or ():
        try:
            validate_scope(scope)
        except InvalidWorkItem as exc:
            raise UsageError(f"--scope {scope!r}: {exc}") from None
    if args.metrics_port is not None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise ConfigurationError(
                "--metrics-port needs the metrics extra: pip install prometheus-client"
                " (or install trioworker with [metrics])"
            ) from None
    if args.otel:
        try:
            import opentelemetry.sdk.trace  # noqa: F401
        except ImportError:
            raise UsageError(
                "--otel needs the otel extra: pip install opentelemetry-api opentelemetry-sdk"
                " (or install trioworker with [otel])"
            ) from None


def otel_tracer() -> Tracer:
    """`run --otel`: an OtelTracer on the application's global TracerProvider, if its
    module (--app) set one up; else on an SDK provider the OTEL_* variables set up, made
    the global one, so a handler's own spans go the same way."""
    from opentelemetry import trace

    from trioworker.otel import OtelTracer, provider_from_environment

    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return OtelTracer()
    provider = provider_from_environment()
    trace.set_tracer_provider(provider)
    return OtelTracer(provider)


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    """`run`: a supervisor of one or N Workers; with --watchdog-fd, one of its Workers."""
    check_run_arguments(args)
    args.worker_id = args.worker_id or default_worker_id()
    registry = load_registry(args.app)
    if args.watchdog_fd is None:
        return run_supervised(args, registry)
    return run_worker(args, settings, registry, watchdog_link(args.watchdog_fd))


def watchdog_link(fd: int) -> WatchdogLink:
    """The Worker's end of the pipe its supervisor gave it."""
    try:
        is_pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        is_pipe = False
    if not is_pipe:
        raise UsageError(f"--watchdog-fd {fd} is no pipe: it is for the supervisor's own use")
    return WatchdogLink(fd)


def run_worker(
    args: argparse.Namespace, settings: Settings, registry: Registry, link: WatchdogLink
) -> int:
    """One Worker, started by the supervisor (which has migrated, if asked): it tells
    the supervisor its bound over `link`, and fail-stops through it."""
    tracer = otel_tracer() if args.otel else None  # after --app, which may set one up
    if args.retain is not None:
        registry.retention(args.retain)
    wait_for_schema(args.dsn, args.schema, args.startup_timeout, registry, args.app)
    interrupted = trio.Event()
    taken_over = trio.Event()

    async def main() -> None:
        async with open_store(
            args.dsn,
            max_connections=2 * settings.concurrency + 4,
            application_name=f"trioworker {args.worker_id}"[:63],
            schema=args.schema,
            listen_dsn=resolve_dsn(args.listen_dsn) if args.listen_dsn else None,
        ) as store:
            metrics = None
            if args.metrics_port is not None:
                from trioworker._worker.metrics import serve_metrics

                metrics = serve_metrics(args.metrics_port, store)
            worker = Worker(
                store,
                registry,
                settings,
                worker_id=args.worker_id,
                scopes=args.scope,
                unscoped=args.unscoped,
                fail_stop=link.fail_stop,
                watchdog=link,
                metrics=metrics,
                tracer=tracer,
            )
            if metrics is not None:
                metrics.attach(worker)
            await worker.claim_id()  # before the nursery: a taken id is one plain error
            async with trio.open_nursery() as nursery:
                nursery.start_soon(on_signals, worker, nursery.cancel_scope, interrupted)
                if metrics is not None:
                    nursery.start_soon(metrics.run)  # the queue-depth refresh
                try:
                    await worker.run()
                except IdTakenOver:  # logged when found, with what the Worker does about it
                    taken_over.set()
                nursery.cancel_scope.cancel()

    trio.run(main)
    if taken_over.is_set():
        return EXIT_TAKEN_OVER
    return EXIT_INTERRUPTED if interrupted.is_set() else EXIT_OK


def run_supervised(args: argparse.Namespace, registry: Registry) -> int:
    """`run`: migrate once if asked and wait for the schema, then one or N Workers under
    this process, their supervisor (trioworker/_cli/supervisor.py)."""
    from trioworker._cli.supervisor import child_argv, run_workers, worker_ids

    if args.migrate:
        for migration in migrate(args.dsn, registry, schema=args.schema):
            log.info("applied migration %s", migration)
    wait_for_schema(args.dsn, args.schema, args.startup_timeout, registry, args.app)
    workers = []
    for index, worker_id in enumerate(worker_ids(args.worker_id, args.processes)):
        port = [] if not args.metrics_port else ["--metrics-port", str(args.metrics_port + index)]
        workers.append((worker_id, child_argv(args.argv, worker_id, *port)))
    return run_workers(workers)


async def on_signals(worker: Worker, scope: trio.CancelScope, interrupted: trio.Event) -> None:
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


def wait_for_schema(
    dsn: str, schema: str | None, timeout: float, registry: Registry, app: str
) -> None:
    """Check the schema (the queue's and those of the app, `--app app`), retrying while
    PostgreSQL is unreachable (up to `timeout`)."""
    deadline = time.monotonic() + timeout if timeout > 0 else float("inf")
    backoff = Backoff(initial=0.5, maximum=10.0)
    while True:
        try:
            check_schema(dsn, registry, schema=schema, app_name=app)
            return
        except DatabaseUnavailable as exc:
            delay = backoff.next()
            if time.monotonic() + delay > deadline:
                raise DatabaseUnavailable(f"{exc} (gave up after {timeout:g}s)") from None
            log.warning("%s; retrying in %.1fs", exc, delay)
            time.sleep(delay)


def cmd_dashboard(args: argparse.Namespace) -> int:
    """Serve the web dashboard until SIGTERM/SIGINT (docs/dashboard.md)."""
    try:
        from trioworker.dashboard import check_settings, read_token, serve
    except ImportError as exc:  # the message names the extra to install
        raise UsageError(str(exc)) from None
    if args.token_file is not None and not args.allow_actions:
        raise UsageError("--token-file goes with --allow-actions")
    try:
        token = read_token(args.token_file) if args.allow_actions else None
        check_settings(
            allow_actions=args.allow_actions,
            token=token,
            host=args.host,
            allowed_hosts=args.allowed_host,
        )
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    check_schema(args.dsn, schema=args.schema)

    async def main() -> None:
        async with (
            open_store(
                args.dsn,
                max_connections=4,
                application_name="trioworker dashboard",
                schema=args.schema,
            ) as store,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(_stop_on_signals, nursery.cancel_scope)
            await nursery.start(
                partial(serve, store, host=args.host, port=args.port,
                        allow_actions=args.allow_actions, token=token,
                        allowed_hosts=args.allowed_host)
            )  # fmt: skip

    trio.run(main)
    return EXIT_OK


async def _stop_on_signals(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("%s: the dashboard stops", signal.Signals(signum).name)
            scope.cancel()
            return


def cmd_demo(args: argparse.Namespace) -> int:
    """A launcher of the media-library demo, an example application that lives in the
    repository (examples/media), not in the package: run from a checkout, it runs it."""
    try:
        demo = importlib.import_module("examples.media.demo")
    except ImportError:
        raise UsageError(
            "the demo is an example application in the repository, not in the package:"
            " from a checkout, run ./dev demo (or python -m examples.media)"
        ) from None
    code: int = demo.run_demo(args.dsn if args.dsn_given else None, args)
    return code


def cmd_limit(args: argparse.Namespace) -> int:
    from trioworker._cli.limits import cmd_limit as limit

    return limit(args)
