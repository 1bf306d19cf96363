"""A scripted gateway's traffic reports: per endpoint of a routing table (llmgw.testing.router),
the requests, errors and latencies a test or a benchmark says it saw over one interval, sent
with ReportTraffic as a gateway instance would (one call per interval, keyed by its start)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from google.protobuf import timestamp_pb2

from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc

BOUNDS_MS = (25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0)
"""The latency buckets the scripted gateway reports in."""


@dataclass(frozen=True)
class Seen:
    """What the gateway saw of one endpoint in one interval (latencies all in one bucket)."""

    requests: int
    errors_5xx: int = 0
    timeouts: int = 0
    context_refusals: int = 0
    ttft_ms: float = 40.0
    itl_ms: float = 20.0


def histogram(requests: int, at_ms: float) -> fleet_pb2.LatencyHistogram:
    """`requests` latencies all of about `at_ms`, in BOUNDS_MS's buckets."""
    counts = [0] * (len(BOUNDS_MS) + 1)
    index = next((i for i, b in enumerate(BOUNDS_MS) if at_ms <= b), len(BOUNDS_MS))
    counts[index] = requests
    return fleet_pb2.LatencyHistogram(upper_bounds_ms=list(BOUNDS_MS), counts=counts)


def report(
    gateway: str,
    interval_start_s: float,
    interval_s: int,
    endpoints: Iterable[fleet_pb2.Endpoint],
    seen: Callable[[fleet_pb2.Endpoint], Seen | None],
) -> fleet_pb2.ReportTrafficRequest:
    """A report of `endpoints`, each as `seen` says (None: left out)."""
    start = timestamp_pb2.Timestamp()
    start.FromNanoseconds(int(interval_start_s * 1e9))
    out = fleet_pb2.ReportTrafficRequest(
        gateway=gateway, interval_start=start, interval_s=interval_s
    )
    for ep in endpoints:
        s = seen(ep)
        if s is None:
            continue
        out.endpoints.append(
            fleet_pb2.EndpointTraffic(
                replica_id=ep.replica_id,
                model=ep.model,
                revision=ep.revision,
                requests=s.requests,
                errors_5xx=s.errors_5xx,
                timeouts=s.timeouts,
                context_refusals=s.context_refusals,
                ttft=histogram(s.requests, s.ttft_ms),
                itl=histogram(s.requests, s.itl_ms),
            )
        )
    return out


class ScriptedGateway:
    """One gateway instance reporting what a script says it saw, interval after interval.

    Args:
        stub: the fleet's API (a gateway identity's, where roles are checked).
        name: the instance's name (reports of several instances are summed).
        interval_s: the report interval.
        clock: the wall clock intervals are numbered by.
    """

    def __init__(
        self,
        stub: fleet_pb2_grpc.FleetServiceAsyncStub,
        name: str,
        interval_s: int = 1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._stub = stub
        self.name = name
        self.interval_s = interval_s
        self._clock = clock
        self._last_start = 0.0
        self.sent: list[fleet_pb2.ReportTrafficRequest] = []

    async def send(
        self,
        endpoints: Iterable[fleet_pb2.Endpoint],
        seen: Callable[[fleet_pb2.Endpoint], Seen | None],
        *,
        start_s: float | None = None,
    ) -> fleet_pb2.ReportTrafficResponse:
        """Report one interval (starting now, or at `start_s`; never before the last one's)."""
        start = self._clock() if start_s is None else start_s
        start = max(start, self._last_start + 0.001)
        self._last_start = start
        request = report(self.name, start, self.interval_s, endpoints, seen)
        self.sent.append(request)
        return await self._stub.ReportTraffic(request, timeout=10)

    async def resend(
        self, request: fleet_pb2.ReportTrafficRequest
    ) -> fleet_pb2.ReportTrafficResponse:
        """Send a report again as it was (a retry)."""
        return await self._stub.ReportTraffic(request, timeout=10)
