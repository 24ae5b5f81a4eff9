"""Rows read whatever they hold: a time psycopg cannot load stands as an UndecodableValue.

PostgreSQL holds times Python's datetime cannot: 'infinity', a BC date, the year 10000
(or a time that becomes it in the session's time zone). psycopg raises on such a value
as it loads the row, so one row failed its whole fetch: a claimed batch that could not
be read (every item of it stranded Running), a `show` or an item page that answered
nothing. The schema refuses such times since migration 0008, which moved those already
stored into bounds; a row can still hold one that a superuser wrote past the triggers
(`session_replication_role = replica`). So the reads that must answer for any one row
(the claim, `get_item` and the attempts behind `show`, the dashboard's item page) read
their rows as stored (`read_as_stored`): such a value comes back as an UndecodableValue
(why, and its text) in place of the datetime, and the rest of the row, and of the
batch, as usual. A claimed item holding one is failed by the Worker, never run
(operations.claimed_item).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Loader
from psycopg.pq import Format

from trioworker._core.jsontext import RAW_LIMIT, UndecodableValue


class _TimestamptzAsStored(Loader):
    """The connection's own loader of timestamptz text (its DateStyle, its time zone),
    answering an UndecodableValue where that one raises."""

    format = Format.TEXT

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        # The connection's map: a cursor's own registration (this class) is not in it.
        adapters = self.connection.adapters if self.connection is not None else psycopg.adapters
        loader = adapters.get_loader(oid, Format.TEXT)
        assert loader is not None  # timestamptz is a builtin type
        self._load = loader(oid, context).load

    def load(self, data: Buffer) -> Any:
        try:
            return self._load(data)
        except psycopg.DataError as exc:
            text = bytes(data).decode(errors="replace")
            return UndecodableValue(f"cannot be decoded: {exc}", text[:RAW_LIMIT])


def read_as_stored(cursor: psycopg.AsyncCursor[Any] | psycopg.Cursor[Any]) -> None:
    """Make `cursor` (of text results, as every cursor of the queue's) load a time
    Python cannot hold as an UndecodableValue instead of failing the fetch."""
    cursor.adapters.register_loader("timestamptz", _TimestamptzAsStored)
