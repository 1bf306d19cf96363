"""A real fleet server in-process on 127.0.0.1:0, for integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc

from fleet_svc.domain.nodes import Liveness
from fleet_svc.server import FleetOptions, FleetServer, start_fleet
from llmgw.fleet.v1 import fleet_pb2_grpc
from llmgw.tls import ClientTLS, ServerTLS, aio_channel

FAST = Liveness(interval_s=0.2, grace_heartbeats=3, lost_after_s=1.5)
"""Liveness for tests: NOT_READY after 0.6 s of silence, LOST after 1.5 s."""


@asynccontextmanager
async def running_fleet(
    data: Path,
    *,
    settings: str = "",
    liveness: Liveness = FAST,
    drain_s: float = 0.2,
    planner: str = "127.0.0.1:1",
    start_timeout_s: float = 30.0,
    tls: ServerTLS | None = None,
    client_tls: ClientTLS | None = None,
    planner_tls: ClientTLS | None = None,
    tokens_path: str = "",
    metrics: str = "",
    probes: str = "",
    listen: str = "127.0.0.1:0",
    store_url: str = "",
) -> AsyncIterator[tuple[FleetServer, fleet_pb2_grpc.FleetServiceAsyncStub]]:
    """Start a fleet on a free port with its store in `data`; stop it after. With `tls` it
    serves TLS and the stub's channel uses `client_tls`; `planner_tls` is how it dials the
    planner; `tokens_path` a file of bearer-token hashes it accepts; `metrics` and `probes`
    where it serves /metrics and its plaintext health port ("": nowhere); `store_url` another
    store than the SQLite file in `data` (a PostgreSQL DSN)."""
    server = await start_fleet(
        FleetOptions(
            listen=listen,
            store_url=store_url or str(data / "fleet.db"),
            settings_path=settings,
            liveness=liveness,
            drain_s=drain_s,
            tick_s=0.05,
            planner=planner,
            start_timeout_s=start_timeout_s,
            tls=tls,
            planner_tls=planner_tls,
            tokens_path=tokens_path,
            metrics=metrics,
            probes=probes,
        )
    )
    channel: grpc.aio.Channel = aio_channel(f"127.0.0.1:{server.port}", client_tls)
    try:
        yield server, fleet_pb2_grpc.FleetServiceStub(channel)
    finally:
        await channel.close()
        await server.stop(grace_s=0.5)
