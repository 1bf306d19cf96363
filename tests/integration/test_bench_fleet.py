"""bench.fleet_failover's and bench.fleet_spread's cores at a tiny size, on PostgreSQL: they run
to the end and their figures are there and sane (no timing thresholds: the machine is shared)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from bench import fleet_failover, fleet_spread
from tests.support.postgres import admin

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_the_failover_bench_times_a_trial_and_counts_replicas(tmp_path: Path) -> None:
    """One kill -9 trial with a short lease: a new leader is timed, the agents of the killed
    fleet come back, those of the others keep their streams, and no replica is lost, doubled
    or stuck."""
    admin().close()  # fails (or skips, LLMGW_SKIP_POSTGRES=1) when PostgreSQL is not there
    figures = asyncio.run(fleet_failover.measure(1, tmp_path, lease_s=1.5, renew_s=0.3))
    assert figures["trials"] == 1
    assert 0 < figures["lead_min_s"] <= figures["lead_max_s"] < 60
    assert 0 < figures["agents_max_s"] < 60
    assert (figures["lost"], figures["doubled"], figures["stuck"]) == (0, 0, 0)
    assert figures["moved"] == 0


def test_the_spread_bench_compares_three_fleets_with_one(tmp_path: Path) -> None:
    """Three agents on one fleet, then on three: both rows and their ratios are there, and
    every agent stays on the fleet it reached first (every fleet serves agents)."""
    admin().close()
    for f in (1, 3):
        (tmp_path / f"f{f}").mkdir()
    figures = asyncio.run(fleet_spread.measure(3, tmp_path, window_s=0.2))
    for key in ("ack_p99_ms@1", "ack_p99_ms@3", "ack_p99_ratio"):
        assert math.isfinite(figures[key]), key
    assert "cpu_per_agent_ratio" in figures  # NaN when a tiny window saw no CPU tick
    assert figures["ack_p99_ms@1"] > 0 and figures["ack_p99_ms@3"] > 0
    assert figures["hops@1"] == 0 and figures["hops@3"] == 0
    assert "busiest_ms_per_agent_s@3" in figures
