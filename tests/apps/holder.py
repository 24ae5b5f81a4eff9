"""A client that holds a transaction open: `python -m tests.apps.holder DSN ID`.

Opens the store's own transaction (`PostgresStore.transaction()`, as the CLI's and the
dashboard's are), locks work item ID's row in it, prints its backend's pid, and sits in
it, idle, until killed.
"""

from __future__ import annotations

import sys

import trio

from trioworker import open_store


async def main(dsn: str, id: int) -> None:
    async with open_store(dsn) as store, store.transaction() as tx:
        await tx.execute("SELECT id FROM work_items WHERE id = %s FOR UPDATE", [id])
        [row] = await tx.rows("SELECT pg_backend_pid() AS pid")
        print(row["pid"], flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
