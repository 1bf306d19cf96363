"""Bench: agent fan-in: N simulated agents on one fleet, its CPU and memory per agent, and the
time from a catalog change to every agent's acknowledgement.

The fleet runs as a child process (`python -m fleet_svc --listen 127.0.0.1:0 ...`) so its CPU
time (user + system, /proc/PID/stat; psutil is not installed) and resident memory (VmRSS,
/proc/PID/status) are its own. The agents are lean simulated agents, by default in this
process: real `AgentService.Connect` streams (Hello with one card, heartbeats on the Welcome's
interval, an Ack for every Desired, HEALTHY for every replica at once, STOPPED when one goes),
spread over several channels of at most STREAMS_PER_CHANNEL streams, each channel its own
connection (an HTTP/2 peer caps concurrent streams per connection, commonly at 100).

For each N, on a fresh fleet:
- idle: the fleet's CPU over a window with no agents, and its RSS (the baseline);
- connected: all N agents joined and beating; CPU over the same window, RSS; per agent:
  (RSS_N - RSS_0) / N and (CPU_N - CPU_0) / N;
- change: CreateModel of a model with N one-card replicas (one lands on every node, each node
  having one card); per-agent latency from the call to that agent's Ack of the desired set
  holding its replica (p50/p99), and to all N replicas routable (a WatchReplicas stream);
  the fleet's CPU and the agents' from the call to the last Ack.
  The model is deleted and the next round creates it again.

With `--swarm go` the same agents are run by a Go program (bench/swarm, built with the
machine's go once per run) in a process of its own, so the bench's Python does not share the
agents' work: the swarm stamps each Ack with CLOCK_MONOTONIC, the clock of time.perf_counter
on Linux, and the agents' CPU is the swarm process's (/proc/PID/stat). The `bench` column is
this process's CPU in both cases (with `--swarm python` it holds the agents').

Ratios compare each N with the smallest N of the same run (the baseline).

With `--tls`, each N runs twice on fresh fleets, plaintext then mutual TLS (certificates from a
local CA made for the run: one node certificate per agent, the fleet requiring them), every
agent on a connection of its own in both (a node's identity is its connection's certificate),
and the mTLS ÷ plaintext ratios of CPU per agent and ack p99 are printed.

Run: `.venv/bin/python -m bench.agent_fanin [--full] [--sizes 10,100,...] [--tls]
[--swarm python|go]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc

from bench.go_swarm import GoSwarm, build_swarm
from bench.planner_throughput import ChildServer, start_child
from llmgw import certs
from llmgw.agent.v1 import agent_pb2, agent_pb2_grpc
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.scripted_agent import welcome_interval_s
from llmgw.tls import ClientTLS, aio_channel

STREAMS_PER_CHANNEL = 50
"""Agents per channel (one TCP connection each); below the usual 100-stream cap."""
WAIT_S = 120.0
"""Bound on any wait for the fleet or the agents (a run that hangs fails instead)."""
CARD_BYTES = 81559 << 20
PROFILE_REPLICAS = 200
"""Replicas per profile of the fan-out model (fleet_svc.catalog caps a profile at 256)."""
KINDS = fleet_pb2.WatchReplicasResponse
SWARMS = ("python", "go")
"""Who runs the agents: this process, or the Go swarm (bench/swarm), a process of its own."""


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0..100) of `values`, linearly interpolated between ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Pki:
    """A run's certificates: the fleet's pair and CA, the admin's, one per node."""

    local: certs.LocalTLS

    def server_flags(self) -> list[str]:
        """The fleet's --tls-* flags (client certificates required)."""
        cert, key = self.local.servers["fleet"]
        return ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(self.local.ca_cert)]

    def client(self, name: str) -> ClientTLS:
        """A user's pair."""
        cert, key = self.local.clients[name]
        return ClientTLS(ca=self.local.ca_cert, cert=cert, key=key)

    def node(self, name: str) -> ClientTLS:
        """A node's pair."""
        cert, key = self.local.nodes[name]
        return ClientTLS(ca=self.local.ca_cert, cert=cert, key=key)

    def go_swarm_files(self) -> tuple[Path, Path]:
        """The CA and the folder of the node pairs, as the Go swarm reads them (it names a
        node's files node-NAME.crt and node-NAME.key in that folder, as certs.py writes them).

        Raises:
            RuntimeError: a node's pair is named otherwise.
        """
        folder = self.local.ca_cert.parent
        for name, (cert, key) in self.local.nodes.items():
            if (cert, key) != (folder / f"node-{name}.crt", folder / f"node-{name}.key"):
                raise RuntimeError(f"node {name}'s pair is not where the Go swarm looks: {cert}")
        return self.local.ca_cert, folder


