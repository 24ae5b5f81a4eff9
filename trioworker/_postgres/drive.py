"""Drivers: run an operation (operations.py) on a psycopg connection.

`run_async` runs one on an async connection (the Trio store's, waited on by Trio,
and `AsyncClient`'s asyncio one), `run_sync` on a sync one (`Client`). Each sends the
statements an operation yields, in order, on the one connection it is given, and sends
back their rows as dicts: in the caller's transaction when the connection is in one,
else each statement commits on its own (autocommit), as the Trio store's calls always
have.

`run_async` takes a retry policy, `again`, asked about each psycopg error an operation
meets: True runs the operation again from a fresh `steps()`, on the same connection
(the Trio store's claims, sent again after a lost slot race, are the one user).
Without one, the error goes to the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, LiteralString, TypeVar, cast

import psycopg
from psycopg.rows import dict_row

from trioworker._postgres.as_stored import read_as_stored
from trioworker._postgres.operations import Operation, Steps

T = TypeVar("T")
Queries = Mapping[str, LiteralString]
#: A retry policy: given the operation, the error it met and how many times it has
#: been run again so far, whether to run it again.
Again = Callable[[Operation[Any], psycopg.Error, int], bool]


async def run_async(
    conn: psycopg.AsyncConnection[Any],
    op: Operation[T],
    queries: Queries,
    again: Again | None = None,
) -> T:  # pragma: no mutate block
    """Run `op` on `conn` (asyncio side) with the statements `queries` (the queue's
    schema's: queries.queries_in); its result. `again`: the retry policy."""
    tries = 0
    while True:
        try:
            if op.atomic:
                async with conn.transaction():
                    return await _steps_async(conn, op.steps(), queries)
            return await _steps_async(conn, op.steps(), queries)
        except psycopg.Error as exc:
            if again is None or not again(op, exc, tries):
                raise
            tries += 1


async def _steps_async(
    conn: psycopg.AsyncConnection[Any], steps: Steps[T], queries: Queries
) -> T:  # pragma: no mutate block
    try:
        query = next(steps)
        while True:
            async with conn.cursor(row_factory=dict_row) as cur:
                if query.as_stored:
                    read_as_stored(cur)
                await cur.execute(queries[query.name], query.params)
                rows = await cur.fetchall() if cur.description else []
            query = steps.send(rows)
    except StopIteration as done:
        return cast(T, done.value)


def run_sync(
    conn: psycopg.Connection[Any], op: Operation[T], queries: Queries
) -> T:  # pragma: no mutate block
    """Run `op` on `conn` with the statements `queries`; its result. (No retry policy:
    no client operation claims.)"""
    if op.atomic:
        with conn.transaction():
            return _steps_sync(conn, op.steps(), queries)
    return _steps_sync(conn, op.steps(), queries)


def _steps_sync(
    conn: psycopg.Connection[Any], steps: Steps[T], queries: Queries
) -> T:  # pragma: no mutate block
    try:
        query = next(steps)
        while True:
            with conn.cursor(row_factory=dict_row) as cur:
                if query.as_stored:
                    read_as_stored(cur)
                cur.execute(queries[query.name], query.params)
                rows = cur.fetchall() if cur.description else []
            query = steps.send(rows)
    except StopIteration as done:
        return cast(T, done.value)
