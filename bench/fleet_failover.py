"""Bench: failover among fleets on one PostgreSQL: K trials of kill -9 of the leader in the
middle of a catalog change; how long until another leads, until every agent is back, and how
many replicas were lost, doubled or left stuck.

Three fleets run as child processes (`python -m fleet_svc ... --lease-s L --renew-s R`) on a
fresh database (created on LLMGW_BENCH_PG's server and dropped after); simulated agents
(bench/leader_agents.py: real Connect streams, given every fleet, following NOT_LEADER) with two
cards each run the `base` model's replicas. Each trial:

1. asks the leader for a change: CreateModel of `extra` (two replicas) on odd trials,
   DeleteModel of it on even ones, and at once
2. kills the leader with SIGKILL (and starts a replacement on its address, as a restarted pod
   keeps its name, so three stay and the agents' list of fleets stays true);
3. times until the database holds a live lease at a higher epoch (`lead_s`: the issue's goal
   is <= 10 s; the lease bounds it by L + R), and until every agent whose stream was on the
   killed leader was welcomed again by a fleet (`agents_s`); the agents on the other fleets
   keep their streams (`moved` counts those that reconnected all the same: it should be 0);
4. waits (up to SETTLE_S) for the fleet to settle on what the catalog wants, then counts:
   lost = wanted replicas missing, doubled = replicas beyond those wanted (or one replica run on
   two nodes), stuck = replicas not READY at the deadline, and restarted = `base` replicas whose
   ids changed (killing the leader should restart none).

The change in flight when the leader dies either committed (and the new leader carries it out)
or did not (the client's retry would make it); both are counted as what the catalog says.

Run: `.venv/bin/python -m bench.fleet_failover [--trials N] [--lease-s L] [--renew-s R]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import psycopg

from bench.leader_agents import FollowingAgent, agents_over
from bench.planner_throughput import ChildServer, start_child
from bench.store_pg import admin_dsn
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc

FLEETS = 3
AGENTS = 4
BASE_REPLICAS = 4
EXTRA_REPLICAS = 2
SETTLE_S = 30.0
"""How long a trial waits for the fleet to settle before counting what is stuck."""


def model(name: str, replicas: int) -> common_pb2.Model:
    """A model of one-card vLLM replicas."""
    return common_pb2.Model(
        name=name,
        source=f"hf://org/{name}",
        context_length=8192,
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=["--max-model-len", "8192"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
                replicas=replicas,
            )
        ],
    )


class Cluster:
    """The fleet children on one database, and a stub per fleet."""

    def __init__(
        self, dsn: str, folder: Path, lease_s: float, renew_s: float, heartbeat_s: float = 1.0
    ) -> None:
        self.dsn, self.folder = dsn, folder
        self.lease_s, self.renew_s = lease_s, renew_s
        self.heartbeat_s = heartbeat_s
        self.fleets: list[ChildServer] = []
        self._stubs: dict[str, tuple[grpc.aio.Channel, fleet_pb2_grpc.FleetServiceAsyncStub]] = {}
        self._started = 0

    async def start_one(self, listen: str = "127.0.0.1:0") -> ChildServer:
        """One more fleet (on `listen`: a replacement takes its predecessor's address, as a
        restarted pod keeps its name, so the agents' list of fleets stays true)."""
        self._started += 1
        child = await start_child(
            "fleet_svc",
            [
                "--listen",
                listen,
                "--store",
                self.dsn,
                "--heartbeat-s",
                f"{self.heartbeat_s:g}",
                "--drain-s",
                "0",
                "--lease-s",
                str(self.lease_s),
                "--renew-s",
                str(self.renew_s),
                "--log-format",
                "json",
            ],
            self.folder / f"fleet-{self._started}.log",
        )
        self.fleets.append(child)
        return child

    def stub(self, address: str) -> fleet_pb2_grpc.FleetServiceAsyncStub:
        if address not in self._stubs:
            channel = grpc.aio.insecure_channel(address)
            self._stubs[address] = (channel, fleet_pb2_grpc.FleetServiceStub(channel))
        return self._stubs[address][1]

    def lease(self) -> tuple[str, int, bool]:
        """(address, epoch, live) of the lease now."""
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=3) as conn:
            row = conn.execute(
                "SELECT address, epoch, expires_at > clock_timestamp() FROM leases"
            ).fetchone()
        assert row is not None, "no fleet took the lease"
        return str(row[0]), int(row[1]), bool(row[2])

    async def leader(self, above: int = 0, timeout_s: float = 60.0) -> tuple[ChildServer, int]:
        """The fleet holding a live lease at an epoch above `above`, and that epoch."""
        deadline = time.perf_counter() + timeout_s
        while True:
            address, epoch, live = await asyncio.to_thread(self.lease)
            child = next((f for f in self.fleets if f.address == address), None)
            if live and epoch > above and child is not None and child.process.returncode is None:
                return child, epoch
            if time.perf_counter() > deadline:
                raise RuntimeError(f"no fleet leads above epoch {above} after {timeout_s:.0f} s")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        for channel, _ in self._stubs.values():
            await channel.close()
        for child in self.fleets:
            await child.stop()