def node_name(i: int) -> str:
    """The i-th simulated node's name."""
    return f"node-{i:04d}"


def make_pki(folder: Path, agents: int) -> Pki:
    """A local CA with the fleet's pair, `admin`, and a node pair for each agent."""
    return Pki(
        certs.make_local_tls(
            folder,
            servers=("fleet",),
            nodes=[node_name(i) for i in range(agents)],
            clients=("admin",),
        )
    )


async def start_fleet_child(
    folder: Path,
    *,
    heartbeat_s: float = 2.0,
    drain_s: float = 0.1,
    planner: str = "127.0.0.1:1",
    start_timeout_s: float = 60.0,
    tls_flags: Sequence[str] = (),
) -> ChildServer:
    """`python -m fleet_svc` on 127.0.0.1:0 with its SQLite store and log in `folder`
    (`tls_flags`: its --tls-* flags; none: plaintext)."""
    folder.mkdir(parents=True, exist_ok=True)
    return await start_child(
        "fleet_svc",
        [
            "--listen",
            "127.0.0.1:0",
            "--store",
            str(folder / "fleet.db"),
            "--heartbeat-s",
            str(heartbeat_s),
            "--drain-s",
            str(drain_s),
            "--planner",
            planner,
            "--start-timeout-s",
            str(start_timeout_s),
            "--log-format",
            "json",
            *tls_flags,
        ],
        folder / "fleet.log",
    )


def agent_channels(
    address: str, agents: int, *, pki: Pki | None = None, own_connection: bool = False
) -> list[grpc.aio.Channel]:
    """Enough channels for `agents` streams, each with its own connection: one per
    STREAMS_PER_CHANNEL agents, or one per agent (`own_connection`, and always with `pki`:
    agent i presents node i's certificate)."""
    # A local subchannel pool: channels to one target would otherwise share one connection.
    options = [("grpc.use_local_subchannel_pool", 1)]
    if pki is not None:
        return [aio_channel(address, pki.node(node_name(i)), options) for i in range(agents)]
    count = agents if own_connection else math.ceil(agents / STREAMS_PER_CHANNEL)
    return [grpc.aio.insecure_channel(address, options=options) for _ in range(max(1, count))]


