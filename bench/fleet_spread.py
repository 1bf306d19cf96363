"""Bench: N agents spread over three fleets on one PostgreSQL against the same N on one fleet:
the fleets' CPU per agent and the time from a catalog change to every agent's acknowledgement.

Both setups run fleet child processes on a fresh database each (LLMGW_BENCH_PG's server): one
fleet, or three (one leads; the other two follow the store). The N simulated agents
(bench/leader_agents.py) are given every fleet's address, agent i trying fleet i mod 3 first;
every fleet serves agents, so each stays where it first connected: a third on the leader, two
thirds on the followers, which write their nodes' reports to the store and forward the desired
sets the leader writes there (docs/fleet.md, "Agents on any fleet"). Measured:

- CPU: each fleet process's user + system time over a window with the agents connected and
  beating, less the same window before they joined, per agent of the whole N (ms of CPU per
  second per agent): all fleets together, and the busiest one;
- ack: a CreateModel of N one-card replicas (one per node), to each agent's Ack of the desired
  set holding its replica (p50/p99).

Ratios: three fleets ÷ one fleet, same N, same run (the busiest fleet's CPU per agent against
the one fleet's is issue 16's "≤ 0.4×"). N defaults to 100 quick and 1,000 full; 1,000
streams and their heartbeats in one Python process beside three fleets is near what 2 shared
cores carry, so N is a flag.

With `--swarm go` the agents are agent_fanin's lean agents run by the Go swarm (bench/swarm,
bench/go_swarm.py), a process of its own, given the fleets' addresses: agent i connects to
fleet i mod 3 (i mod 1 with one fleet), at most 50 streams a connection. An agent has joined
when it acknowledged its first desired set (the Python agents: at the Welcome), and its ack is
stamped in the swarm on the bench's clock. The Go agents do not reconnect: a stream that ends
is counted (`ended`) and not opened again, so where the Python path counts reconnections the
Go path counts ended streams, over the whole run; 0 means every agent stayed on its first
fleet. At most 500 Go agents are joining at once (MAX_JOINING), so join times include that
queue. The swarm's own CPU over the busy window is printed beside the fleets'.

Run: `.venv/bin/python -m bench.fleet_spread [--agents N] [--window-s S] [--swarm python|go]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import psycopg

from bench.agent_fanin import SWARMS, fan_model, percentile, swarm_binary
from bench.fleet_failover import Cluster
from bench.go_swarm import GoSwarm
from bench.leader_agents import FollowingAgent, agents_over
from bench.store_pg import admin_dsn
from llmgw.fleet.v1 import fleet_pb2

WAIT_S = 180.0
HEARTBEAT_S = 1.0
"""The fleets' heartbeat interval unless `--heartbeat-s` says otherwise: 1 s, as every figure
of this bench before 2026-12-08 was taken (the fleet's own default is 2 s)."""
PER_CONNECTION = 50
"""The Go swarm's streams per connection (agent_fanin's default)."""
MAX_JOINING = 500
"""The Go swarm's agents between Connect and their first desired set at once. 10,000 Connects
in one burst had 6,563 of them ended CANCELLED by one fleet's gRPC server within a second
(3,437 got in); a window of 500 lets each fleet take them as fast as it welcomes them."""


async def cpu_over(cluster: Cluster, window_s: float) -> list[float]:
    """Each of the cluster's fleets' CPU over `window_s`, as a fraction of one core."""
    before = [f.cpu_s() for f in cluster.fleets]
    start = time.perf_counter()
    await asyncio.sleep(window_s)
    took = time.perf_counter() - start
    return [(f.cpu_s() - b) / took for f, b in zip(cluster.fleets, before, strict=True)]


@contextlib.asynccontextmanager
async def fresh_cluster(folder: Path, heartbeat_s: float) -> AsyncIterator[Cluster]:
    """A cluster of fleets (none started yet, heartbeats every `heartbeat_s`) on a database
    made for it on admin_dsn()'s server, the fleets closed and the database dropped at the
    end."""
    dbname = "llmgw_bench_" + uuid.uuid4().hex[:10]
    dsn = admin_dsn().rsplit("/", 1)[0] + "/" + dbname
    with psycopg.connect(admin_dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {dbname}".encode())
    cluster = Cluster(dsn, folder, 6.0, 2.0, heartbeat_s)
    try:
        yield cluster
    finally:
        with contextlib.suppress(grpc.aio.AioRpcError):  # a channel a stopped fleet cut
            await cluster.close()
        with psycopg.connect(admin_dsn(), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)".encode())


def figures(
    n: int, idle: list[float], busy: list[float], latencies: list[float], join_s: float
) -> dict[str, float]:
    """One setup's figures: CPU per agent over the busy window less the idle one (all fleets,
    and the busiest), the idle CPU, the change's ack p50/p99 and the time all took to join."""
    return {
        "cpu_ms_per_agent_s": (sum(busy) - sum(idle)) * 1e3 / n,
        "busiest_ms_per_agent_s": max(b - i for b, i in zip(busy, idle, strict=True)) * 1e3 / n,
        "cpu_idle_pct": sum(idle) * 100,
        "ack_p50_ms": percentile(latencies, 50) * 1e3,
        "ack_p99_ms": percentile(latencies, 99) * 1e3,
        "join_s": join_s,
    }


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll an async predicate every 50 ms for up to WAIT_S."""
    deadline = time.perf_counter() + WAIT_S
    while not await check():
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{what} did not happen within {WAIT_S:.0f} s")
        await asyncio.sleep(0.05)


async def started_idle(cluster: Cluster, fleets: int, window_s: float) -> tuple[str, list[float]]:
    """`fleets` fleets started in `cluster`: the leader's address and each fleet's idle CPU
    over `window_s` before any agent joins."""
    for _ in range(fleets):
        await cluster.start_one()
    leader, _ = await cluster.leader()
    await asyncio.sleep(1.0)  # first ticks, lazy imports
    return leader.address, await cpu_over(cluster, window_s)


async def measure_one(
    n: int,
    fleets: int,
    folder: Path,
    window_s: float,
    go_swarm: Path | None = None,
    heartbeat_s: float = HEARTBEAT_S,
) -> dict[str, float]:
    """`fleets` fleets on a fresh database with `n` agents: CPU per agent and ack latencies
    (the agents run by the Go swarm binary `go_swarm`, else in this process)."""
    if go_swarm is not None:
        return await measure_one_go(n, fleets, folder, window_s, go_swarm, heartbeat_s)
    async with fresh_cluster(folder, heartbeat_s) as cluster:
        agents: list[FollowingAgent] = []
        try:
            leader, idle = await started_idle(cluster, fleets, window_s)
            agents = agents_over([f.address for f in cluster.fleets], n, heartbeat_s=2.0)
            started = time.perf_counter()
            for a in agents:
                a.start()

            async def all_joined() -> bool:
                return all(a.joined.is_set() for a in agents)

            await until(all_joined, f"all {n} agents welcomed")
            join_s = time.perf_counter() - started
            hops = sum(a.streams for a in agents) - n
            await asyncio.sleep(2.0)
            busy = await cpu_over(cluster, window_s)
            stub = cluster.stub(leader)
            start = time.perf_counter()
            for a in agents:
                a.latency_s, a.changed_at, a.watch_model = None, start, "fan"
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=fan_model(n)), timeout=60)

            async def all_acked() -> bool:
                return all(a.latency_s is not None for a in agents)

            await until(all_acked, f"all {n} agents acknowledging the change")
            latencies = [a.latency_s for a in agents if a.latency_s is not None]
        finally:
            for a in agents:
                await a.stop()
    return {**figures(n, idle, busy, latencies, join_s), "hops": hops}


async def measure_one_go(
    n: int, fleets: int, folder: Path, window_s: float, binary: Path, heartbeat_s: float
) -> dict[str, float]:
    """measure_one with the Go swarm's agents: agent i on fleet i mod `fleets`."""
    async with fresh_cluster(folder, heartbeat_s) as cluster:
        swarm: GoSwarm | None = None
        try:
            leader, idle = await started_idle(cluster, fleets, window_s)
            started = time.perf_counter()
            swarm = await GoSwarm.start(
                binary,
                ",".join(f.address for f in cluster.fleets),
                n,
                folder / "swarm.log",
                per_connection=PER_CONNECTION,
                model="fan",
                max_joining=MAX_JOINING,
            )
            await swarm.joined(WAIT_S)
            join_s = time.perf_counter() - started
            await asyncio.sleep(2.0)
            swarm_before = swarm.cpu_s()
            busy = await cpu_over(cluster, window_s)
            swarm_cpu = (swarm.cpu_s() - swarm_before) / window_s
            stub = cluster.stub(leader)
            start = time.perf_counter()
            swarm.start_round("fan", start)
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=fan_model(n)), timeout=60)
            running = swarm

            async def all_acked() -> bool:
                return running.all_acked()

            await until(all_acked, f"all {n} agents acknowledging the change")
            latencies = swarm.round_latencies_s()
            swarm.end_round()
            ended = swarm.ended
        finally:
            if swarm is not None:
                await swarm.close()
    return {
        **figures(n, idle, busy, latencies, join_s),
        "ended": ended,
        "swarm_cpu_pct": swarm_cpu * 100,
    }


