"""The probe port: grpc.health.v1.Health's Check alone, in plaintext, for Kubernetes' probes.

The kubelet's gRPC probe speaks plaintext only (it has no way to present or check a
certificate), so a server on mutual TLS cannot be probed on its own port. Each process can open
this second port instead: it answers the same health as the server's own port and nothing else,
so opening it off loopback without TLS exposes no RPC. Service `llmgw.liveness` is SERVING while
the process's event loop answers (what a liveness probe should ask: a fleet whose store is down
is NOT_SERVING on "" but must not be restarted for it); "" and the service names are the
server's own health (what a readiness probe asks).

Anyone who reaches the port may call it, so it serves as little as a probe needs (issue 18):
`Health/Check` only (no `Watch`, which holds a stream and a service name per caller, no
reflection), requests of at most `MAX_REQUEST_BYTES`, a few streams per connection, a few
connections and calls at once, and idle connections closed. What a flood of it can hold is
then bounded by those numbers, whatever it sends.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2

from llmgw.tls import is_loopback, listen_host

log = structlog.get_logger(__name__)

LIVENESS = "llmgw.liveness"
"""The health service name that is SERVING while the process answers at all."""

CHECK_METHOD = "/grpc.health.v1.Health/Check"
"""The one method the probe port serves."""

MAX_REQUEST_BYTES = 1024
"""A Check request's most bytes: a service name is a few dozen (the kubelet sends one of the
manifest's `service:`)."""
MAX_METADATA_BYTES = 4096
"""The most header bytes of one call (the kubelet sends a handful of short headers)."""
MAX_STREAMS_PER_CONNECTION = 4
"""Concurrent calls on one HTTP/2 connection (a probe makes one at a time)."""
MAX_CONNECTIONS = 16
"""Connections the port holds at once (the kubelet opens one per probe)."""
MAX_CONCURRENT_CALLS = 16
"""Calls the port runs at once, over every connection; more are refused RESOURCE_EXHAUSTED."""
IDLE_CONNECTION_MS = 30_000
"""A connection with no call for this long is closed (a probe connection lives for one call)."""


def probe_server_options() -> list[tuple[str, int]]:
    """The grpc core settings that bound what a caller of the probe port can hold."""
    return [
        ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
        ("grpc.max_send_message_length", MAX_REQUEST_BYTES),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ("grpc.max_allowed_incoming_connections", MAX_CONNECTIONS),
        ("grpc.max_connection_idle_ms", IDLE_CONNECTION_MS),
        ("grpc.http2.max_pings_without_data", 2),
    ]


class _CheckOnly(grpc.GenericRpcHandler):
    """Routes `Health/Check` to the process's health servicer and nothing else (UNIMPLEMENTED,
    as grpc answers an unknown method)."""

    def __init__(self, servicer: health.aio.HealthServicer) -> None:
        self._handler = grpc.unary_unary_rpc_method_handler(
            servicer.Check,
            request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
        )

    def service(self, handler_call_details: Any) -> Any:
        if handler_call_details.method == CHECK_METHOD:
            return self._handler
        return None


@dataclass
class ProbeServer:
    """A running probe port."""

    server: grpc.aio.Server
    port: int

    async def stop(self, grace_s: float = 1.0) -> None:
        """Close the port."""
        await self.server.stop(grace_s)


async def start_probe_server(listen: str, servicer: health.aio.HealthServicer) -> ProbeServer:
    """Serve `servicer`'s Check (the process's health) on `listen` in plaintext, within the
    bounds above, `llmgw.liveness` SERVING from now on. Off loopback it logs
    `probe_port_off_loopback` (a warning): anyone on that network may probe it.

    Raises:
        RuntimeError: the address could not be bound.
    """
    server = grpc.aio.server(
        options=probe_server_options(), maximum_concurrent_rpcs=MAX_CONCURRENT_CALLS
    )
    server.add_generic_rpc_handlers((_CheckOnly(servicer),))
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise RuntimeError(f"cannot listen on {listen} for probes: {exc}") from exc
    if port == 0:
        raise RuntimeError(f"cannot listen on {listen} for probes")
    await server.start()
    await servicer.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
    if not is_loopback(listen_host(listen)):
        log.warning(
            "probe_port_off_loopback",
            listen=listen,
            port=port,
            note="anyone on this network can reach the plaintext health Check; it serves "
            "nothing else and holds each caller to the limits in llmgw.probes",
        )
    log.info("probe_port_listening", listen=listen, port=port)
    return ProbeServer(server, port)


def add_probe_argument(parser: argparse.ArgumentParser) -> None:
    """`--probe-listen HOST:PORT`: the plaintext health port (default: none)."""
    parser.add_argument(
        "--probe-listen",
        default="",
        metavar="HOST:PORT",
        help="also serve grpc.health.v1.Health's Check alone, in plaintext, here (for "
        f"Kubernetes' gRPC probes; service {LIVENESS!r} answers liveness); default none",
    )
