"""bench.planner_tls at a tiny size: both planners answer and the figures are sane."""

from __future__ import annotations

import math
from pathlib import Path

from bench import planner_tls


async def test_planner_tls_reports_both_rates_and_the_ratio(tmp_path: Path) -> None:
    """A plaintext and a mutual-TLS planner both answer SizeContext; rates, CPU per call and
    the ratio come back finite (no timing threshold: the machine is shared)."""
    figures = await planner_tls.measure(rounds=2, calls=20, concurrency=4, folder=tmp_path)
    assert {"plain_per_s", "mtls_per_s", "mtls_ratio", "mtls_cpu_us"} <= set(figures)
    assert all(math.isfinite(v) for v in figures.values())
    assert figures["plain_per_s"] > 0 and figures["mtls_per_s"] > 0 and figures["mtls_ratio"] > 0
