"""The probe port: grpc.health.v1.Health alone, in plaintext, for Kubernetes' gRPC probes.

The kubelet's gRPC probe speaks plaintext only (it has no way to present or check a
certificate), so a server on mutual TLS cannot be probed on its own port. Each process can open
this second port instead: it serves the same health answers and nothing else, so opening it off
loopback without TLS exposes no RPC. Service `llmgw.liveness` is SERVING while the process's
event loop answers (what a liveness probe should ask: a fleet whose store is down is
NOT_SERVING on "" but must not be restarted for it); "" and the service names are the
server's own health (what a readiness probe asks).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

log = structlog.get_logger(__name__)

LIVENESS = "llmgw.liveness"
"""The health service name that is SERVING while the process answers at all."""


@dataclass
class ProbeServer:
    """A running probe port."""

    server: grpc.aio.Server
    port: int

    async def stop(self, grace_s: float = 1.0) -> None:
        """Close the port."""
        await self.server.stop(grace_s)


async def start_probe_server(listen: str, servicer: health.aio.HealthServicer) -> ProbeServer:
    """Serve `servicer` (the process's health) on `listen` in plaintext, `llmgw.liveness`
    SERVING from now on.

    Raises:
        RuntimeError: the address could not be bound.
    """
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise RuntimeError(f"cannot listen on {listen} for probes: {exc}") from exc
    if port == 0:
        raise RuntimeError(f"cannot listen on {listen} for probes")
    await server.start()
    await servicer.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
    log.info("probe_port_listening", listen=listen, port=port)
    return ProbeServer(server, port)


def add_probe_argument(parser: argparse.ArgumentParser) -> None:
    """`--probe-listen HOST:PORT`: the plaintext health port (default: none)."""
    parser.add_argument(
        "--probe-listen",
        default="",
        metavar="HOST:PORT",
        help="also serve grpc.health.v1.Health alone, in plaintext, here (for Kubernetes' "
        f"gRPC probes; service {LIVENESS!r} answers liveness); default none",
    )
