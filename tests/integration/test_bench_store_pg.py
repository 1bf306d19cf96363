"""bench.store_pg's core at a tiny size: both fleets answer, every figure is there and sane, and
the bench's database is dropped after (no timing thresholds: the machine is shared)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import psycopg

from bench import store_pg
from tests.support.postgres import admin


def test_the_store_bench_measures_both_stores_and_cleans_up(tmp_path: Path) -> None:
    """SetContext and ListReplicas are timed on SQLite and PostgreSQL, each ratio is their
    quotient, a health Check is timed during a burst of changes on each, and no bench
    database is left on the server."""
    admin().close()  # fails (or skips, LLMGW_SKIP_POSTGRES=1) when PostgreSQL is not there
    figures = asyncio.run(
        store_pg.measure(calls=3, rounds=1, replicas=2, folder=tmp_path, burst=16)
    )
    assert all(0 < figures[f"check_p99_{kind}_ms"] < 10_000 for kind in ("sqlite", "postgresql"))
    for what in ("set_context", "list_replicas"):
        sqlite_ms = figures[f"{what}_sqlite_ms"]
        pg_ms = figures[f"{what}_postgresql_ms"]
        assert 0 < sqlite_ms < 10_000 and 0 < pg_ms < 10_000
        assert math.isclose(figures[f"{what}_pg_over_sqlite"], pg_ms / sqlite_ms)
    with psycopg.connect(store_pg.admin_dsn(), autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'llmgw_bench_%'"
        ).fetchall()
    assert left == []
