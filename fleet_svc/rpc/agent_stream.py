"""The fleet side of an agent's Connect stream: Hello in, desired sets and heartbeats out.
The stream's edge: agent messages are converted here, and its refusals go through the fleet's
one error table (fleet_svc.rpc.status)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import Any, Protocol

import grpc
import structlog
from google.protobuf import timestamp_pb2

from fleet_svc.domain import errors
from fleet_svc.domain.access import ANONYMOUS, NODE
from fleet_svc.domain.gang import order_of
from fleet_svc.domain.nodes import Liveness, NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.replicas import ReplicaState, StartProgress
from fleet_svc.domain.reports import Observed
from fleet_svc.rpc.auth import current_caller
from fleet_svc.rpc.status import stream_refusals_as_status
from llmgw.agent.v1 import agent_pb2, agent_pb2_grpc
from llmgw.card import Card
from llmgw.clock import Clock
from llmgw.common.v1 import common_pb2
from llmgw.rejection import Rejection
from llmgw.text import cleaned, first_unsafe

log = structlog.get_logger(__name__)

HELLO_TIMEOUT_S = 10.0
"""How long a new stream may stay silent before its Hello."""

BEAT_SLOTS = 10
"""Instants in each heartbeat interval at which the fleet's heartbeats go out, the streams
taking them in turn: a slot's streams are woken by one pass of the event loop, where a timer
of each stream's own would wake it once a stream (with 1,000 idle agents that cut a fleet's
idle CPU per agent by a fifth to a third: bench/README.md, "the fleet's heartbeats in ten
slots")."""


def beat_delay(now_s: float, interval_s: float, slot: int) -> float:
    """How long from `now_s` (the loop's clock) until the next instant of `slot`
    (0..BEAT_SLOTS-1): those instants are `interval_s` apart, at `slot / BEAT_SLOTS` of the
    interval past each multiple of it; a stream that beats at each of them beats once an
    interval. Never 0: a beat just sent waits for the slot's next instant."""
    offset_s = interval_s * (slot % BEAT_SLOTS) / BEAT_SLOTS
    return interval_s - (now_s - offset_s) % interval_s


_PHASES: dict[int, ReplicaPhase] = {
    agent_pb2.PROCESS_PHASE_STARTING: ReplicaPhase.STARTING,
    agent_pb2.PROCESS_PHASE_HEALTHY: ReplicaPhase.READY,
    agent_pb2.PROCESS_PHASE_UNHEALTHY: ReplicaPhase.CRASHED,
    agent_pb2.PROCESS_PHASE_CRASHED: ReplicaPhase.CRASHED,
    agent_pb2.PROCESS_PHASE_STOPPING: ReplicaPhase.STOPPING,
    agent_pb2.PROCESS_PHASE_STOPPED: ReplicaPhase.STOPPED,
    agent_pb2.PROCESS_PHASE_FAILED: ReplicaPhase.FAILED,
}


def card_of(msg: common_pb2.Card) -> Card:
    """A card from the agent's message."""
    return Card(
        index=msg.index,
        uuid=cleaned(msg.uuid),
        model=cleaned(msg.model),
        memory_total_bytes=msg.memory_total_bytes,
        memory_used_bytes=msg.memory_used_bytes,
        cuda_memory_total_bytes=msg.cuda_memory_total_bytes,
    )


MAX_ENGINE_VERSIONS = 64
MAX_VERSION_CHARS = 64
"""What of a Hello's engine versions the fleet keeps: at most 64 engines, names and versions
of at most 64 characters (anything past that is not a version: it is dropped and logged)."""


