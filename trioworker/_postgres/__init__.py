"""The store on PostgreSQL (docs/design/architecture.md)."""
