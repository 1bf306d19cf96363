"""A scriptable fleet for agent tests: a real grpc.aio AgentService on 127.0.0.1:0.

It records what agents send (Hellos, Acks, replica updates, heartbeats) and lets a test push
desired sets and drop streams; the agent under test is a real one, in-process or its own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc

from llmgw.agent.v1 import agent_pb2, agent_pb2_grpc


@dataclass
class Stream:
    """One agent stream as the fleet sees it."""

    hello: agent_pb2.Hello
    outbox: asyncio.Queue[agent_pb2.ConnectResponse | grpc.StatusCode | None] = field(
        default_factory=asyncio.Queue
    )
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def send(self, response: agent_pb2.ConnectResponse) -> None:
        """Queue a message to the agent."""
        self.outbox.put_nowait(response)


@dataclass
class Received:
    """A message from an agent and when it arrived (monotonic seconds)."""

    at_s: float
    message: Any


class FakeFleet(agent_pb2_grpc.AgentServiceServicer):
    """An AgentService that welcomes every agent and does what the test says.

    Args:
        heartbeat_interval_s, grace_heartbeats: what the Welcome tells agents.
        send_heartbeats: whether it sends its own heartbeats on that interval (a test may
            turn them off on a live stream: a fleet gone silent).
        welcome: whether it answers Hello with Welcome at all.
    """

    def __init__(
        self,
        heartbeat_interval_s: int = 1,
        grace_heartbeats: int = 3,
        send_heartbeats: bool = True,
        welcome: bool = True,
    ) -> None:
        self.heartbeat_interval_s = heartbeat_interval_s
        self.grace_heartbeats = grace_heartbeats
        self.send_heartbeats = send_heartbeats
        self.welcome = welcome
        self.streams: list[Stream] = []
        self.hellos: list[agent_pb2.Hello] = []
        self.acks: list[agent_pb2.Ack] = []
        self.updates: list[agent_pb2.ObservedReplica] = []
        self.heartbeats: list[Received] = []
        self.version = 0

    # The test's side.

    @property
    def stream(self) -> Stream:
        """The latest stream (the one an agent is connected on)."""
        assert self.streams, "no agent connected"
        return self.streams[-1]

    def desire(self, *specs: agent_pb2.ReplicaSpec) -> int:
        """Send the latest stream a new desired set; its version."""
        self.version += 1
        desired = agent_pb2.Desired(version=self.version, replicas=list(specs))
        self.stream.send(agent_pb2.ConnectResponse(desired=desired))
        return self.version

    def drop(self, code: grpc.StatusCode | None = grpc.StatusCode.UNAVAILABLE) -> None:
        """End the latest stream: with that error status, or cleanly (None)."""
        self.stream.outbox.put_nowait(code)

    def ack(self, version: int) -> agent_pb2.Ack | None:
        """The agent's Ack of that version, if it came."""
        return next((a for a in self.acks if a.version == version), None)

    def updates_of(self, replica_id: str) -> list[agent_pb2.ObservedReplica]:
        """Every update about one replica, in order."""
        return [u for u in self.updates if u.replica_id == replica_id]

    def phases_of(self, replica_id: str) -> list[int]:
        """The phases one replica was reported in, in order."""
        return [u.phase for u in self.updates_of(replica_id)]

    def last(self, replica_id: str) -> agent_pb2.ObservedReplica | None:
        """The latest update about one replica."""
        found = self.updates_of(replica_id)
        return found[-1] if found else None

    # The servicer.

    async def Connect(
        self,
        request_iterator: AsyncIterator[agent_pb2.ConnectRequest],
        context: grpc.aio.ServicerContext[agent_pb2.ConnectRequest, agent_pb2.ConnectResponse],
    ) -> AsyncIterator[agent_pb2.ConnectResponse]:
        """Take a Hello, welcome, then relay the test's messages and record the agent's."""
        first = await request_iterator.__anext__()
        if first.WhichOneof("msg") != "hello":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "open with Hello")
        stream = Stream(hello=first.hello)
        self.hellos.append(first.hello)
        self.streams.append(stream)
        reader = asyncio.create_task(self._read(request_iterator))
        beats = asyncio.create_task(self._beat(stream))
        try:
            if self.welcome:
                yield agent_pb2.ConnectResponse(
                    welcome=agent_pb2.Welcome(
                        heartbeat_interval_s=self.heartbeat_interval_s,
                        grace_heartbeats=self.grace_heartbeats,
                    )
                )
            while True:
                item = await stream.outbox.get()
                if item is None:
                    return
                if isinstance(item, grpc.StatusCode):
                    await context.abort(item, "dropped by the test")
                yield item
        finally:
            stream.ended.set()
            for task in (reader, beats):
                if task is not None:
                    task.cancel()

    async def _read(self, requests: AsyncIterator[agent_pb2.ConnectRequest]) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for request in requests:
                now = time.monotonic()
                kind = request.WhichOneof("msg")
                if kind == "ack":
                    self.acks.append(request.ack)
                elif kind == "update":
                    self.updates.append(request.update.replica)
                elif kind == "heartbeat":
                    self.heartbeats.append(Received(now, request.heartbeat))

    async def _beat(self, stream: Stream) -> None:
        seq = 0
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            if not self.send_heartbeats:
                continue
            seq += 1
            stream.send(agent_pb2.ConnectResponse(heartbeat=agent_pb2.Heartbeat(seq=seq)))


@asynccontextmanager
async def running_fake_fleet(port: int = 0, **kwargs: Any) -> AsyncIterator[tuple[FakeFleet, int]]:
    """Serve a FakeFleet on a loopback port (0: a free one); yield it and the port."""
    fleet = FakeFleet(**kwargs)
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServiceServicer_to_server(fleet, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield fleet, port
    finally:
        await server.stop(grace=0)


def spec(
    replica_id: str,
    revision: int = 1,
    engine: str = "standin",
    args: Sequence[str] = ("--load-s", "0.2"),
    gpus: Iterable[int] = (0,),
    model: str = "tiny",
) -> agent_pb2.ReplicaSpec:
    """A desired replica as the fleet sends it."""
    return agent_pb2.ReplicaSpec(
        replica_id=replica_id,
        revision=revision,
        model=model,
        profile="default",
        engine=engine,
        args=list(args),
        gpus=list(gpus),
    )