@dataclass
class LeanAgent:
    """One simulated node agent on a shared channel: one card, everything HEALTHY at once."""

    node: str
    stub: agent_pb2_grpc.AgentServiceAsyncStub
    watch_model: str = ""
    """Record when a desired set first holds a replica of this model."""
    changed_at: float = 0.0
    """When the catalog change was made (perf_counter), for `latency_s`."""
    latency_s: float | None = None
    """From `changed_at` to this agent's Ack of the desired set holding its replica."""
    running: dict[str, agent_pb2.ReplicaSpec] = field(default_factory=dict)
    joined: asyncio.Event = field(default_factory=asyncio.Event)
    _call: grpc.aio.StreamStreamCall[agent_pb2.ConnectRequest, agent_pb2.ConnectResponse] | None = (
        None
    )
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def _send(self, msg: agent_pb2.ConnectRequest) -> None:
        assert self._call is not None
        async with self._lock:  # one write in flight per stream
            if not self._call.done():  # a stream the fleet ended takes no more
                await self._call.write(msg)

    def _observed(
        self, spec: agent_pb2.ReplicaSpec, phase: agent_pb2.ProcessPhase.ValueType
    ) -> agent_pb2.ConnectRequest:
        return agent_pb2.ConnectRequest(
            update=agent_pb2.ReplicaUpdate(
                replica=agent_pb2.ObservedReplica(
                    replica_id=spec.replica_id,
                    revision=spec.revision,
                    phase=phase,
                    address=f"127.0.0.1:{20000 + hash(self.node) % 20000}",
                    gpus=list(spec.gpus),
                    model=spec.model,
                )
            )
        )

    async def run(self) -> None:
        """Hello, then answer until the stream ends; heartbeats on the Welcome's interval."""
        call = self._call = self.stub.Connect()
        card = common_pb2.Card(
            index=0, uuid=f"{self.node}-gpu0", model="H100-80GB", memory_total_bytes=CARD_BYTES
        )
        await self._send(
            agent_pb2.ConnectRequest(
                hello=agent_pb2.Hello(
                    node_name=self.node,
                    cards=[card],
                    engines=["vllm"],
                    memory_bytes=64 << 30,
                    memory_free_bytes=64 << 30,
                )
            )
        )
        beater: asyncio.Task[None] | None = None
        try:
            while True:
                msg = await call.read()
                if not isinstance(msg, agent_pb2.ConnectResponse):
                    return  # grpc.aio.EOF: the fleet ended the stream
                kind = msg.WhichOneof("msg")
                if kind == "welcome" and beater is None:
                    beater = asyncio.create_task(self._beat(welcome_interval_s(msg.welcome)))
                elif kind == "desired":
                    await self._apply(msg.desired)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            if beater is not None:
                beater.cancel()

    async def _apply(self, desired: agent_pb2.Desired) -> None:
        wanted = {s.replica_id: s for s in desired.replicas}
        await self._send(agent_pb2.ConnectRequest(ack=agent_pb2.Ack(version=desired.version)))
        self.joined.set()
        if (
            self.latency_s is None
            and self.watch_model
            and any(s.model == self.watch_model for s in desired.replicas)
        ):
            self.latency_s = time.perf_counter() - self.changed_at
        for rid, spec in list(self.running.items()):
            if rid not in wanted:
                del self.running[rid]
                await self._send(self._observed(spec, agent_pb2.PROCESS_PHASE_STOPPED))
        for rid, spec in wanted.items():
            if rid not in self.running:
                self.running[rid] = spec
                await self._send(self._observed(spec, agent_pb2.PROCESS_PHASE_HEALTHY))

    async def _beat(self, interval_s: float) -> None:
        # Start at a random point of the interval so N agents do not beat in step.
        await asyncio.sleep(interval_s * (hash(self.node) % 1000) / 1000)
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            for seq in itertools.count(1):
                await self._send(agent_pb2.ConnectRequest(heartbeat=agent_pb2.Heartbeat(seq=seq)))
                await asyncio.sleep(interval_s)

    def cancel(self) -> None:
        """Drop the stream."""
        if self._call is not None:
            self._call.cancel()


class Swarm(Protocol):
    """N agents on one fleet, however they are run: what a change round asks of them."""

    async def joined(self, timeout_s: float) -> None:
        """Wait until every agent has acknowledged a desired set."""

    def start_round(self, model: str, start_s: float) -> None:
        """Time each agent's first Ack of a set holding a replica of `model` from `start_s`
        (perf_counter)."""

    def all_acked(self) -> bool:
        """Every agent acknowledged such a set since the round started."""

    def round_latencies_s(self) -> list[float]:
        """The round's latencies so far, one per agent that acked."""

    def end_round(self) -> None:
        """Stop timing."""

    def any_running(self) -> bool:
        """Some agent still runs a replica."""

    def cpu_s(self) -> float:
        """The CPU the agents have used so far (user + system)."""

    async def close(self) -> None:
        """End every stream."""


