"""A gateway's traffic report, checked: what one gateway instance saw of each endpoint over one
interval (requests, errors by class, latency histograms), before it is kept for analysis."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleet_svc.domain.canary import MAX_BUCKETS, Histogram
from fleet_svc.domain.errors import InvalidRequest

MAX_ENDPOINTS = 4096
"""Endpoints one report may carry (a gateway routes to far fewer)."""
MAX_INTERVAL_S = 3600
MAX_COUNT = 10**12
"""The most requests one endpoint may report for one interval (bounds the sums)."""
MAX_SKEW_S = 300.0
"""How far into the future (by the fleet's clock) an interval may begin: a gateway's clock
that far ahead is wrong, and its report would count in windows not begun yet."""
MAX_NAME = 256


@dataclass(frozen=True)
class EndpointReport:
    """One endpoint's figures in a report."""

    replica_id: str
    model: str
    revision: int
    requests: int
    errors_5xx: int = 0
    timeouts: int = 0
    context_refusals: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)


def _histogram(h: Histogram, where: str) -> None:
    if len(h.bounds_ms) > MAX_BUCKETS:
        raise InvalidRequest(f"{where} has more than {MAX_BUCKETS} buckets", field=where)
    if h.bounds_ms and len(h.counts) != len(h.bounds_ms) + 1:
        raise InvalidRequest(
            f"{where} needs one count per bound and one above them all"
            f" ({len(h.bounds_ms) + 1}), not {len(h.counts)}",
            field=where,
        )
    if not h.bounds_ms and any(h.counts):
        raise InvalidRequest(f"{where} has counts but no bounds", field=where)
    for b in h.bounds_ms:
        if not math.isfinite(b) or b <= 0:
            raise InvalidRequest(f"{where} bounds are positive milliseconds", field=where)
    for before, after in zip(h.bounds_ms, h.bounds_ms[1:], strict=False):
        if after <= before:
            raise InvalidRequest(f"{where} bounds must rise", field=where)
    if any(c < 0 or c > MAX_COUNT for c in h.counts):
        raise InvalidRequest(f"{where} counts are 0..{MAX_COUNT}", field=where)


def check_report(
    gateway: str,
    interval_start_s: float,
    interval_s: int,
    endpoints: Sequence[EndpointReport],
    now_s: float,
) -> None:
    """Refuse a report that cannot be counted honestly.

    Raises:
        InvalidRequest: naming the field: no gateway, an interval not within 1..3600 s or
            beginning in the future, too many endpoints, a count below 0 or errors above the
            requests, histograms that do not fit their bounds.
    """
    if not gateway or len(gateway) > MAX_NAME or not gateway.isprintable():
        raise InvalidRequest(
            "a traffic report names its gateway instance (1..256 printable characters)",
            field="gateway",
        )
    if not 1 <= interval_s <= MAX_INTERVAL_S:
        raise InvalidRequest(
            f"interval_s is 1..{MAX_INTERVAL_S}, not {interval_s}", field="interval_s"
        )
    if interval_start_s <= 0 or interval_start_s > now_s + MAX_SKEW_S:
        raise InvalidRequest(
            "interval_start must be set and not in the future (the fleet's clock)",
            field="interval_start",
        )
    if len(endpoints) > MAX_ENDPOINTS:
        raise InvalidRequest(
            f"a report carries at most {MAX_ENDPOINTS} endpoints", field="endpoints"
        )
    seen: set[str] = set()
    for i, e in enumerate(endpoints):
        where = f"endpoints[{i}]"
        if not e.replica_id or len(e.replica_id) > MAX_NAME or e.replica_id in seen:
            raise InvalidRequest(f"{where}.replica_id must be set and once per report", field=where)
        seen.add(e.replica_id)
        if not e.model or len(e.model) > MAX_NAME or e.revision < 1:
            raise InvalidRequest(f"{where} names its model and revision (>= 1)", field=where)
        counts = (e.requests, e.errors_5xx, e.timeouts, e.context_refusals)
        if any(c < 0 or c > MAX_COUNT for c in counts):
            raise InvalidRequest(f"{where} counts are 0..{MAX_COUNT}", field=where)
        if e.errors_5xx + e.timeouts + e.context_refusals > e.requests:
            raise InvalidRequest(
                f"{where} counts more errors and refusals than requests", field=where
            )
        _histogram(e.ttft, f"{where}.ttft")
        _histogram(e.itl, f"{where}.itl")