async def settled(
    stub: fleet_pb2_grpc.FleetServiceAsyncStub, agents: list[FollowingAgent]
) -> tuple[int, list[fleet_pb2.Replica]]:
    """What the catalog wants and the replicas there are (raises while the fleet is busy)."""
    models = (await stub.ListModels(fleet_pb2.ListModelsRequest(), timeout=5)).models
    wanted = sum(p.replicas for m in models for p in m.model.profiles)
    replicas = list((await stub.ListReplicas(fleet_pb2.ListReplicasRequest(), timeout=5)).replicas)
    return wanted, replicas


async def trial(
    k: int, cluster: Cluster, agents: list[FollowingAgent], base_ids: set[str]
) -> dict[str, float]:
    """One kill -9 of the leader mid-change; its figures."""
    old, epoch = await cluster.leader()
    stub = cluster.stub(old.address)
    with contextlib.suppress(grpc.aio.AioRpcError):
        if k % 2:
            await stub.CreateModel(
                fleet_pb2.CreateModelRequest(model=model("extra", EXTRA_REPLICAS)), timeout=5
            )
        else:
            await stub.DeleteModel(fleet_pb2.DeleteModelRequest(name="extra"), timeout=5)
    # Every fleet serves agents: only those whose stream was on the killed leader reconnect;
    # the others keep their streams through the failover (docs/fleet.md, "Agents on any fleet").
    orphaned = [a for a in agents if a.fleets.current == old.address]
    kept = [(a, a.streams) for a in agents if a not in orphaned]
    killed_at = time.perf_counter()
    old.process.kill()
    await old.process.wait()
    cluster.fleets.remove(old)
    replacement = asyncio.create_task(cluster.start_one(old.address))
    new, _ = await cluster.leader(above=epoch)
    lead_s = time.perf_counter() - killed_at
    while not all(a.joined.is_set() and a.welcomed_at > killed_at for a in orphaned):
        if time.perf_counter() - killed_at > SETTLE_S + lead_s:
            break
        await asyncio.sleep(0.02)
    back = all(a.joined.is_set() and a.welcomed_at > killed_at for a in orphaned)
    agents_s = max((a.welcomed_at for a in orphaned), default=killed_at) - killed_at
    agents_s = agents_s if back else math.nan
    for a in orphaned:
        if not (a.joined.is_set() and a.welcomed_at > killed_at):
            print(f"  {a.node} not back: trying {a.fleets.current}, errors {a.errors[-3:]}")
    moved = sum(a.streams != streams for a, streams in kept)
    await replacement
    new_stub = cluster.stub(new.address)
    deadline = time.perf_counter() + SETTLE_S
    wanted, replicas = 0, list[fleet_pb2.Replica]()
    while time.perf_counter() < deadline:
        try:
            wanted, replicas = await settled(new_stub, agents)
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.1)
            continue
        ready = [r for r in replicas if r.phase == fleet_pb2.REPLICA_PHASE_READY]
        if len(replicas) == wanted == len(ready):
            break
        await asyncio.sleep(0.1)
    ready_ids = {r.id for r in replicas if r.phase == fleet_pb2.REPLICA_PHASE_READY}
    run_on = [rid for a in agents for rid in a.running]
    twice = len(run_on) - len(set(run_on))
    base_now = {r.id for r in replicas if r.model == "base"}
    return {
        "lead_s": lead_s,
        "agents_s": agents_s,
        "orphaned": len(orphaned),
        "moved": moved,
        "lost": max(0, wanted - len(replicas)),
        "doubled": max(0, len(replicas) - wanted) + twice,
        "stuck": len(replicas) - len(ready_ids),
        "restarted": len(base_ids - base_now),
    }