@dataclass
class PySwarm:
    """`LeanAgent`s in this process, on this event loop: their CPU is this process's (the
    bench's own work with it)."""

    agents: list[LeanAgent]
    channels: list[grpc.aio.Channel]
    tasks: list[asyncio.Task[None]]

    @classmethod
    def start(
        cls, address: str, n: int, *, pki: Pki | None = None, own_connection: bool = False
    ) -> PySwarm:
        """`n` agents on channels to `address` (see `agent_channels`), their streams opened."""
        channels = agent_channels(address, n, pki=pki, own_connection=own_connection)
        agents = [
            LeanAgent(node_name(i), agent_pb2_grpc.AgentServiceStub(channels[i % len(channels)]))
            for i in range(n)
        ]
        return cls(agents, channels, [asyncio.create_task(a.run()) for a in agents])

    async def joined(self, timeout_s: float) -> None:
        """Wait until every agent has acknowledged a desired set."""
        await asyncio.wait_for(asyncio.gather(*(a.joined.wait() for a in self.agents)), timeout_s)

    def start_round(self, model: str, start_s: float) -> None:
        """Time each agent's first Ack of a set holding a replica of `model` from `start_s`."""
        for a in self.agents:
            a.latency_s, a.changed_at, a.watch_model = None, start_s, model

    def all_acked(self) -> bool:
        """Every agent acknowledged such a set since the round started."""
        return all(a.latency_s is not None for a in self.agents)

    def round_latencies_s(self) -> list[float]:
        """The round's latencies so far."""
        return [a.latency_s for a in self.agents if a.latency_s is not None]

    def end_round(self) -> None:
        """Stop timing."""
        for a in self.agents:
            a.watch_model = ""

    def any_running(self) -> bool:
        """Some agent still runs a replica."""
        return any(a.running for a in self.agents)

    def cpu_s(self) -> float:
        """This process's CPU so far (the agents, their gRPC threads and the bench)."""
        return time.process_time()

    async def close(self) -> None:
        """Cancel every stream and close the channels."""
        for a in self.agents:
            a.cancel()
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for ch in self.channels:
            await ch.close()


def fan_model(replicas: int) -> common_pb2.Model:
    """A model of `replicas` one-card vLLM replicas (one per one-card node), split over
    profiles of at most PROFILE_REPLICAS (the catalog caps replicas per profile)."""
    counts = [PROFILE_REPLICAS] * (replicas // PROFILE_REPLICAS)
    if replicas % PROFILE_REPLICAS:
        counts.append(replicas % PROFILE_REPLICAS)
    return common_pb2.Model(
        name="fan",
        source="hf://org/fan",
        context_length=8192,
        profiles=[
            common_pb2.Profile(
                name=f"gpu-{i}",
                engine="vllm",
                args=["--max-model-len", "8192"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
                replicas=count,
            )
            for i, count in enumerate(counts)
        ],
    )


async def wait_for(
    check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = WAIT_S
) -> None:
    """Poll an async predicate every 50 ms until it holds.

    Raises:
        RuntimeError: it did not hold within `timeout_s`.
    """
    deadline = time.perf_counter() + timeout_s
    while not await check():
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{what} did not happen within {timeout_s:.0f} s")
        await asyncio.sleep(0.05)


async def cpu_over(fleet: ChildServer, window_s: float) -> float:
    """The fleet's CPU use over `window_s` as a fraction of one core."""
    before, start = fleet.cpu_s(), time.perf_counter()
    await asyncio.sleep(window_s)
    return (fleet.cpu_s() - before) / (time.perf_counter() - start)


@dataclass
class Round:
    """One change round's figures."""

    latencies_s: list[float]
    """Per agent, from the CreateModel call to its Ack of the set holding its replica."""
    ready_s: float
    """From the call to all N endpoints routable."""
    fleet_cpu_s: float
    """The fleet's CPU from the call until every Ack was seen (to the 50 ms poll after the
    last)."""
    agents_cpu_s: float
    """The agents' CPU over the same span: this process's (the simulated agents, their gRPC
    threads, the bench) with the Python swarm, the Go swarm process's with the Go one. On two
    cores the agents compete with the fleet for it."""
    bench_cpu_s: float
    """This process's CPU over the same span (with the Python swarm, the agents' too)."""
    span_s: float
    """That span's wall time."""


async def change_round(
    stub: fleet_pb2_grpc.FleetServiceAsyncStub, agents: Swarm, n: int, fleet: ChildServer
) -> Round:
    """Create the model, wait for every agent's Ack and every endpoint; delete it again."""
    routable: set[str] = set()
    all_routable = asyncio.Event()
    synced = asyncio.Event()

    async def watch() -> None:
        # Every model's stream: the model does not exist yet (watching it would be NOT_FOUND).
        async for ev in stub.WatchReplicas(fleet_pb2.WatchReplicasRequest()):
            if ev.kind == KINDS.KIND_SYNCED:
                synced.set()
            elif ev.kind == KINDS.KIND_ADDED and ev.endpoint.model == "fan":
                routable.add(ev.endpoint.replica_id)
                if len(routable) >= n:
                    all_routable.set()

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.wait_for(synced.wait(), WAIT_S)
        start = time.perf_counter()
        fleet_cpu, agents_cpu, bench_cpu = fleet.cpu_s(), agents.cpu_s(), time.process_time()
        agents.start_round("fan", start)
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=fan_model(n)))

        async def all_acked() -> bool:
            return agents.all_acked()

        await wait_for(all_acked, f"all {n} agents acknowledging the change")
        span_s = time.perf_counter() - start
        fleet_cpu, agents_cpu = fleet.cpu_s() - fleet_cpu, agents.cpu_s() - agents_cpu
        bench_cpu = time.process_time() - bench_cpu
        await asyncio.wait_for(all_routable.wait(), WAIT_S)
        ready_s = time.perf_counter() - start
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await watcher
    latencies = agents.round_latencies_s()
    agents.end_round()
    await stub.DeleteModel(fleet_pb2.DeleteModelRequest(name="fan"))

    async def all_gone() -> bool:
        listed = await stub.ListReplicas(fleet_pb2.ListReplicasRequest())
        return not listed.replicas and not agents.any_running()

    await wait_for(all_gone, "the model's replicas gone after its deletion")
    return Round(latencies, ready_s, fleet_cpu, agents_cpu, bench_cpu, span_s)


