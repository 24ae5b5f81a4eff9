"""`limit`: set, clear and list concurrency and rate limits (docs/design/limits.md).

python -m trioworker limit --scope S --running 2
python -m trioworker limit --kind K --running 8
python -m trioworker limit --kind K --rate 10/s
python -m trioworker limit --scope S --rate 600/min
python -m trioworker limit --default --running 2      # every scope without its own
python -m trioworker limit --kind K --clear
python -m trioworker limit                            # list them
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from trioworker._cli.exits import EXIT_OK
from trioworker._cli.input import UsageError
from trioworker._core.errors import InvalidLimit
from trioworker._core.limits import Limit, limit_target, parse_rate, validate_limit
from trioworker._core.text import visible
from trioworker._store.reads import limit_json

if TYPE_CHECKING:  # the verb imports the store when it runs, not with the parser
    from trioworker._postgres.store import PostgresStore

_WHOLE = re.compile(r"[+-]?\d+")
#: The width of the LIMIT column: longer names are cut with an ellipsis.
_NAME_WIDTH = 32


def add_limit_command(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    limit = command(
        "limit",
        "set, clear or list limits: at most N Running per scope or kind, at most R starts"
        " per period (alone: list them)",
    )
    target = limit.add_mutually_exclusive_group()
    target.add_argument("--kind", help="a limit for every item of this kind, across all Workers")
    target.add_argument("--scope", help="a limit for this scope (the default is 1 Running)")
    target.add_argument(
        "--default", action="store_true", help="the running limit of scopes without their own"
    )
    limit.add_argument("--running", metavar="N", help="at most N Running at once (1..10000)")
    limit.add_argument(
        "--rate", metavar="R/PERIOD", help="at most R starts per period: 10/s, 600/min"
    )
    limit.add_argument("--clear", action="store_true", help="remove the limit of --kind/--scope")
    limit.add_argument("--json", action="store_true", help="machine-readable output")


def _running(text: str | None) -> int | None:
    if text is None:
        return None
    if not _WHOLE.fullmatch(text.strip()):
        raise UsageError(f"--running {text!r}: give a whole number of items, such as 2")
    return int(text)


def cmd_limit(args: argparse.Namespace) -> int:
    targeted = args.kind is not None or args.scope is not None or args.default
    setting = args.running is not None or args.rate is not None
    if not targeted and (setting or args.clear):
        raise UsageError("say whose limit: --kind K, --scope S or --default")
    if args.clear and setting:
        raise UsageError("--clear removes a limit: not with --running or --rate")
    if targeted and not (setting or args.clear):
        raise UsageError("give --running N, --rate R/PERIOD or --clear (alone, limit lists them)")
    try:
        if args.clear:
            limit_target(args.kind, args.scope)
        elif setting:
            rate = None if args.rate is None else parse_rate(args.rate)
            validate_limit(args.kind, args.scope, _running(args.running), rate)
    except InvalidLimit as exc:
        raise UsageError(str(exc)) from None
    from trioworker._cli.commands import with_store
    from trioworker._postgres.migrate import check_schema

    check_schema(args.dsn, schema=args.schema)
    if args.clear:
        cleared = with_store(
            args.dsn, args.schema, lambda store: store.clear_limit(kind=args.kind, scope=args.scope)
        )
        print(f"{_name(args)} {'cleared' if cleared else 'had no limit'}")
        return EXIT_OK
    if setting:
        limit: Limit = with_store(
            args.dsn,
            args.schema,
            lambda store: store.set_limit(
                kind=args.kind, scope=args.scope, running=_running(args.running), rate=args.rate
            ),
        )
        print(f"{visible(limit.target)}: {describe(limit)}")
        return EXIT_OK

    async def read(store: PostgresStore) -> list[Limit]:
        return await store.limits()

    limits: list[Limit] = with_store(args.dsn, args.schema, read)
    if args.json:
        print(json.dumps([limit_json(lim) for lim in limits], indent=2))
    else:
        print("\n".join(table(limits)))
    return EXIT_OK


def _name(args: argparse.Namespace) -> str:
    if args.kind is not None:
        return f"kind {args.kind!r}"
    return f"scope {args.scope!r}" if args.scope is not None else "the default"


def describe(limit: Limit) -> str:
    parts = []
    if limit.running is not None:
        parts.append(f"at most {limit.running} Running")
    if limit.rate is not None:
        parts.append(f"at most {limit.rate} starts")
    return ", ".join(parts)


def table(limits: Sequence[Limit]) -> list[str]:
    """The limits, one a line: what, its limits, what it holds now."""
    if not limits:
        return ["no limits: one Running item per scope, kinds and rates unlimited"]
    lines = [f"{'LIMIT':<32} {'RUNNING':>9} {'RATE':>10} {'IN WINDOW':>9} {'WAITING':>8}"]
    for lim in limits:
        running = "-" if lim.running is None else f"{lim.in_use}/{lim.running}"
        rate = "-" if lim.rate is None else str(lim.rate)
        window = "-" if lim.rate is None else f"{lim.started_in_window}/{lim.rate.count}"
        name = visible(lim.target)
        name = name if len(name) <= _NAME_WIDTH else name[: _NAME_WIDTH - 1] + "…"
        lines.append(f"{name:<32} {running:>9} {rate:>10} {window:>9} {lim.waiting:>8}")
    return lines