async def measure(trials: int, folder: Path, *, lease_s: float, renew_s: float) -> dict[str, float]:
    """Every trial on one cluster; the figures over them."""
    dbname = "llmgw_bench_" + uuid.uuid4().hex[:10]
    dsn = admin_dsn().rsplit("/", 1)[0] + "/" + dbname
    with psycopg.connect(admin_dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {dbname}".encode())
    cluster = Cluster(dsn, folder, lease_s, renew_s)
    agents: list[FollowingAgent] = []
    try:
        for _ in range(FLEETS):
            await cluster.start_one()
        agents = agents_over([f.address for f in cluster.fleets], AGENTS, cards=2)
        for a in agents:
            a.start()
        leader, _ = await cluster.leader()
        stub = cluster.stub(leader.address)
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model("base", BASE_REPLICAS)))
        deadline = time.perf_counter() + 60
        while True:
            _, replicas = await settled(stub, agents)
            if sum(r.phase == fleet_pb2.REPLICA_PHASE_READY for r in replicas) == BASE_REPLICAS:
                break
            if time.perf_counter() > deadline:
                raise RuntimeError("the base model's replicas did not turn READY")
            await asyncio.sleep(0.1)
        base_ids = {r.id for r in replicas}
        rows = []
        for k in range(1, trials + 1):
            row = await trial(k, cluster, agents, base_ids)
            rows.append(row)
            print(
                f"trial {k:>2}: leader in {row['lead_s']:.2f} s, agents back in"
                f" {row['agents_s']:.2f} s ({row['orphaned']:.0f} orphaned,"
                f" {row['moved']:.0f} others moved); lost {row['lost']:.0f},"
                f" doubled {row['doubled']:.0f},"
                f" stuck {row['stuck']:.0f}, base restarted {row['restarted']:.0f}",
                flush=True,
            )
    finally:
        for a in agents:
            await a.stop()
        await cluster.close()
        with psycopg.connect(admin_dsn(), autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)".encode())
    lead = [r["lead_s"] for r in rows]
    back = [r["agents_s"] for r in rows if not math.isnan(r["agents_s"])] or [math.nan]
    return {
        "trials": trials,
        "lease_s": lease_s,
        "lead_min_s": min(lead),
        "lead_median_s": statistics.median(lead),
        "lead_max_s": max(lead),
        "agents_median_s": statistics.median(back),
        "agents_max_s": max(back),
        "lost": sum(r["lost"] for r in rows),
        "doubled": sum(r["doubled"] for r in rows),
        "stuck": sum(r["stuck"] for r in rows),
        "restarted": sum(r["restarted"] for r in rows),
        "agents_not_back": sum(math.isnan(r["agents_s"]) for r in rows),
        "moved": sum(r["moved"] for r in rows),
        "lead_max_over_lease": max(lead) / lease_s,
    }


def report(f: dict[str, float]) -> None:
    """The summary lines."""
    print(
        f"fleet_failover: {f['trials']:.0f} kill -9 trials, lease {f['lease_s']:g} s:"
        f" new leader min/median/max {f['lead_min_s']:.2f} / {f['lead_median_s']:.2f} /"
        f" {f['lead_max_s']:.2f} s (max / lease {f['lead_max_over_lease']:.2f});"
        f" agents back median/max {f['agents_median_s']:.2f} / {f['agents_max_s']:.2f} s;"
        f" lost {f['lost']:.0f}, doubled {f['doubled']:.0f}, stuck {f['stuck']:.0f},"
        f" base replicas restarted {f['restarted']:.0f}; trials with an agent not back"
        f" {f['agents_not_back']:.0f}; agents of surviving fleets that reconnected"
        f" {f['moved']:.0f}"
    )


def run(
    full: bool = False, trials: int = 0, lease_s: float = 6.0, renew_s: float = 2.0
) -> dict[str, float]:
    """Quick: 6 trials; full: 20."""
    n = trials or (20 if full else 6)
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        figures = asyncio.run(measure(n, Path(tmp), lease_s=lease_s, renew_s=renew_s))
    report(figures)
    return figures


def main() -> None:
    """Parse flags and run."""
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_failover", description=__doc__)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--lease-s", type=float, default=6.0)
    parser.add_argument("--renew-s", type=float, default=2.0)
    opts = parser.parse_args()
    run(trials=opts.trials, lease_s=opts.lease_s, renew_s=opts.renew_s)


if __name__ == "__main__":
    main()