async def measure_n(
    n: int,
    folder: Path,
    *,
    window_s: float,
    rounds: int,
    heartbeat_s: float,
    pki: Pki | None = None,
    own_connection: bool = False,
    go_swarm: Path | None = None,
) -> dict[str, float]:
    """One fresh fleet with `n` agents: its idle and connected CPU and RSS, and the change
    rounds' latencies (over mutual TLS with `pki`; the agents run by the Go swarm binary
    `go_swarm`, else in this process)."""
    fleet = await start_fleet_child(
        folder, heartbeat_s=heartbeat_s, tls_flags=pki.server_flags() if pki else ()
    )
    admin = aio_channel(fleet.address, pki.client("admin") if pki else None)
    stub = fleet_pb2_grpc.FleetServiceStub(admin)
    agents: Swarm | None = None
    try:
        await asyncio.sleep(1.0)  # the fleet's first ticks and lazy imports
        cpu_idle = await cpu_over(fleet, window_s)
        rss_idle = fleet.rss_bytes()
        start = time.perf_counter()
        if go_swarm is None:
            agents = PySwarm.start(fleet.address, n, pki=pki, own_connection=own_connection)
        else:
            agents = await GoSwarm.start(
                go_swarm,
                fleet.address,
                n,
                folder / "swarm.log",
                per_connection=1 if own_connection else STREAMS_PER_CHANNEL,
                model="fan",
                tls=pki.go_swarm_files() if pki else None,
            )
        await agents.joined(WAIT_S)
        join_s = time.perf_counter() - start
        await asyncio.sleep(heartbeat_s)  # every agent has beaten at least once
        cpu_n = await cpu_over(fleet, window_s)
        rss_n = fleet.rss_bytes()
        nodes = await stub.ListNodes(fleet_pb2.ListNodesRequest())
        ready_nodes = sum(1 for x in nodes.nodes if x.phase == fleet_pb2.NODE_PHASE_READY)
        done = [await change_round(stub, agents, n, fleet) for _ in range(rounds)]
    finally:
        if agents is not None:
            await agents.close()
        await admin.close()
        await fleet.stop()
    latencies = [t for d in done for t in d.latencies_s]
    span_s = sum(d.span_s for d in done)
    return {
        "agents": n,
        "ready_nodes": ready_nodes,
        "acks": len(latencies),
        "join_s": join_s,
        "cpu_idle_pct": cpu_idle * 100,
        "cpu_pct": cpu_n * 100,
        "cpu_ms_per_agent_s": (cpu_n - cpu_idle) * 1e3 / max(n, 1),
        "rss_idle_mb": rss_idle / 1e6,
        "rss_mb": rss_n / 1e6,
        "rss_kb_per_agent": (rss_n - rss_idle) / 1e3 / max(n, 1),
        "ack_p50_ms": percentile(latencies, 50) * 1e3,
        "ack_p99_ms": percentile(latencies, 99) * 1e3,
        "ack_max_ms": max(latencies) * 1e3,
        "all_ready_ms": statistics.median(d.ready_s for d in done) * 1e3,
        "change_fleet_cpu_pct": 100 * sum(d.fleet_cpu_s for d in done) / span_s,
        "change_agents_cpu_pct": 100 * sum(d.agents_cpu_s for d in done) / span_s,
        "change_bench_cpu_pct": 100 * sum(d.bench_cpu_s for d in done) / span_s,
    }


