"""Wiring of the planner's gRPC server: servicer, health, reflection, keepalive, transport
security (llmgw.tls), the source policy, shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass

import grpc
import structlog
from google.rpc import error_details_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from llmgw.limits import Limits
from llmgw.metrics import MetricsServer, RpcMetrics, start_metrics_server
from llmgw.probes import ProbeServer, start_probe_server
from llmgw.rpc.intake import IntakeInterceptor, server_options
from llmgw.rpc.reflection import enable_reflection
from llmgw.tls import ServerTLS, bind
from planner_svc.metrics import add_planner_metrics
from planner_svc.rpc.auth import PlannerAuthInterceptor, authenticator_for
from planner_svc.rpc.servicer import SERVICE_NAME, PlannerServicer, Resolver, add_planner_service
from planner_svc.rpc.status import DOMAIN
from planner_svc.sources.budget import FetchLimits
from planner_svc.sources.policy import SourcePolicy
from planner_svc.sources.resolver import ShapeResolver

log = structlog.get_logger(__name__)

# Keepalive fit for meshes and long streams: ping idle connections every 30 s, and accept
# clients' pings as often as every 10 s without calling them abusive.
SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
]

SHUTDOWN_GRACE_S = 10.0
"""How long calls in flight may finish after SIGTERM."""
MAX_CONNECTION_AGE_S = 60.0
"""How long one client connection lives before the planner sends it GOAWAY: HTTP/2 keeps a
client (the fleet, a gateway) on the pod it first reached, so without an age the pods an HPA
adds behind the ClusterIP Service would get no traffic; after it the client connects anew and
the Service picks a pod. (gRPC core adds ±10 % of jitter.) The fleet sets none: its agents'
and gateways' streams are meant to last."""
MAX_CONNECTION_AGE_GRACE_S = 30.0
"""How long calls in flight on an aged connection may finish (a plan that reads a source
takes seconds)."""


def connection_age_options(age_s: float, grace_s: float) -> list[tuple[str, int]]:
    """The server options that close each connection after `age_s` (0: never), calls in
    flight then given `grace_s`."""
    if age_s <= 0:
        return []
    return [
        ("grpc.max_connection_age_ms", round(age_s * 1000)),
        ("grpc.max_connection_age_grace_ms", round(grace_s * 1000)),
    ]


@dataclass
class PlannerServer:
    """A running planner: the gRPC server, the port it bound and its health."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    servicer: PlannerServicer
    metrics: MetricsServer | None = None
    """The `/metrics` endpoint, when asked for."""
    probes: ProbeServer | None = None
    """The plaintext health port for Kubernetes' probes, when asked for."""

    async def stop(self, grace_s: float = SHUTDOWN_GRACE_S, drain_s: float = 0.0) -> None:
        """Report NOT_SERVING, keep serving for `drain_s` (long enough for a readiness probe to
        see it and the Service to drop the pod: deploy/ sets it), then let calls in flight
        finish within `grace_s` and stop."""
        await self.health.enter_graceful_shutdown()
        if drain_s > 0:
            log.info("planner_draining", port=self.port, drain_s=drain_s)
            await asyncio.sleep(drain_s)
        await self.server.stop(grace_s)
        if self.metrics is not None:
            await self.metrics.stop()
        if self.probes is not None:
            await self.probes.stop()
        log.info("planner_stopped", port=self.port)


