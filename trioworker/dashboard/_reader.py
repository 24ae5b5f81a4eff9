"""The dashboard's reads: sql/dashboard.sql's statements, run through a store.

A page's statements run together in one READ ONLY, REPEATABLE READ transaction (the
store's own `transaction()`), so its numbers agree with each other: one snapshot, one
now(). The store bounds each statement by its call timeout and turns driver errors into
trioworker errors, as for every other statement; READ ONLY makes PostgreSQL itself
refuse any write, whatever role the dashboard connects as.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from importlib import resources
from typing import Any, LiteralString

from trioworker._postgres.queries import TEMPLATES as CORE_TEMPLATES
from trioworker._postgres.queries import parse, qualify_all
from trioworker._postgres.store import PostgresStore

#: The dashboard's statements with their schema markers (trioworker/_postgres/queries.py);
#: `queries_in` qualifies them by the queue's schema.
TEMPLATES = {
    **parse(resources.files("trioworker.dashboard").joinpath("queries.sql").read_text()),
    # What `status` reads too: the same statements, from the queue's own file.
    "counts": CORE_TEMPLATES["counts_by_kind_and_status"],
    "unserved": CORE_TEMPLATES["unserved_kinds"],
    "wait_facts": CORE_TEMPLATES["wait_facts"],
    "limits": CORE_TEMPLATES["limits"],
}
#: As written (unqualified), for the search_path to resolve.
QUERIES = qualify_all(TEMPLATES, None)

Rows = list[dict[str, Any]]

#: The statements of one item's page, which must show any row, whatever it holds: a
#: time Python cannot hold comes back as an UndecodableValue (as_stored.py).
AS_STORED = frozenset({"item", "item_attempts", "item_steps"})


@functools.cache
def queries_in(schema: str | None) -> Mapping[str, LiteralString]:
    """The dashboard's statements for the queue in `schema` (as the store's own)."""
    return QUERIES if schema is None else qualify_all(TEMPLATES, schema)


class Reader:
    """Runs the dashboard's named read queries on a PostgresStore."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self._sql = queries_in(store.schema)

    async def snapshot(self, **statements: dict[str, Any]) -> dict[str, Rows]:
        """{name: rows} for each named query (keyword: its parameters), all read in
        one read-only snapshot."""
        unknown = sorted(set(statements) - set(QUERIES))
        if unknown:
            raise KeyError(f"no dashboard query named {', '.join(unknown)}")
        results: dict[str, Rows] = {}
        async with self.store.transaction() as tx:
            # The first statement of the transaction, so it may still set these.
            await tx.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            for name, params in statements.items():
                results[name] = await tx.rows(self._sql[name], params, as_stored=name in AS_STORED)
        return results
