"""Wiring of the fleet: store, catalog, controller, the API and the agents' stream, transport
security (llmgw.tls)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field

import grpc
import structlog
from google.rpc import error_details_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from fleet_svc.app import FleetApp
from fleet_svc.catalog import Catalog
from fleet_svc.controller import Controller
from fleet_svc.domain.nodes import Liveness
from fleet_svc.planner import Planner
from fleet_svc.rpc.agent_stream import SERVICE_NAME as AGENT_SERVICE
from fleet_svc.rpc.agent_stream import add_agent_service
from fleet_svc.rpc.auth import AuthInterceptor, authenticator_for
from fleet_svc.rpc.planner import GrpcPlanner
from fleet_svc.rpc.servicer import SERVICE_NAME as FLEET_SERVICE
from fleet_svc.rpc.servicer import add_fleet_service
from fleet_svc.rpc.settings import declared_entries
from fleet_svc.rpc.status import DOMAIN
from fleet_svc.store.base import Store
from fleet_svc.store.urls import open_store
from fleet_svc.store_health import StoreHealth
from llmgw.clock import Clock, SystemClock
from llmgw.limits import Limits
from llmgw.rpc.intake import IntakeInterceptor, server_options
from llmgw.tls import ClientTLS, ServerTLS, bind, check_listen

log = structlog.get_logger(__name__)

# Keepalive fit for long agent streams behind meshes: ping idle connections every 20 s and
# accept clients' pings as often as every 5 s.
SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
]


@dataclass
class FleetOptions:
    """How a fleet runs."""

    listen: str = "127.0.0.1:50052"
    store_url: str = "data/fleet.db"
    settings_path: str = ""
    liveness: Liveness = field(default_factory=Liveness)
    drain_s: float = 2.0
    tick_s: float = 0.5
    planner: str = "127.0.0.1:50051"
    """The planner's address, for SetContext and SetGPUs."""
    start_timeout_s: float = 600.0
    """How long a rollout's new replica may take to turn healthy."""
    tls: ServerTLS | None = None
    """The fleet's certificate files (llmgw.tls); with a CA, clients and agents must present
    a certificate it signed. None serves plaintext, on loopback only unless `insecure`."""
    insecure: bool = False
    """Allow plaintext off loopback (loudly)."""
    planner_tls: ClientTLS | None = None
    """How the fleet dials the planner: its CA and the fleet's client pair; None: plaintext."""
    tokens_path: str = ""
    """A file of bearer-token hashes (`NAME SHA256HEX` lines); given, callers may be tokens."""
    limits: Limits | None = None
    """How large a request may be (docs/errors.md); None: from the environment
    (`Limits.from_env`)."""


@dataclass
class FleetServer:
    """A running fleet."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    controller: Controller
    catalog: Catalog
    store: Store
    loop_task: asyncio.Task[None]
    planner: Planner
    store_health: StoreHealth | None = None
    store_task: asyncio.Task[None] | None = None

    async def stop(self, grace_s: float = 5.0) -> None:
        """NOT_SERVING, close the streams, stop the loop, close the store."""
        if self.store_task is not None:
            self.store_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.store_task
        await self.health.enter_graceful_shutdown()
        for link in list(self.controller.state.links.values()):
            link.close("")
        await self.server.stop(grace_s)
        self.loop_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.loop_task
        self.controller.flush()
        self.store.close()
        await self.planner.close()
        log.info("fleet_stopped", port=self.port)


async def start_fleet(opts: FleetOptions, clock: Clock | None = None) -> FleetServer:
    """Start a fleet: health NOT_SERVING until the store is open and the settings loaded, and
    then SERVING only while the store can be read (fleet_svc.store_health).

    Raises:
        StoreError: the store cannot be reached, is damaged, or has a newer schema.
        ValueError: the store URL names nothing this fleet can open.
        TLSConfigError: plaintext asked for off loopback without insecure.
    """
    check_listen(opts.listen, opts.tls, insecure=opts.insecure)  # before anything is opened
    authenticator = authenticator_for(opts.tls, opts.tokens_path, opts.settings_path)
    limits = opts.limits or Limits.from_env(os.environ)
    # The intake first: a request too large or malformed is refused before anything reads it.
    server = grpc.aio.server(
        options=SERVER_OPTIONS + server_options(limits),
        interceptors=[IntakeInterceptor(DOMAIN, limits), AuthInterceptor(authenticator)],
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", FLEET_SERVICE, AGENT_SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    assert error_details_pb2.ErrorInfo.DESCRIPTOR.full_name == "google.rpc.ErrorInfo"
    reflection.enable_server_reflection(
        (FLEET_SERVICE, AGENT_SERVICE, "grpc.health.v1.Health", reflection.SERVICE_NAME), server
    )
    store = open_store(opts.store_url)
    clock = clock or SystemClock()
    catalog = Catalog(store, clock.wall)
    if opts.settings_path:
        catalog.declare(declared_entries(opts.settings_path), opts.settings_path)
    controller = Controller(
        store,
        catalog.wants,
        liveness=opts.liveness,
        drain_s=opts.drain_s,
        tick_s=opts.tick_s,
        clock=clock,
        start_timeout_s=opts.start_timeout_s,
    )
    catalog.on_change = controller.wake
    planner = GrpcPlanner(opts.planner, tls=opts.planner_tls)
    app = FleetApp(catalog, controller, store, planner, clock.wall)
    add_fleet_service(server, app, store, controller, limits)
    add_agent_service(
        server, controller, clock, node_certificates=authenticator.policy.node_certificates
    )
    port = bind(server, opts.listen, opts.tls, insecure=opts.insecure, service="fleet")
    await server.start()
    loop_task = asyncio.create_task(controller.run())
    store_health = StoreHealth(store, health_servicer, ("", FLEET_SERVICE, AGENT_SERVICE))
    await store_health.check()
    store_task = asyncio.create_task(store_health.run())
    log.info(
        "fleet_started",
        listen=opts.listen,
        port=port,
        store=store.where,
        tls="mutual" if opts.tls and opts.tls.mutual else "server" if opts.tls else "none",
    )
    return FleetServer(
        server,
        port,
        health_servicer,
        controller,
        catalog,
        store,
        loop_task,
        planner,
        store_health,
        store_task,
    )


async def serve(opts: FleetOptions) -> None:
    """Run a fleet until SIGTERM or SIGINT."""
    running = await start_fleet(opts)
    host = opts.listen.rsplit(":", 1)[0]
    print(f"fleet listening on {host}:{running.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await running.stop()
