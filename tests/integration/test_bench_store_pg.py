"""bench.store_pg's core at a tiny size: both fleets answer, every figure is there and sane, and
the bench's database is dropped after (no timing thresholds: the machine is shared)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import psycopg

from bench import store_pg
from bench.planner_throughput import ROOT
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


def test_the_store_bench_runs_a_baseline_checkout_in_the_same_rounds(tmp_path: Path) -> None:
    """With a baseline checkout (here this one), a third fleet is timed beside the two, its
    ratios are the quotients of the medians, and both bench databases are dropped after."""
    admin().close()
    figures = asyncio.run(
        store_pg.measure(calls=3, rounds=2, replicas=2, folder=tmp_path, burst=16, against=ROOT)
    )
    assert 0 < figures["check_p99_against_ms"] < 10_000
    for what in ("set_context", "list_replicas"):
        base_ms = figures[f"{what}_against_ms"]
        assert 0 < base_ms < 10_000
        assert math.isclose(
            figures[f"{what}_against_over_sqlite"], base_ms / figures[f"{what}_sqlite_ms"]
        )
        assert math.isclose(
            figures[f"{what}_pg_over_against"], figures[f"{what}_postgresql_ms"] / base_ms
        )
    with psycopg.connect(store_pg.admin_dsn(), autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'llmgw_bench_%'"
        ).fetchall()
    assert left == []
