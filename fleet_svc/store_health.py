"""The fleet's health follows its store: SERVING only while the store can be read.

A task probes the store every PROBE_INTERVAL_S (Store.probe: reachable, schema known, no damage
found by any call since it opened) and sets every health service name SERVING or NOT_SERVING
accordingly, logging each change with the store's own one-line reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog
from grpc_health.v1 import health, health_pb2

from fleet_svc.store.base import Store, StoreError

log = structlog.get_logger(__name__)

PROBE_INTERVAL_S = 1.0
"""How often the store is probed: a PostgreSQL outage shows in health within about this long
(Kubernetes probes every 10 s by default, so a second is well inside one probe period)."""


class StoreHealth:
    """The store's last probe: "" while it answers, else what is wrong (one line)."""

    def __init__(
        self,
        store: Store,
        servicer: health.aio.HealthServicer,
        services: Sequence[str],
        *,
        interval_s: float = PROBE_INTERVAL_S,
    ) -> None:
        self._store = store
        self._servicer = servicer
        self._services = tuple(services)
        self._interval_s = interval_s
        self.problem: str | None = None
        """None before the first probe, "" while the store answers, else the reason."""

    async def check(self) -> str:
        """Probe once and set health from the answer; the problem found ("" when none)."""
        try:
            if self._store.thread_safe:
                # A probe of a server that is down waits for a connect timeout: not on the loop.
                await asyncio.to_thread(self._store.probe)
            else:
                self._store.probe()
            problem = ""
        except StoreError as exc:
            problem = str(exc)
        if problem != self.problem:
            status = (
                health_pb2.HealthCheckResponse.NOT_SERVING
                if problem
                else health_pb2.HealthCheckResponse.SERVING
            )
            for name in self._services:
                await self._servicer.set(name, status)
            if problem:
                log.error("store_unhealthy", problem=problem)
            elif self.problem is not None:
                log.info("store_healthy_again")
            self.problem = problem
        return problem

    async def run(self) -> None:
        """Probe until cancelled."""
        while True:
            await self.check()
            await asyncio.sleep(self._interval_s)
