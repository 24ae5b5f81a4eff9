"""The store on PostgreSQL (docs/design/architecture.md)."""

# trio_asyncio must be imported before psycopg, or psycopg's async calls fail with "no
# running event loop"; every module here may import psycopg, so this goes first.
import trio_asyncio  # noqa: F401  isort: skip