async def swarm_binary(swarm: str, folder: Path) -> Path | None:
    """The Go swarm's binary, built into `folder`, for `swarm` "go"; None for "python".

    Raises:
        ValueError: `swarm` is neither.
        SwarmError: go is missing or the build failed.
    """
    if swarm not in SWARMS:
        raise ValueError(f"swarm {swarm!r}: give one of {', '.join(SWARMS)}")
    return await build_swarm(folder / "swarm-bin") if swarm == "go" else None


async def measure(
    sizes: Sequence[int],
    folder: Path,
    *,
    window_s: float,
    rounds: int,
    heartbeat_s: float = 2.0,
    swarm: str = "python",
) -> dict[str, float]:
    """Every size in turn, each on a fresh fleet, printing a line as each ends (`swarm`:
    "python", the agents in this process, or "go", in a Go process of their own).

    Returns:
        The figures keyed `{name}@{n}`, and each size's ratios to the first size's
        (`ack_p50_ratio@{n}`, `all_ready_ratio@{n}`).
    """
    binary = await swarm_binary(swarm, folder)
    print_header(window_s, rounds, heartbeat_s, swarm)
    figures: dict[str, float] = {}
    base: dict[str, float] = {}
    for n in sizes:
        row = await measure_n(
            n,
            folder / f"n{n}",
            window_s=window_s,
            rounds=rounds,
            heartbeat_s=heartbeat_s,
            go_swarm=binary,
        )
        base = base or row
        row["ack_p50_ratio"] = row["ack_p50_ms"] / base["ack_p50_ms"]
        row["all_ready_ratio"] = row["all_ready_ms"] / base["all_ready_ms"]
        print_row(row)
        figures |= {f"{key}@{n}": value for key, value in row.items() if key != "agents"}
    return figures


async def measure_tls(
    sizes: Sequence[int],
    folder: Path,
    *,
    window_s: float,
    rounds: int,
    heartbeat_s: float = 2.0,
    swarm: str = "python",
) -> dict[str, float]:
    """Each size plaintext then over mutual TLS, every agent on its own connection in both;
    prints both lines and the mTLS ÷ plaintext ratios.

    Returns:
        The figures keyed `{mode}_{name}@{n}` (mode `plain` or `mtls`), and
        `cpu_per_agent_ratio@{n}`, `ack_p99_ratio@{n}`.
    """
    binary = await swarm_binary(swarm, folder)
    print_header(window_s, rounds, heartbeat_s, swarm)
    figures: dict[str, float] = {}
    for n in sizes:
        pki = make_pki(folder / f"tls{n}", n)
        rows = {}
        for mode, tls in (("plain", None), ("mtls", pki)):
            row = await measure_n(
                n,
                folder / f"{mode}{n}",
                window_s=window_s,
                rounds=rounds,
                heartbeat_s=heartbeat_s,
                pki=tls,
                own_connection=True,
                go_swarm=binary,
            )
            row["ack_p50_ratio"] = 1.0
            print(f"[{mode}]", end=" ")
            print_row(row)
            rows[mode] = row
            figures |= {f"{mode}_{k}@{n}": v for k, v in row.items() if k != "agents"}
        plain, mtls = rows["plain"], rows["mtls"]
        # /proc counts CPU in 10 ms ticks: a tiny run's plaintext window may hold none.
        cpu_ratio = mtls["cpu_ms_per_agent_s"] / (plain["cpu_ms_per_agent_s"] or math.nan)
        p99_ratio = mtls["ack_p99_ms"] / plain["ack_p99_ms"]
        figures[f"cpu_per_agent_ratio@{n}"] = cpu_ratio
        figures[f"ack_p99_ratio@{n}"] = p99_ratio
        print(
            f"N={n}: mTLS / plaintext: CPU per agent {cpu_ratio:.2f}, ack p99 {p99_ratio:.2f}, "
            f"join {mtls['join_s'] / plain['join_s']:.2f}",
            flush=True,
        )
    return figures


