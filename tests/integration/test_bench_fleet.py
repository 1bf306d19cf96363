"""bench.fleet_failover's and bench.fleet_spread's cores at a tiny size, on PostgreSQL: they run
to the end and their figures are there and sane (no timing thresholds: the machine is shared)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from bench import fleet_failover, fleet_spread, go_swarm
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


def test_the_spread_bench_with_the_go_swarm_spreads_its_agents(tmp_path: Path) -> None:
    """With `--swarm go` the Go program's agents, given the three fleets' addresses, join and
    every one acks the change on one fleet and on three, and no stream ends before the bench
    lets it go (the swarm does not reconnect, so an agent it sent to a fleet stays there)."""
    if go_swarm.go_tool() is None:
        pytest.skip("go is not installed: `--swarm go` builds bench/swarm with it")
    admin().close()
    for f in (1, 3):
        (tmp_path / f"f{f}").mkdir()
    figures = asyncio.run(fleet_spread.measure(4, tmp_path, window_s=0.2, swarm="go"))
    assert figures["ack_p99_ms@1"] > 0 and figures["ack_p99_ms@3"] > 0
    assert math.isfinite(figures["ack_p99_ratio"])
    assert figures["ended@1"] == 0 and figures["ended@3"] == 0
    assert "hops@3" not in figures  # reconnections are not counted for the Go swarm
    assert figures["swarm_cpu_pct@3"] >= 0