def ratio(a: float, b: float) -> float:
    """a / b, NaN when b is 0 (a window too short for /proc's 10 ms ticks to see any CPU)."""
    return a / b if b > 0 else math.nan


async def measure(
    n: int,
    folder: Path,
    window_s: float,
    swarm: str = "python",
    heartbeat_s: float = HEARTBEAT_S,
) -> dict[str, float]:
    """One fleet, then three; the figures and the three ÷ one ratios (`swarm`: who runs the
    agents, this process or the Go swarm; `heartbeat_s`: the fleets' heartbeat interval)."""
    binary = await swarm_binary(swarm, folder)
    figures: dict[str, float] = {}
    for fleets in (1, 3):
        row = await measure_one(n, fleets, folder / f"f{fleets}", window_s, binary, heartbeat_s)
        figures |= {f"{k}@{fleets}": v for k, v in row.items()}
        if binary is None:
            stayed = f"{row['hops']:.0f} reconnections"
        else:
            stayed = (
                f"{row['ended']:.0f} streams ended, not reopened: the Go swarm does not"
                f" reconnect; swarm CPU {row['swarm_cpu_pct']:.1f}% of a core"
            )
        print(
            f"{fleets} fleet(s), N={n}: CPU idle {row['cpu_idle_pct']:.1f}% of a core, per agent"
            f" {row['cpu_ms_per_agent_s']:.3f} ms/s (busiest fleet"
            f" {row['busiest_ms_per_agent_s']:.3f}); ack p50 {row['ack_p50_ms']:.1f} ms, p99"
            f" {row['ack_p99_ms']:.1f} ms; all joined in {row['join_s']:.2f} s ({stayed})",
            flush=True,
        )
    figures["cpu_per_agent_ratio"] = ratio(
        figures["cpu_ms_per_agent_s@3"], figures["cpu_ms_per_agent_s@1"]
    )
    figures["busiest_per_agent_ratio"] = ratio(
        figures["busiest_ms_per_agent_s@3"], figures["busiest_ms_per_agent_s@1"]
    )
    figures["ack_p99_ratio"] = ratio(figures["ack_p99_ms@3"], figures["ack_p99_ms@1"])
    figures["agents"] = n
    print(
        f"three fleets / one, N={n}, {swarm} swarm:"
        f" CPU per agent {figures['cpu_per_agent_ratio']:.2f}"
        f" (busiest fleet {figures['busiest_per_agent_ratio']:.2f}),"
        f" ack p99 {figures['ack_p99_ratio']:.2f}"
    )
    return figures