def print_header(window_s: float, rounds: int, heartbeat_s: float, swarm: str) -> None:
    """Say how the figures are taken, and the table's columns."""
    where = (
        "the Go swarm, a process of its own (bench/swarm; `agents`: its CPU, `bench`: this "
        "process's)"
        if swarm == "go"
        else "this process (`agents` and `bench`: this process's CPU)"
    )
    print(
        f"fleet as a child process (CPU: /proc user+system over {window_s:g} s windows; RSS: "
        f"VmRSS); heartbeats every {heartbeat_s:g} s each way; {rounds} catalog change "
        f"round(s) per N (CreateModel, one one-card replica per node); agents run by {where}"
    )
    print(
        f"{'N':>5} {'ready':>5} {'join s':>7} {'CPU% idle':>9} {'CPU% N':>7} "
        f"{'CPU ms/s/agent':>14} {'RSS MB 0':>8} {'RSS MB N':>8} {'KB/agent':>8} "
        f"{'ack p50 ms':>10} {'ack p99 ms':>10} {'all ready ms':>12} {'p50/base':>8} "
        f"{'chg CPU% fleet':>14} {'agents':>6} {'bench':>5}",
        flush=True,
    )


def print_row(r: dict[str, float]) -> None:
    """One N's line."""
    print(
        f"{r['agents']:>5.0f} {r['ready_nodes']:>5.0f} {r['join_s']:>7.2f} "
        f"{r['cpu_idle_pct']:>9.1f} {r['cpu_pct']:>7.1f} {r['cpu_ms_per_agent_s']:>14.3f} "
        f"{r['rss_idle_mb']:>8.1f} {r['rss_mb']:>8.1f} {r['rss_kb_per_agent']:>8.1f} "
        f"{r['ack_p50_ms']:>10.1f} {r['ack_p99_ms']:>10.1f} {r['all_ready_ms']:>12.1f} "
        f"{r['ack_p50_ratio']:>8.2f} {r['change_fleet_cpu_pct']:>14.0f} "
        f"{r['change_agents_cpu_pct']:>6.0f} {r['change_bench_cpu_pct']:>5.0f}",
        flush=True,
    )


@dataclass(frozen=True)
class Size:
    """How big a run is."""

    sizes: tuple[int, ...]
    window_s: float
    rounds: int


QUICK = Size(sizes=(10, 100, 300), window_s=6.0, rounds=1)
FULL = Size(sizes=(10, 100, 500, 1000), window_s=10.0, rounds=3)


def run(
    full: bool, sizes: Sequence[int] = (), *, tls: bool = False, swarm: str = "python"
) -> dict[str, float]:
    """The benchmark at its quick or full size (or the `sizes` given); returns its figures
    (with `tls`, each size plaintext and over mutual TLS; `swarm`: who runs the agents,
    "python" or "go")."""
    conf = FULL if full else QUICK
    how = measure_tls if tls else measure
    with tempfile.TemporaryDirectory(prefix="bench-fanin-") as tmp:
        return asyncio.run(
            how(
                tuple(sizes) or conf.sizes,
                Path(tmp),
                window_s=conf.window_s,
                rounds=conf.rounds,
                swarm=swarm,
            )
        )


def main(argv: Sequence[str] | None = None) -> None:
    """Parse `--full` / `--sizes`, run, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--full", action="store_true", help="N = 10, 100, 500, 1000")
    parser.add_argument("--sizes", default="", help="comma-separated N (the first is the base)")
    parser.add_argument(
        "--tls",
        action="store_true",
        help="each N plaintext and over mutual TLS (one connection per agent in both)",
    )
    parser.add_argument(
        "--swarm",
        choices=SWARMS,
        default="python",
        help="who runs the agents: this process (python, the default) or a Go process of "
        "their own (go; bench/swarm, built with the machine's go)",
    )
    opts = parser.parse_args(argv)
    run(
        opts.full,
        [int(s) for s in opts.sizes.split(",") if s.strip()],
        tls=opts.tls,
        swarm=opts.swarm,
    )


if __name__ == "__main__":
    main()
