"""`bench e2e`'s verdict sets the peers against trioworker's plain rows: not a run of
fans, limits or `run --processes`, whose labels also begin "trioworker, unscoped"."""

from __future__ import annotations

from typing import Any

from bench.e2e import GRAPHILE_BATCHED, compare


def row(label: str, family: str, items_per_s: float, **settings: Any) -> dict[str, Any]:
    serialised = settings.pop("serialised", False)
    return {"label": label, "family": family, "serialised": serialised,
            "items_per_s": items_per_s, "settings": settings}  # fmt: skip


def test_the_ratios_are_of_the_plain_runs_whatever_follows_them() -> None:
    rows = [
        row("trioworker, unscoped", "trioworker", 14_000.0),
        row("trioworker, unscoped, run --processes 2", "trioworker", 16_000.0, supervised=True),
        row("trioworker, 50 scopes", "trioworker", 5_000.0, serialised=True),
        row("trioworker, unscoped, fans of 100", "trioworker", 3_500.0, fan=100),
        row("trioworker, unscoped, fans of 1000", "trioworker", 4_700.0, fan=1000),
        row("trioworker, unscoped, kind limit 8", "trioworker", 1_600.0, kind_limit=8),
        row(GRAPHILE_BATCHED, "graphile", 20_000.0),
    ]
    verdict = compare(rows, {"items_per_s_ceiling": 3_000.0})
    assert verdict["unscoped_vs_graphile_batched"] == 14_000.0 / 20_000.0
    assert verdict["unscoped_vs_best_peer_plain"] == 14_000.0 / 20_000.0
    assert verdict["unscoped_vs_pgbench_ceiling"] == 14_000.0 / 3_000.0