def run(
    full: bool = False,
    agents: int = 0,
    window_s: float = 0.0,
    swarm: str = "python",
    heartbeat_s: float = HEARTBEAT_S,
) -> dict[str, float]:
    """Quick: N = 100, 5 s windows; full: N = 1,000, 10 s windows."""
    n = agents or (1000 if full else 100)
    window = window_s or (10.0 if full else 5.0)
    with tempfile.TemporaryDirectory(prefix="bench-spread-") as tmp:
        for f in (1, 3):
            (Path(tmp) / f"f{f}").mkdir()
        return asyncio.run(measure(n, Path(tmp), window, swarm, heartbeat_s))


def main() -> None:
    """Parse flags and run."""
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_spread", description=__doc__)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--window-s", type=float, default=5.0)
    parser.add_argument(
        "--swarm",
        choices=SWARMS,
        default="python",
        help="who runs the agents: this process (python) or the Go swarm, a process of its"
        " own (go; bench/swarm, built with the machine's go)",
    )
    parser.add_argument(
        "--heartbeat-s",
        type=float,
        default=HEARTBEAT_S,
        help="the fleets' heartbeat interval (the fleet's own default is 2)",
    )
    opts = parser.parse_args()
    run(agents=opts.agents, window_s=opts.window_s, swarm=opts.swarm, heartbeat_s=opts.heartbeat_s)


if __name__ == "__main__":
    main()
