"""The agent's stream to the fleet: Hello up, Welcome and desired sets down, for as long as it runs.

One `AgentClient.run()` keeps an `AgentService.Connect` stream open: it opens with Hello (the
node's full state), applies each Desired and answers it with an Ack, sends a ReplicaUpdate on
every change of a replica and a Heartbeat on the interval the Welcome gave. When the stream
drops it connects again after a backoff and says Hello again; replicas keep running meanwhile.

Given several fleet addresses (fleets sharing one store), it stays on the first that answers:
every fleet serves agents' streams (docs/fleet.md, "Agents on any fleet"). One that does not
answer is passed over for the next address (llmgw.clients.leader), the backoff held to
SEARCH_CAP_S; a fleet that refuses the stream with NOT_LEADER naming another (one that serves
agents only while it leads) sends the agent there at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import grpc
import structlog

from fleet_svc.agent import host
from fleet_svc.agent.backoff import Backoff
from fleet_svc.agent.replica import Observation
from fleet_svc.agent.replicas import ReplicaSet
from fleet_svc.agent.rpc.convert import (
    ack_to_proto,
    card_to_proto,
    observation_to_proto,
    spec_from_proto,
    timestamp,
)
from fleet_svc.agent.versions import reported_versions
from llmgw.agent.v1 import agent_pb2, agent_pb2_grpc
from llmgw.clients.errors import ClientError, Refused, Unreachable, translated_async
from llmgw.clients.leader import Fleets, fleet_addresses, not_leader
from llmgw.clock import Clock, SystemClock
from llmgw.tls import ClientTLS, aio_channel

log = structlog.get_logger("fleet_svc.agent.rpc.client")

AGENT_VERSION = "0.1.0"

# Keepalive for a stream that lives for days through meshes and NATs: ping every 30 s even
# between messages, give up on a connection whose ping is not answered in 10 s. The fleet's
# server must accept pings that often (its SERVER_OPTIONS allow one per 10 s).
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]

# Reconnecting: first retry after about half a second, doubling to at most 30 s.
RECONNECT_BACKOFF = Backoff(base_s=0.5, factor=2.0, cap_s=30.0, jitter=0.2)

SEARCH_CAP_S = 2.0
"""The longest wait between two attempts while several fleets are tried for the leader."""
ELECTION_POLL_S = 0.5
"""The wait before asking again when a fleet said it does not lead and named no leader."""

# Heartbeats every this many seconds until a Welcome says otherwise.
DEFAULT_HEARTBEAT_S = 10
DEFAULT_GRACE_HEARTBEATS = 3


@dataclass(frozen=True)
class NodeIdentity:
    """Who the agent is to the fleet."""

    name: str
    labels: Mapping[str, str]


class AgentClient:
    """The node agent's side of `AgentService.Connect`.

    Args:
        fleet: the fleet's HOST:PORT, or several separated by commas (or a name resolving to
            several addresses): the agent connects to the one that leads.
        node: the node's name and labels.
        replicas: the replica set Desired messages are applied to.
        tls: the CA to check the fleet against and the node's certificate (mTLS: the
            certificate's `spiffe://llmgw/node/NAME` is who the fleet lets this stream be);
            None for a plaintext channel. Its files are read at each connection, so a
            renewed node certificate is used from the next reconnection on.
        backoff: how long to wait between connection attempts.
    """

    def __init__(
        self,
        fleet: str,
        node: NodeIdentity,
        replicas: ReplicaSet,
        backoff: Backoff = RECONNECT_BACKOFF,
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
        options: Sequence[tuple[str, int]] = tuple(CHANNEL_OPTIONS),
        *,
        tls: ClientTLS | None = None,
    ) -> None:
        self._fleets = Fleets(fleet_addresses(fleet))
        self.node = node
        self.replicas = replicas
        self._tls = tls
        self._backoff = backoff
        self._clock = clock or SystemClock()
        self._rand = rand
        self._options = list(options)
        self.applied_version = 0
        self.heartbeat_interval_s = float(DEFAULT_HEARTBEAT_S)
        self.grace_heartbeats = DEFAULT_GRACE_HEARTBEATS
        self.sessions = 0
        self.connected = asyncio.Event()
        self._outbox: asyncio.Queue[agent_pb2.ConnectRequest] | None = None
        self._seq = 0
        self._welcomed_last = False
        self._log = log.bind(node=node.name, fleet=fleet)
        replicas.listener = self._replica_changed

    @property
    def fleet(self) -> str:
        """The fleet address the agent connects to now (the leader, once found)."""
        return self._fleets.current

    def hello(self) -> agent_pb2.Hello:
        """The node's full state, as sent at the start of every stream."""
        return agent_pb2.Hello(
            node_name=self.node.name,
            labels=dict(self.node.labels),
            cards=[card_to_proto(c) for c in self.replicas.cards.read()],
            replicas=[observation_to_proto(o) for o in self.replicas.observed()],
            engines=sorted(self.replicas.config.engines),
            memory_bytes=host.memory_bytes(),
            memory_free_bytes=host.memory_free_bytes(),
            agent_version=AGENT_VERSION,
            applied_version=self.applied_version,
            engine_versions=reported_versions(self.replicas.config),
        )

    def heartbeat(self) -> agent_pb2.Heartbeat:
        """A heartbeat carrying the cards' memory use now."""
        self._seq += 1
        return agent_pb2.Heartbeat(
            seq=self._seq,
            sent_at=timestamp(self._clock.wall()),
            cards=[card_to_proto(c) for c in self.replicas.cards.read()],
            memory_free_bytes=host.memory_free_bytes(),
        )

    def _replica_changed(self, obs: Observation) -> None:
        # Between streams changes are not queued: the next Hello carries the state they led to.
        if self._outbox is not None:
            update = agent_pb2.ReplicaUpdate(replica=observation_to_proto(obs))
            self._outbox.put_nowait(agent_pb2.ConnectRequest(update=update))

    async def run(self) -> None:
        """Keep a stream to the fleet open until cancelled, reconnecting with backoff."""
        structlog.contextvars.bind_contextvars(node=self.node.name)
        attempt = 0
        while True:
            failure: ClientError | None = None
            try:
                async with translated_async("fleet", self.fleet):
                    await self._session()
                self._log.info("stream_ended", welcomed=self._welcomed_last)
            except Unreachable as exc:
                failure = exc
                self._log.info(
                    "stream_lost",
                    code=exc.code,
                    detail=exc.detail,
                    reason=exc.reason,
                    fleet=self.fleet,
                    welcomed=self._welcomed_last,
                )
            except Refused as exc:
                # The fleet ended the stream with a status (a Hello it cannot read, a
                # session replaced by a newer one): its code and message say which.
                self._log.info(
                    "stream_lost",
                    code=exc.code,
                    detail=exc.message,
                    reason=exc.reason,
                    welcomed=self._welcomed_last,
                )
            except TimeoutError:
                self._log.warning(
                    "stream_silent",
                    limit_s=self.heartbeat_interval_s * (self.grace_heartbeats + 1),
                )
            except Exception:  # the loop outlives any one stream's surprise
                self._log.exception("stream_failed")
            finally:
                self.connected.clear()
            if self._welcomed_last:
                attempt = 0
            delay_s = self._next_delay_s(failure, attempt)
            attempt += 1
            self._log.info(
                "reconnect_scheduled", delay_s=round(delay_s, 3), attempt=attempt, fleet=self.fleet
            )
            await self._clock.sleep(delay_s)

    def _next_delay_s(self, failure: ClientError | None, attempt: int) -> float:
        """How long to wait before the next connection, moving on to another fleet when this
        one does not lead or did not answer (and there is another to try)."""
        backoff_s = self._backoff.delay_s(attempt, self._rand())
        searching = failure is not None and (not_leader(failure) or len(self._fleets.addresses) > 1)
        if failure is None or not searching:
            return backoff_s
        if self._fleets.after(failure):
            return 0.0  # told where the leader is: go there now
        if not_leader(failure):
            return ELECTION_POLL_S
        return min(backoff_s, SEARCH_CAP_S)

    def _channel(self) -> grpc.aio.Channel:
        return aio_channel(self.fleet, self._tls, self._options)

    async def _session(self) -> None:
        """One stream, from Hello to its end (`_welcomed_last` says whether the fleet
        welcomed it)."""
        self._welcomed_last = False
        self.sessions += 1
        async with self._channel() as channel:
            stub = agent_pb2_grpc.AgentServiceStub(channel)
            call = stub.Connect()
            outbox: asyncio.Queue[agent_pb2.ConnectRequest] = asyncio.Queue()
            # The snapshot and the queue begin together (no await between), so every change
            # after the Hello's snapshot is sent after it, and none before it is sent twice.
            outbox.put_nowait(agent_pb2.ConnectRequest(hello=self.hello()))
            self._outbox = outbox
            inbox: asyncio.Queue[agent_pb2.ConnectResponse | BaseException | None] = asyncio.Queue()
            # Reading and writing each in a task that feeds one inbox: the session then waits
            # on a plain queue (waiting on a gRPC read alongside other futures with
            # asyncio.wait was seen to miss the read's completion).
            reader = asyncio.create_task(self._read(call, inbox))
            writer = asyncio.create_task(self._write(call, outbox, inbox))
            beats: asyncio.Task[None] | None = None
            fleet_beats = False
            try:
                while True:
                    # A fleet that sends heartbeats and then falls silent is gone even if
                    # TCP has not noticed; one that never sent any is not held to it.
                    limit_s = (
                        self.heartbeat_interval_s * (self.grace_heartbeats + 1)
                        if fleet_beats
                        else None
                    )
                    item = await asyncio.wait_for(inbox.get(), limit_s)
                    if item is None:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    kind = item.WhichOneof("msg")
                    if kind == "welcome":
                        self._welcome(item.welcome)
                        if beats is not None:
                            beats.cancel()
                        beats = asyncio.create_task(self._beat(outbox))
                    elif kind == "desired":
                        self._apply(item.desired, outbox)
                    elif kind == "heartbeat":
                        fleet_beats = True
            finally:
                self._outbox = None
                for task in (reader, writer, beats):
                    if task is not None:
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await task
                call.cancel()

    def _welcome(self, welcome: agent_pb2.Welcome) -> None:
        if welcome.heartbeat_interval_ms > 0:
            self.heartbeat_interval_s = welcome.heartbeat_interval_ms / 1000
        elif welcome.heartbeat_interval_s > 0:
            self.heartbeat_interval_s = float(welcome.heartbeat_interval_s)
        if welcome.grace_heartbeats > 0:
            self.grace_heartbeats = welcome.grace_heartbeats
        self._welcomed_last = True
        self.connected.set()
        self._log.info(
            "stream_welcomed",
            heartbeat_interval_s=self.heartbeat_interval_s,
            grace_heartbeats=self.grace_heartbeats,
            replicas=len(self.replicas.observed()),
        )

    def _apply(
        self, desired: agent_pb2.Desired, outbox: asyncio.Queue[agent_pb2.ConnectRequest]
    ) -> None:
        # Level-triggered: every Desired is the node's whole set and is applied, even one of a
        # lower version than the last (a fleet restored from an older state is still the fleet).
        specs = [spec_from_proto(r) for r in desired.replicas]
        rejected = self.replicas.apply(specs, dict(desired.stop_traceparents))
        self.applied_version = desired.version
        outbox.put_nowait(agent_pb2.ConnectRequest(ack=ack_to_proto(desired.version, rejected)))
        self._log.info(
            "desired_applied",
            version=desired.version,
            replicas=len(specs),
            rejected=len(rejected),
        )

    async def _read(
        self,
        call: grpc.aio.StreamStreamCall[agent_pb2.ConnectRequest, agent_pb2.ConnectResponse],
        inbox: asyncio.Queue[agent_pb2.ConnectResponse | BaseException | None],
    ) -> None:
        try:
            while True:
                msg = await call.read()
                if msg is grpc.aio.EOF:
                    inbox.put_nowait(None)
                    return
                assert isinstance(msg, agent_pb2.ConnectResponse)
                inbox.put_nowait(msg)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            inbox.put_nowait(exc)

    async def _write(
        self,
        call: grpc.aio.StreamStreamCall[agent_pb2.ConnectRequest, agent_pb2.ConnectResponse],
        outbox: asyncio.Queue[agent_pb2.ConnectRequest],
        inbox: asyncio.Queue[agent_pb2.ConnectResponse | BaseException | None],
    ) -> None:
        try:
            while True:
                request = await outbox.get()
                await call.write(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            inbox.put_nowait(exc)

    async def _beat(self, outbox: asyncio.Queue[agent_pb2.ConnectRequest]) -> None:
        while True:
            await self._clock.sleep(self.heartbeat_interval_s)
            outbox.put_nowait(agent_pb2.ConnectRequest(heartbeat=self.heartbeat()))
