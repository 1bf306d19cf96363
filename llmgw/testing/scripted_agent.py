"""A scripted node agent: a real gRPC client of AgentService.Connect that acknowledges every
desired set and reports each replica as the test says (HEALTHY at once by default).

It runs no processes: it is for tests of the fleet's side of the stream, and for the fan-in
benchmark's simulated agents. The real agent (fleet_svc.agent) is tested against real
engines elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc

from llmgw.agent.v1 import agent_pb2, agent_pb2_grpc
from llmgw.common.v1 import common_pb2
from llmgw.tls import ClientTLS, aio_channel


def welcome_interval_s(welcome: agent_pb2.Welcome) -> float:
    """The heartbeat interval a Welcome asks for (its milliseconds when given)."""
    if welcome.heartbeat_interval_ms > 0:
        return welcome.heartbeat_interval_ms / 1000
    return float(welcome.heartbeat_interval_s)


@dataclass
class ScriptedAgent:
    """One node's agent, scripted."""

    address: str
    node: str
    gpu_class: str = "H100-80GB"
    gpus: int = 4
    memory_bytes: int = 256 * 10**9
    heartbeat_s: float | None = None
    """Heartbeat interval; None uses the fleet's Welcome, 0 sends none (a silent node)."""
    phase_for: Callable[[agent_pb2.ReplicaSpec], agent_pb2.ProcessPhase.ValueType] = lambda spec: (
        agent_pb2.PROCESS_PHASE_HEALTHY
    )
    reject: Callable[[agent_pb2.ReplicaSpec], str] = lambda spec: ""
    tls: ClientTLS | None = None
    """How it dials the fleet: plaintext when None."""
    running: dict[str, agent_pb2.ReplicaSpec] = field(default_factory=dict)
    desired: list[agent_pb2.Desired] = field(default_factory=list)
    acked: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    close_code: grpc.StatusCode | None = None
    error: Exception | None = None
    _out: asyncio.Queue[agent_pb2.ConnectRequest | None] = field(default_factory=asyncio.Queue)
    _task: asyncio.Task[None] | None = None

    def hello(self) -> agent_pb2.ConnectRequest:
        """The Hello this agent opens with: its cards and the replicas it runs."""
        cards = [
            common_pb2.Card(
                index=i,
                uuid=f"{self.node}-gpu{i}",
                model=self.gpu_class,
                memory_total_bytes=80 << 30,
            )
            for i in range(self.gpus)
        ]
        replicas = [
            agent_pb2.ObservedReplica(
                replica_id=s.replica_id,
                revision=s.revision,
                phase=self.phase_for(s),
                address=f"127.0.0.1:{9000 + i}",
                gpus=list(s.gpus),
                model=s.model,
            )
            for i, s in enumerate(self.running.values())
        ]
        return agent_pb2.ConnectRequest(
            hello=agent_pb2.Hello(
                node_name=self.node,
                cards=cards,
                replicas=replicas,
                engines=["vllm", "llamacpp", "standin"],
                memory_bytes=self.memory_bytes,
                memory_free_bytes=self.memory_bytes,
            )
        )

    async def _requests(self) -> AsyncIterator[agent_pb2.ConnectRequest]:
        yield self.hello()
        while True:
            msg = await self._out.get()
            if msg is None:
                return
            yield msg

    async def _beat(self, interval_s: float) -> None:
        for seq in itertools.count(1):
            await asyncio.sleep(interval_s)
            self._out.put_nowait(agent_pb2.ConnectRequest(heartbeat=agent_pb2.Heartbeat(seq=seq)))

    def _apply(self, desired: agent_pb2.Desired) -> None:
        self.desired.append(desired)
        rejected = []
        wanted = {}
        for spec in desired.replicas:
            why = self.reject(spec)
            if why:
                rejected.append(
                    agent_pb2.Rejection(
                        replica_id=spec.replica_id, revision=spec.revision, reason=why, message=why
                    )
                )
                continue
            wanted[spec.replica_id] = spec
        for rid, spec in list(self.running.items()):
            if rid not in wanted:
                del self.running[rid]
                self.report(spec, agent_pb2.PROCESS_PHASE_STOPPED)
        self._out.put_nowait(
            agent_pb2.ConnectRequest(ack=agent_pb2.Ack(version=desired.version, rejected=rejected))
        )
        for rid, spec in wanted.items():
            old = self.running.get(rid)
            if old is not None and old.revision == spec.revision:
                continue
            self.running[rid] = spec
            self.report(spec, self.phase_for(spec))
        self.acked.set()

    def report(
        self,
        spec: agent_pb2.ReplicaSpec,
        phase: agent_pb2.ProcessPhase.ValueType,
        message: str = "",
        address: str = "",
        progress: common_pb2.StartProgress | None = None,
    ) -> None:
        """Send a ReplicaUpdate for a replica (at `address`, or one of its own by default;
        with `progress`, a starting replica's download or load)."""
        index = (
            sorted(self.running).index(spec.replica_id) if spec.replica_id in self.running else 0
        )
        self._out.put_nowait(
            agent_pb2.ConnectRequest(
                update=agent_pb2.ReplicaUpdate(
                    replica=agent_pb2.ObservedReplica(
                        replica_id=spec.replica_id,
                        revision=spec.revision,
                        phase=phase,
                        address=address or f"127.0.0.1:{9000 + index}",
                        gpus=list(spec.gpus),
                        model=spec.model,
                        message=message,
                        # A gang member says where it listens for its gang, whatever its rank.
                        gang_address=(
                            f"127.0.0.1:{29500 + index}" if spec.HasField("gang") else ""
                        ),
                        progress=progress,
                    )
                )
            )
        )

    async def _run(self) -> None:
        channel = aio_channel(self.address, self.tls)
        beater: asyncio.Task[None] | None = None
        try:
            stream = agent_pb2_grpc.AgentServiceStub(channel).Connect(self._requests())
            async for msg in stream:
                kind = msg.WhichOneof("msg")
                if kind == "welcome" and self.heartbeat_s != 0:
                    interval = self.heartbeat_s or welcome_interval_s(msg.welcome)
                    beater = asyncio.create_task(self._beat(interval))
                elif kind == "desired":
                    self._apply(msg.desired)
        except grpc.aio.AioRpcError as err:
            self.close_code = err.code()
        except Exception as exc:
            self.error = exc  # kept for the test to see: a scripted agent must not fail
            raise
        finally:
            if beater is not None:
                beater.cancel()
            self.closed.set()
            await channel.close()

    def start(self) -> None:
        """Connect (again): a fresh stream opening with Hello and the running replicas."""
        self._out = asyncio.Queue()
        self.closed.clear()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Drop the stream (as a crashed agent would), keeping what it 'runs'."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