async def start_planner(
    listen: str,
    resolver: Resolver | None = None,
    *,
    tls: ServerTLS | None = None,
    insecure: bool = False,
    policy: SourcePolicy | None = None,
    metrics: str = "",
    probes: str = "",
    limits: Limits | None = None,
    max_connection_age_s: float = MAX_CONNECTION_AGE_S,
    settings_path: str = "",
    tokens_path: str = "",
) -> PlannerServer:
    """Start a planner listening on `listen` (HOST:PORT; port 0 picks one).

    Args:
        listen: where to listen.
        resolver: how sources become shapes (default: a ShapeResolver under `policy`).
        tls: the server's certificate files; None serves plaintext, on loopback only unless
            `insecure`.
        insecure: allow plaintext off loopback.
        policy: what the default resolver may fetch (default: from the environment,
            `SourcePolicy.from_env`).
        metrics: HOST:PORT to serve Prometheus metrics at (llmgw.metrics); "" serves none.
        probes: HOST:PORT of a plaintext health port for Kubernetes (llmgw.probes); "": none.
        limits: how large a request may be and how many bytes of answers are remembered
            (default: from the environment, `Limits.from_env`; docs/errors.md).
        max_connection_age_s: GOAWAY each connection after this long (0: never; see
            MAX_CONNECTION_AGE_S).
        settings_path: the cluster settings whose `roles:` (and `revoked:`) the planner
            honours, re-read when they change (planner_svc.rpc.auth); "": the defaults.
        tokens_path: a tokens file of bearer tokens (as the fleet's); "": none.

    Raises:
        TLSConfigError: plaintext off loopback without `insecure`, or unusable TLS files.
        RuntimeError: the address could not be bound.
        InvalidRoles: the settings' `roles:` is malformed.
        ValueError: the tokens file cannot be read or parsed.
    """
    limits = limits or Limits.from_env(os.environ)
    authenticator = authenticator_for(tls, tokens_path, settings_path)
    if resolver is None:
        resolver = ShapeResolver(
            policy=policy or SourcePolicy.from_env(os.environ),
            fetch_limits=FetchLimits.from_env(os.environ),
        )
    registry = CollectorRegistry() if metrics else None
    # Metrics outermost (every call counted), then the intake: a request too large or
    # malformed is refused before anything reads it; then who calls (roles, revocation).
    interceptors: list[grpc.aio.ServerInterceptor] = [
        IntakeInterceptor(DOMAIN, limits),
        PlannerAuthInterceptor(authenticator),
    ]
    if registry is not None:
        interceptors.insert(0, RpcMetrics(registry))
        add_planner_metrics(registry, resolver)
    server = grpc.aio.server(
        options=SERVER_OPTIONS
        + server_options(limits)
        + connection_age_options(max_connection_age_s, MAX_CONNECTION_AGE_GRACE_S),
        interceptors=interceptors,
    )
    servicer = add_planner_service(server, resolver, limits)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name)
    # error_details is imported so reflection can describe the details of a refusal.
    assert error_details_pb2.ErrorInfo.DESCRIPTOR.full_name == "google.rpc.ErrorInfo"
    enable_reflection(server, names)
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    port = bind(server, listen, tls, insecure=insecure, service="planner")
    metrics_server = await start_metrics_server(metrics, registry) if registry else None
    probe_server = await start_probe_server(probes, health_servicer) if probes else None
    await server.start()
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "planner_started",
        listen=listen,
        port=port,
        tls="mutual" if tls and tls.mutual else "server" if tls else "none",
    )
    return PlannerServer(
        server=server,
        port=port,
        health=health_servicer,
        servicer=servicer,
        metrics=metrics_server,
        probes=probe_server,
    )


async def serve(
    listen: str,
    *,
    tls: ServerTLS | None = None,
    insecure: bool = False,
    policy: SourcePolicy | None = None,
    metrics: str = "",
    probes: str = "",
    drain_s: float = 0.0,
    settings_path: str = "",
    tokens_path: str = "",
) -> None:
    """Run a planner until SIGTERM or SIGINT, then shut it down gracefully: NOT_SERVING, still
    serving for `drain_s`, then calls in flight given SHUTDOWN_GRACE_S."""
    running = await start_planner(
        listen,
        tls=tls,
        insecure=insecure,
        policy=policy,
        metrics=metrics,
        probes=probes,
        settings_path=settings_path,
        tokens_path=tokens_path,
    )
    host = listen.rsplit(":", 1)[0]
    # The first line stays `planner listening on HOST:PORT` (llmgw up and scripts read it);
    # how it listens is said by the log line bind() wrote.
    print(f"planner listening on {host}:{running.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("planner_stopping", port=running.port)
    await running.stop(SHUTDOWN_GRACE_S, drain_s)