def engine_versions_of(node: str, versions: Mapping[str, str]) -> dict[str, str]:
    """The engine versions a Hello reports, bounded (`MAX_ENGINE_VERSIONS`)."""
    kept: dict[str, str] = {}
    for name, version in sorted(versions.items()):
        ok = 0 < len(name) <= MAX_VERSION_CHARS and 0 < len(version) <= MAX_VERSION_CHARS
        if not ok or len(kept) >= MAX_ENGINE_VERSIONS:
            log.warning("engine_version_dropped", node=node, engine=name[:MAX_VERSION_CHARS])
            continue
        kept[cleaned(name)] = cleaned(version)
    return kept


_STAGES: dict[int, str] = {
    common_pb2.START_STAGE_DOWNLOADING: "DOWNLOADING",
    common_pb2.START_STAGE_LOADING: "LOADING",
}
MAX_PROGRESS_FILE_CHARS = 200
"""The longest file name of a progress report the fleet keeps (past it: cut)."""


def progress_of(msg: agent_pb2.ObservedReplica) -> StartProgress | None:
    """A replica's reported progress (None when there is none, or its stage is unknown);
    numbers below 0 read as 0 (not known), the file name is cleaned and bounded."""
    if not msg.HasField("progress"):
        return None
    p = msg.progress
    stage = _STAGES.get(p.stage)
    if stage is None:
        return None
    return StartProgress(
        stage=stage,
        done_bytes=max(p.done_bytes, 0),
        total_bytes=max(p.total_bytes, 0),
        rate_bytes_per_s=max(p.rate_bytes_per_s, 0),
        files_done=max(p.files_done, 0),
        files_total=max(p.files_total, 0),
        file=cleaned(p.file)[:MAX_PROGRESS_FILE_CHARS],
    )


def observed_of(msg: agent_pb2.ObservedReplica) -> Observed | None:
    """A replica report from the agent's message (None for an unknown phase)."""
    phase = _PHASES.get(msg.phase)
    if phase is None:
        return None
    return Observed(
        replica_id=msg.replica_id,
        revision=msg.revision,
        phase=phase,
        address=cleaned(msg.address),
        restarts=msg.restarts,
        message=cleaned(msg.message),
        log_tail=tuple(cleaned(line) for line in msg.log_tail),
        gpus=tuple(msg.gpus),
        gang_address=msg.gang_address,
        progress=progress_of(msg) if phase is ReplicaPhase.STARTING else None,
    )


def add_spec(specs: Any, r: ReplicaState, node: str = "") -> agent_pb2.ReplicaSpec:
    """Add to `specs` (a repeated ReplicaSpec field) what `node`'s agent is told of a
    replica: an engine by name, its args and cards; for a gang, that node's member: its rank,
    cards and peers. Built in place: a spec made apart and handed to its message's
    constructor is copied again (twice the time over a change's 1,000 sets)."""
    order = order_of(r, node) if r.gang else None
    member = r.member_on(node) if order is not None else None
    spec: agent_pb2.ReplicaSpec = specs.add(
        replica_id=r.id,
        revision=r.revision,
        model=r.model,
        profile=r.profile,
        engine=r.spec.engine,
        args=r.spec.args,
        gpus=member.gpus if member is not None else r.gpus,
        source=r.spec.source,
        traceparent=r.trace,
    )
    if order is not None:
        spec.gang.SetInParent()  # present even when every field of it is a default
        spec.gang.rank, spec.gang.nnodes = order.rank, order.nnodes
        spec.gang.peers.extend(order.peers)
    return spec


def desired_message(
    node: str, version: int, replicas: Sequence[ReplicaState], stop_traces: Mapping[str, str]
) -> agent_pb2.ConnectResponse:
    """A node's whole desired set (with the trace context of the stops it asks)."""
    message = agent_pb2.ConnectResponse()
    desired = message.desired
    desired.SetInParent()  # an empty set is still a set
    desired.version = version
    for r in replicas:
        add_spec(desired.replicas, r, node)
    desired.stop_traceparents.update(stop_traces)
    return message


