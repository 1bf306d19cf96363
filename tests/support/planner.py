"""A real planner server in-process on 127.0.0.1:0, for integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc

from llmgw.planner.v1 import planner_pb2_grpc
from llmgw.tls import ClientTLS, ServerTLS, aio_channel
from planner_svc.rpc.servicer import Resolver
from planner_svc.server import PlannerServer, start_planner


@asynccontextmanager
async def running_planner(
    resolver: Resolver | None = None,
    *,
    tls: ServerTLS | None = None,
    client_tls: ClientTLS | None = None,
    metrics: str = "",
) -> AsyncIterator[
    tuple[PlannerServer, planner_pb2_grpc.PlannerServiceAsyncStub, grpc.aio.Channel]
]:
    """Start a planner on a free port; yield it, a stub and its channel; stop it after. With
    `tls` it serves TLS and the channel uses `client_tls`; `metrics` is where it serves
    /metrics ("": nowhere)."""
    server = await start_planner("127.0.0.1:0", resolver, tls=tls, metrics=metrics)
    channel = aio_channel(f"127.0.0.1:{server.port}", client_tls)
    try:
        yield server, planner_pb2_grpc.PlannerServiceStub(channel), channel
    finally:
        await channel.close()
        await server.stop(grace_s=1.0)
