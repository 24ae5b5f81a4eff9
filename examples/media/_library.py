"""The application's side of the media library, on a plain psycopg connection: what
users do (add storage configs, delete assets, share links) and the audit that checks
every active asset has its proxies. Used by the demo and the tests."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from examples.media import _files
from examples.media._db import query


@attrs.frozen
class MissingProxies:
    asset_id: int
    config_id: str
    content_hash: str
    kinds: tuple[str, ...]  # the proxy kinds it lacks (no row, or no sound file)


@attrs.frozen
class Audit:
    """Active assets, and those of them without all their proxies on disk."""

    active: int
    missing: tuple[MissingProxies, ...]

    @property
    def ok(self) -> bool:
        return not self.missing


class Library:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def rows(self, name: str, **params: Any) -> list[dict[str, Any]]:
        """Rows of a named media statement."""
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query(name), params)
            return cur.fetchall() if cur.description else []

    def add_config(self, config_id: str, owner: str, root: Path, proxy_root: Path) -> None:
        self.rows(
            "add_config",
            config_id=config_id,
            owner=owner,
            root=str(root),
            proxy_root=str(proxy_root),
        )

    def remove_config(self, config_id: str) -> None:
        self.rows("remove_config", config_id=config_id)

    def soft_delete_some(self, config_id: str, limit: int) -> list[int]:
        """Soft-delete up to `limit` random active assets of the config, as a user would."""
        ids = [r["id"] for r in self.rows("pick_active", config_id=config_id, limit=limit)]
        return [r["id"] for r in self.rows("soft_delete", asset_ids=ids)] if ids else []

    def add_token(self, config_id: str, seconds: float) -> str:
        """A share token valid for `seconds` (negative: already expired)."""
        token = secrets.token_urlsafe(12)
        self.rows("add_token", token=token, config_id=config_id, seconds=seconds)
        return token

    def summary(self, config_ids: Sequence[str]) -> list[dict[str, Any]]:
        return self.rows("library_summary", config_ids=list(config_ids))

    def audit(self, config_ids: Sequence[str]) -> Audit:
        """Check every active asset of these configs has a sound file for each proxy kind."""
        rows = self.rows("active_assets_with_proxies", config_ids=list(config_ids))
        missing = []
        for r in rows:
            paths = dict(zip(r["kinds"], r["paths"], strict=True))
            lacking = tuple(
                kind
                for kind in _files.PROXY_KINDS
                if kind not in paths
                or not _files.proxy_is_sound(
                    Path(r["proxy_root"]) / paths[kind], kind, r["content_hash"]
                )
            )
            if lacking:
                missing.append(MissingProxies(r["id"], r["config_id"], r["content_hash"], lacking))
        return Audit(active=len(rows), missing=tuple(missing))
