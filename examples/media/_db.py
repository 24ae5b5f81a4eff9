"""The media library's database: its named statements, run by the handlers through the
Worker (`Context.transaction()`, fenced by the attempt), and by the app side on a plain
connection.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import resources
from typing import Any, LiteralString, cast

from trioworker import Context

Statement = tuple[str, dict[str, Any]]


def _parse(text: str) -> dict[str, LiteralString]:
    """Split a queries file on `-- name:` headers; each body runs to the next one."""
    parts = re.split(r"^-- name: (\w+)\s*$", text, flags=re.MULTILINE)
    # The file is the library's own, not user input: safe as query strings.
    pairs = zip(parts[1::2], parts[2::2], strict=True)
    return {name: cast(LiteralString, body.strip().rstrip(";")) for name, body in pairs}


QUERIES = _parse(resources.files("examples.media").joinpath("queries.sql").read_text())


class MediaDb:
    """One attempt's database work. Every call is a fenced transaction of the Worker's
    (`ctx.transaction()`): it runs only while the attempt owns its item, and raises
    `trioworker.Lost`, having written nothing, once another attempt does."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    async def rows(self, name: str, **params: Any) -> list[dict[str, Any]]:
        async with self._ctx.transaction() as tx:
            return await tx.rows(QUERIES[name], params)

    async def column(self, name: str, **params: Any) -> list[Any]:
        """The first column of every row."""
        return [next(iter(r.values())) for r in await self.rows(name, **params)]

    async def value(self, name: str, **params: Any) -> Any:
        """The first column of the first row."""
        rows = await self.rows(name, **params)
        return next(iter(rows[0].values())) if rows else None

    async def write(self, statements: Sequence[Statement]) -> None:
        """Run the named statements in one fenced transaction."""
        if not statements:
            return
        async with self._ctx.transaction() as tx:
            for name, params in statements:
                await tx.execute(QUERIES[name], params)


def query(name: str) -> LiteralString:
    """A named media statement, for the app side's plain connections."""
    return QUERIES[name]
