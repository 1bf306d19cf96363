"""Wiring of the fleet: store, catalog, controller, the API and the agents' stream, transport
security (llmgw.tls)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
from dataclasses import dataclass, field

import grpc
import structlog
from google.rpc import error_details_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from fleet_svc.answers import REQUEST_ID_WINDOW_S
from fleet_svc.app import FleetApp
from fleet_svc.catalog import Catalog
from fleet_svc.controller import Controller
from fleet_svc.domain.nodes import Liveness
from fleet_svc.duties import FOLLOW_S, Duties
from fleet_svc.leadership import LEASE_S, RENEW_S, Leadership, LeasedStore
from fleet_svc.metrics import Leadership as LeaderStatus
from fleet_svc.metrics import add_fleet_metrics
from fleet_svc.nodelink.remote import RemoteNodes
from fleet_svc.planner import Planner
from fleet_svc.rpc.agent_relay import NodeRelay, encode_desired
from fleet_svc.rpc.agent_stream import SERVICE_NAME as AGENT_SERVICE
from fleet_svc.rpc.agent_stream import add_agent_service
from fleet_svc.rpc.auth import AuthInterceptor, authenticator_for
from fleet_svc.rpc.leader_gate import LeaderGate
from fleet_svc.rpc.planner import GrpcPlanner
from fleet_svc.rpc.servicer import SERVICE_NAME as FLEET_SERVICE
from fleet_svc.rpc.servicer import add_fleet_service
from fleet_svc.rpc.settings import declared_entries
from fleet_svc.rpc.status import DOMAIN
from fleet_svc.store.base import Store
from fleet_svc.store.urls import open_store
from fleet_svc.store_health import StoreHealth
from fleet_svc.watch import HEARTBEAT_S, EndpointHub
from llmgw.clock import Clock, SystemClock
from llmgw.limits import Limits
from llmgw.metrics import MetricsServer, RpcMetrics, start_metrics_server
from llmgw.probes import ProbeServer, start_probe_server
from llmgw.rpc.intake import IntakeInterceptor, server_options
from llmgw.rpc.reflection import enable_reflection
from llmgw.tls import ClientTLS, ServerTLS, bind, check_listen
from llmgw.tracing import current_traceparent

log = structlog.get_logger(__name__)

# Keepalive fit for long agent streams behind meshes: ping idle connections every 20 s and
# accept clients' pings as often as every 5 s.
SERVER_OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    # A call gRPC core accepted waits in its queue until the server's loop asks for the next
    # one; core cancels those that waited longer than this (its default is 30 s). Thousands of
    # agents connecting at once to a busy fleet waited that long and were ended CANCELLED
    # (bench/README.md, "heartbeats as one beat a follower"): they wait for their turn instead.
    ("grpc.server_max_unrequested_time_in_server", 300),
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
    request_id_window_s: float = REQUEST_ID_WINDOW_S
    """How long a request id's first answer is kept (a retry within it gets that answer)."""
    tls: ServerTLS | None = None
    """The fleet's certificate files (llmgw.tls); with a CA, clients and agents must present
    a certificate it signed. None serves plaintext, on loopback only unless `insecure`."""
    insecure: bool = False
    """Allow plaintext off loopback (loudly)."""
    planner_tls: ClientTLS | None = None
    """How the fleet dials the planner: its CA and the fleet's client pair; None: plaintext."""
    tokens_path: str = ""
    """A file of bearer-token hashes (`NAME SHA256HEX` lines); given, callers may be tokens."""
    metrics: str = ""
    """HOST:PORT to serve Prometheus metrics at (fleet_svc/metrics.py); "" serves none."""
    probes: str = ""
    """HOST:PORT of the plaintext health port for Kubernetes' probes (llmgw.probes); "": none."""
    watch_heartbeat_s: float = HEARTBEAT_S
    """A WatchReplicas stream's longest silence before the fleet sends it a HEARTBEAT."""
    lease_s: float = LEASE_S
    """On a shared store (PostgreSQL): how long the leader's lease lasts unrenewed."""
    renew_s: float = RENEW_S
    """On a shared store: how often the leader renews and followers try for the lease."""
    follow_s: float = FOLLOW_S
    """On a shared store: how often a follower checks the store's digest besides the
    notifications of the leader's writes (fleet_svc/duties.py)."""
    advertise: str = ""
    """HOST:PORT where this fleet is called, told to callers of a follower while it leads;
    "": the listen host (this host's name when that is a wildcard) and the bound port."""
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
    duties: Duties
    planner: Planner
    store_health: StoreHealth | None = None
    store_task: asyncio.Task[None] | None = None
    metrics: MetricsServer | None = None
    probes: ProbeServer | None = None
    app: FleetApp | None = None
    relay: NodeRelay | None = None
    relay_task: asyncio.Task[None] | None = None

    @property
    def loop_task(self) -> asyncio.Task[None]:
        """The task running the controller (while leading) or following the store."""
        task = self.duties.task
        assert task is not None, "a started fleet runs one loop or the other"
        return task

    @property
    def is_leader(self) -> bool:
        """Whether this fleet leads now (always, on a store without a lease)."""
        return self.duties.is_leader

    @property
    def epoch(self) -> int:
        """The epoch it leads at (0 while following, and on a store without a lease)."""
        return self.duties.epoch

    async def stop(self, grace_s: float = 5.0) -> None:
        """NOT_SERVING, close the streams, stop the loop, close the store."""
        if self.store_task is not None:
            self.store_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.store_task
        await self.health.enter_graceful_shutdown()
        for link in list(self.controller.state.links.values()):
            link.close("")
        if self.relay is not None:
            self.relay.close_streams()
        await self.server.stop(grace_s)
        await self.duties.stop()
        if self.relay_task is not None:
            self.relay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.relay_task
        if self.app is not None:
            self.app.calls.close()
        self.controller.calls.close()
        self.store.close()
        await self.planner.close()
        if self.metrics is not None:
            await self.metrics.stop()
        if self.probes is not None:
            await self.probes.stop()
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
    gate = LeaderGate(lambda: None)
    registry = CollectorRegistry() if opts.metrics else None
    # Metrics outermost, so refusals by the auth interceptor and the leader gate are counted.
    # Then the intake: a request too large or malformed is refused before anything reads it.
    limits = opts.limits or Limits.from_env(os.environ)
    interceptors: list[grpc.aio.ServerInterceptor] = [
        IntakeInterceptor(DOMAIN, limits),
        AuthInterceptor(authenticator, limits=limits),
        gate,
    ]
    if registry is not None:
        interceptors.insert(0, RpcMetrics(registry))
    server = grpc.aio.server(
        options=SERVER_OPTIONS + server_options(limits), interceptors=interceptors
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", FLEET_SERVICE, AGENT_SERVICE):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    assert error_details_pb2.ErrorInfo.DESCRIPTOR.full_name == "google.rpc.ErrorInfo"
    enable_reflection(server, (FLEET_SERVICE, AGENT_SERVICE, "grpc.health.v1.Health"))
    store = open_store(opts.store_url)
    clock = clock or SystemClock()
    catalog = Catalog(store, clock.wall)
    declared = declared_entries(opts.settings_path) if opts.settings_path else []
    for entry in declared:
        catalog.declared[entry.name] = opts.settings_path
    controller = Controller(
        store,
        catalog.wants,
        liveness=opts.liveness,
        drain_s=opts.drain_s,
        tick_s=opts.tick_s,
        clock=clock,
        start_timeout_s=opts.start_timeout_s,
        hub=EndpointHub(clock.wall, heartbeat_s=opts.watch_heartbeat_s),
        model_at=catalog.model_at,
        kept_wants=catalog.kept_wants,
    )
    # The planner is checked as planner.service.llmgw (unless a server name was given), so
    # another service's certificate of the same CA cannot pose as it.
    planner_tls = opts.planner_tls.expecting("planner") if opts.planner_tls else None
    planner = GrpcPlanner(opts.planner, tls=planner_tls)
    app = FleetApp(
        catalog,
        controller,
        store,
        planner,
        clock.wall,
        request_id_window_s=opts.request_id_window_s,
        trace_context=current_traceparent,
    )
    add_fleet_service(server, app, store, controller, limits)
    leadership = (
        Leadership(store, "", lease_s=opts.lease_s, renew_s=opts.renew_s)
        if isinstance(store, LeasedStore)
        else None
    )
    # Every fleet serves agents; on a shared store, the leader hears those other fleets hold
    # through the store (fleet_svc/nodelink/remote.py, fleet_svc/rpc/agent_relay.py).
    holder = leadership.holder if leadership is not None else ""
    relay = NodeRelay(store, clock, holder, controller.liveness, app.calls)
    if leadership is not None:
        controller.remote = RemoteNodes(
            store, holder, encode_desired, controller.liveness, offload=controller.calls.run
        )
    duties = Duties(
        controller,
        catalog,
        leadership,
        declared=declared,
        settings_path=opts.settings_path,
        follow_s=opts.follow_s,
        agents=relay,
    )
    gate.refusal = duties.refusal
    add_agent_service(
        server, relay, clock, node_certificates=authenticator.policy.node_certificates
    )
    port = bind(server, opts.listen, opts.tls, insecure=opts.insecure, service="fleet")
    if leadership is not None:
        leadership.address = opts.advertise or advertised(opts.listen, port)
    metrics_server = None
    store_health = StoreHealth(store, health_servicer, ("", FLEET_SERVICE, AGENT_SERVICE))
    if registry is not None:
        add_fleet_metrics(
            registry,
            controller,
            clock,
            lambda: LeaderStatus(duties.is_leader, duties.epoch),
            store_problem=lambda: store_health.problem,
            streams=lambda: relay.held,
        )
        metrics_server = await start_metrics_server(opts.metrics, registry)
    probe_server = await start_probe_server(opts.probes, health_servicer) if opts.probes else None
    await server.start()
    await duties.start()
    relay_task = asyncio.create_task(relay.run())
    await store_health.check()
    store_task = asyncio.create_task(store_health.run())
    log.info(
        "fleet_started",
        listen=opts.listen,
        port=port,
        store=store.where,
        tls="mutual" if opts.tls and opts.tls.mutual else "server" if opts.tls else "none",
        leader=duties.is_leader,
        epoch=duties.epoch,
    )
    return FleetServer(
        server,
        port,
        health_servicer,
        controller,
        catalog,
        store,
        duties,
        planner,
        store_health,
        store_task,
        metrics_server,
        probe_server,
        app,
        relay,
        relay_task,
    )


def advertised(listen: str, port: int) -> str:
    """Where callers reach a fleet listening on `listen` at `port`: its host, or this host's
    name for a wildcard host (0.0.0.0, [::])."""
    host = listen.rsplit(":", 1)[0]
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"


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
