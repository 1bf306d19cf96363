"""Simulated node agents that find the leading fleet among several, for the failover and spread
benchmarks: real `AgentService.Connect` streams (Hello with its cards, heartbeats, an Ack for
every Desired, HEALTHY for every replica at once, STOPPED when one goes), reconnecting after a
stream ends to the leader NOT_LEADER names, else to the next fleet address in turn (the rules
of llmgw.clients.leader, which the real agent follows too).

They keep what they run across streams and say it in every Hello, as a real agent does, so a
new leader can tell a replica kept from one lost."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from llmgw.agent.v1 import agent_pb2, agent_pb2_grpc
from llmgw.clients.errors import Unreachable, decode
from llmgw.clients.leader import Fleets
from llmgw.common.v1 import common_pb2

CARD_BYTES = 81559 << 20
RECONNECT_S = 0.2
"""The wait before connecting again when no leader was named."""


@dataclass
class FollowingAgent:
    """One simulated node with `cards` H100 cards, connecting to whichever fleet leads."""

    node: str
    fleets: Fleets
    cards: int = 1
    heartbeat_s: float = 1.0
    running: dict[str, agent_pb2.ReplicaSpec] = field(default_factory=dict)
    joined: asyncio.Event = field(default_factory=asyncio.Event)
    """Set at each Welcome, cleared when the stream ends."""
    welcomed_at: float = 0.0
    """perf_counter of the last Welcome."""
    watch_model: str = ""
    changed_at: float = 0.0
    latency_s: float | None = None
    """From `changed_at` to this agent's Ack of a desired set holding `watch_model`."""
    streams: int = 0
    errors: list[str] = field(default_factory=list)
    """What a stream failed with that was not a gRPC status (a bug here, shown in the report)."""
    _channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)
    _out: asyncio.Queue[agent_pb2.ConnectRequest] = field(default_factory=asyncio.Queue)
    _task: asyncio.Task[None] | None = None

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(
                address, options=[("grpc.use_local_subchannel_pool", 1)]
            )
        return channel

    def hello(self) -> agent_pb2.ConnectRequest:
        """The node's whole state: its cards and what it runs."""
        return agent_pb2.ConnectRequest(
            hello=agent_pb2.Hello(
                node_name=self.node,
                cards=[
                    common_pb2.Card(
                        index=i,
                        uuid=f"{self.node}-gpu{i}",
                        model="H100-80GB",
                        memory_total_bytes=CARD_BYTES,
                    )
                    for i in range(self.cards)
                ],
                replicas=[
                    self._observed(s, agent_pb2.PROCESS_PHASE_HEALTHY).update.replica
                    for s in self.running.values()
                ],
                engines=["vllm"],
                memory_bytes=64 << 30,
                memory_free_bytes=64 << 30,
            )
        )

    def _observed(
        self, spec: agent_pb2.ReplicaSpec, phase: agent_pb2.ProcessPhase.ValueType
    ) -> agent_pb2.ConnectRequest:
        return agent_pb2.ConnectRequest(
            update=agent_pb2.ReplicaUpdate(
                replica=agent_pb2.ObservedReplica(
                    replica_id=spec.replica_id,
                    revision=spec.revision,
                    phase=phase,
                    address=f"127.0.0.1:{20000 + hash(spec.replica_id) % 20000}",
                    gpus=list(spec.gpus),
                    model=spec.model,
                )
            )
        )

    async def _write(
        self, call: grpc.aio.StreamStreamCall[agent_pb2.ConnectRequest, agent_pb2.ConnectResponse]
    ) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            while True:
                msg = await self._out.get()
                if call.done():
                    return
                await call.write(msg)

    async def _session(self) -> Unreachable | None:
        """One stream; the failure it ended with (None for a clean end)."""
        address = self.fleets.current
        self._out = asyncio.Queue()
        self._out.put_nowait(self.hello())
        call = agent_pb2_grpc.AgentServiceStub(self._channel(address)).Connect()
        self.streams += 1
        writer = asyncio.create_task(self._write(call))
        beater: asyncio.Task[None] | None = None
        try:
            while True:
                msg = await call.read()
                if not isinstance(msg, agent_pb2.ConnectResponse):
                    return None  # the fleet ended the stream
                kind = msg.WhichOneof("msg")
                if kind == "welcome":
                    self.welcomed_at = time.perf_counter()
                    self.joined.set()
                    if beater is None:
                        beater = asyncio.create_task(self._beat())
                elif kind == "desired":
                    self._apply(msg.desired)
        except grpc.aio.AioRpcError as err:
            failure = decode(err, "fleet", address)
            return failure if isinstance(failure, Unreachable) else None
        finally:
            self.joined.clear()
            for task in (writer, beater):
                if task is not None:
                    task.cancel()
            call.cancel()

    async def run(self) -> None:
        """Keep a stream to the leader open until cancelled."""
        while True:
            try:
                failure = await self._session()
            except Exception as exc:  # counted, and the agent carries on as a real one does
                self.errors.append(f"{type(exc).__name__}: {exc}")
                failure = Unreachable(address=self.fleets.current, detail=str(exc))
            named = failure is not None and self.fleets.after(failure)
            if failure is None:
                self.fleets.after(Unreachable(address=self.fleets.current, detail="ended"))
            if not named:
                await asyncio.sleep(RECONNECT_S)

    def _apply(self, desired: agent_pb2.Desired) -> None:
        wanted = {s.replica_id: s for s in desired.replicas}
        self._out.put_nowait(agent_pb2.ConnectRequest(ack=agent_pb2.Ack(version=desired.version)))
        if (
            self.latency_s is None
            and self.watch_model
            and any(s.model == self.watch_model for s in desired.replicas)
        ):
            self.latency_s = time.perf_counter() - self.changed_at
        for rid, spec in list(self.running.items()):
            if rid not in wanted:
                del self.running[rid]
                self._out.put_nowait(self._observed(spec, agent_pb2.PROCESS_PHASE_STOPPED))
        for rid, spec in wanted.items():
            if rid not in self.running:
                self.running[rid] = spec
                self._out.put_nowait(self._observed(spec, agent_pb2.PROCESS_PHASE_HEALTHY))

    async def _beat(self) -> None:
        await asyncio.sleep(self.heartbeat_s * (hash(self.node) % 1000) / 1000)
        for seq in itertools.count(1):
            self._out.put_nowait(agent_pb2.ConnectRequest(heartbeat=agent_pb2.Heartbeat(seq=seq)))
            await asyncio.sleep(self.heartbeat_s)

    def start(self) -> None:
        """Run in a task of the current loop."""
        self._task = asyncio.create_task(self.run())

    async def stop(self) -> None:
        """Drop the stream and close the channels."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for channel in self._channels.values():
            await channel.close()


def agents_over(
    addresses: Sequence[str], n: int, *, cards: int = 1, heartbeat_s: float = 1.0
) -> list[FollowingAgent]:
    """`n` agents given every address, agent i trying address i mod len first (spread)."""
    out = []
    for i in range(n):
        order = [*addresses[i % len(addresses) :], *addresses[: i % len(addresses)]]
        out.append(
            FollowingAgent(f"node-{i:04d}", Fleets(order), cards=cards, heartbeat_s=heartbeat_s)
        )
    return out