class StreamLink:
    """The controller's handle on one stream: a queue the stream's writer drains."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.queue: asyncio.Queue[agent_pb2.ConnectResponse | None] = asyncio.Queue()
        self.closed_reason = ""

    def send_desired(
        self,
        version: int,
        replicas: Sequence[ReplicaState],
        stop_traces: Mapping[str, str],
    ) -> None:
        """Queue the node's whole desired set (and the trace context of the stops it asks)."""
        self.queue.put_nowait(desired_message(self.node, version, replicas, stop_traces))

    def close(self, reason: str) -> None:
        """End the stream; the first reason given is the one the agent is told."""
        if not self.closed_reason:
            self.closed_reason = reason
        self.queue.put_nowait(None)


class AgentSink(Protocol):
    """Where a stream's events go (fleet_svc.rpc.agent_relay.NodeRelay)."""

    liveness: Liveness

    def agent_connected(
        self, view: NodeView, observed: Iterable[Observed], link: StreamLink
    ) -> None:
        """A hello."""

    def agent_disconnected(self, node: str, link: StreamLink) -> None:
        """The stream ended."""

    def heartbeat(self, node: str, cards: Sequence[Card], memory_free_bytes: int) -> None:
        """A heartbeat."""

    def observe(self, node: str, o: Observed) -> None:
        """A replica report."""

    def acknowledged(self, node: str, version: int, rejected: Sequence[Rejection]) -> None:
        """An acknowledgement."""


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    """Serves Connect: one stream per node agent, on every fleet (leading or not)."""

    def __init__(self, sink: AgentSink, clock: Clock, *, node_certificates: bool) -> None:
        self._sink = sink
        self._clock = clock
        self._node_certificates = node_certificates
        self._slots = itertools.count()

    @stream_refusals_as_status
    async def Connect(
        self,
        request_iterator: AsyncIterator[agent_pb2.ConnectRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[agent_pb2.ConnectResponse]:
        """Hello, then desired sets and heartbeats out while reports come in."""
        try:
            first = await asyncio.wait_for(anext(request_iterator), HELLO_TIMEOUT_S)
        except (TimeoutError, StopAsyncIteration):
            raise errors.NoHello(
                "an agent's stream opens with Hello (node name, cards, replicas)"
            ) from None
        if first.WhichOneof("msg") != "hello" or not first.hello.node_name:
            raise errors.NoHello("an agent's stream opens with Hello naming its node")
        if first_unsafe(first.hello.node_name) >= 0:
            raise errors.NoHello(
                "the Hello's node name holds a control character: a node is named by 1-63 "
                "letters, digits, '.', '_' or '-'"
            )
        hello = first.hello
        node = hello.node_name
        self._check_node(node, context)
        link = StreamLink(node)
        liveness = self._sink.liveness
        view = NodeView(
            name=node,
            labels={cleaned(k): cleaned(v) for k, v in hello.labels.items()},
            cards=tuple(card_of(c) for c in hello.cards),
            engines=tuple(cleaned(e) for e in hello.engines),
            engine_versions=engine_versions_of(node, hello.engine_versions),
            memory_bytes=hello.memory_bytes,
            memory_free_bytes=hello.memory_free_bytes,
        )
        observed = [o for o in (observed_of(r) for r in hello.replicas) if o is not None]
        yield agent_pb2.ConnectResponse(
            welcome=agent_pb2.Welcome(
                heartbeat_interval_s=max(int(liveness.interval_s), 1),
                heartbeat_interval_ms=max(round(liveness.interval_s * 1000), 1),
                grace_heartbeats=liveness.grace_heartbeats,
            )
        )
        self._sink.agent_connected(view, observed, link)
        reader = asyncio.create_task(self._read(node, request_iterator, link))
        beater = asyncio.create_task(self._beat(link, liveness.interval_s))
        try:
            while True:
                msg = await link.queue.get()
                if msg is None:
                    break
                yield msg
        finally:
            reader.cancel()
            beater.cancel()
            for task in (reader, beater):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self._sink.agent_disconnected(node, link)
        if link.closed_reason and not context.done():
            # Ended by this fleet: a newer stream from the node replaced this one.
            raise errors.StreamReplaced(link.closed_reason, node=node)

    def _check_node(self, node: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """A Hello is for the node the stream's certificate names, and nobody else's.

        The auth interceptor let the stream in (a node certificate where one is required);
        here its name must be the Hello's. A stream with no certificate reaches this only
        where the fleet accepts anonymous agents (plaintext, no auth: dev mode).

        Raises:
            NodeIdentityMismatch: the certificate names another node, or none.
        """
        caller = current_caller()
        if caller is None or caller.kind == ANONYMOUS:
            if self._node_certificates:
                raise errors.NodeIdentityMismatch(
                    f"a Hello for node {node!r} needs that node's certificate",
                    node=node,
                    identity="anonymous",
                )
            return
        if caller.kind != NODE or caller.name != node:
            log.warning(
                "agent_hello_refused", node=node, identity=caller.identity, peer=context.peer()
            )
            raise errors.NodeIdentityMismatch(
                f"{caller.identity} may say Hello only as its own node, not as {node!r}",
                node=node,
                identity=caller.identity,
            )

    async def _read(
        self, node: str, requests: AsyncIterator[agent_pb2.ConnectRequest], link: StreamLink
    ) -> None:
        """Apply the agent's reports until its side of the stream ends."""
        c = self._sink
        try:
            async for msg in requests:
                kind = msg.WhichOneof("msg")
                if kind == "heartbeat":
                    hb = msg.heartbeat
                    c.heartbeat(node, [card_of(x) for x in hb.cards], hb.memory_free_bytes)
                elif kind == "update":
                    o = observed_of(msg.update.replica)
                    if o is not None:
                        c.observe(node, o)
                elif kind == "ack":
                    c.acknowledged(
                        node,
                        msg.ack.version,
                        [
                            Rejection(r.replica_id, r.revision, r.reason, r.message)
                            for r in msg.ack.rejected
                        ],
                    )
                elif kind == "hello":
                    log.warning("agent_hello_repeated", node=node)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        except grpc.aio.AbortError:
            # The intake refused a message that did not parse (llmgw/rpc/intake.py) and has
            # already ended the call with its status: the stream is over, not broken.
            log.info("agent_stream_refused", node=node)
        except Exception:
            log.exception("agent_stream_failed", node=node)
        link.close("")

    async def _beat(self, link: StreamLink, interval_s: float) -> None:
        """Send a heartbeat on the interval (meshes drop quiet streams), at the instants of the
        stream's slot (`beat_delay`): the first within one interval of the Hello."""
        loop = asyncio.get_running_loop()
        slot = next(self._slots) % BEAT_SLOTS
        due = loop.time() + beat_delay(loop.time(), interval_s, slot)
        for seq in itertools.count(1):
            await asyncio.sleep(due - loop.time())
            now = timestamp_pb2.Timestamp()
            now.FromNanoseconds(int(self._clock.wall() * 1e9))
            link.queue.put_nowait(
                agent_pb2.ConnectResponse(heartbeat=agent_pb2.Heartbeat(seq=seq, sent_at=now))
            )
            # The next instant of the slot, counted from the last one (a timer woken a hair
            # early must not beat twice); a loop an interval behind skips to the slot's next.
            due += interval_s
            if due <= loop.time():
                due = loop.time() + beat_delay(loop.time(), interval_s, slot)


SERVICE_NAME = agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name
"""The agents' stream service's full name, for health and reflection."""


def add_agent_service(
    server: grpc.aio.Server, sink: AgentSink, clock: Clock, *, node_certificates: bool
) -> None:
    """Serve the agents' Connect stream on `server` (`node_certificates`: every Hello needs
    its node's certificate)."""
    agent_pb2_grpc.add_AgentServiceServicer_to_server(
        AgentServicer(sink, clock, node_certificates=node_certificates), server
    )
